"""Generated protobuf and gRPC stubs (``tools/gen_protos.py``); do not edit by hand."""
