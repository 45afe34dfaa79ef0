"""The committed stubs in cluster/transport/_pb are exactly what tools/gen_protos.py produces."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import gen_protos  # noqa: E402

COMMITTED = REPO / gen_protos.PACKAGE_PATH


def _generated_names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name.endswith(gen_protos.GENERATED_SUFFIXES)}


def test_regenerating_stubs_reproduces_committed_files_byte_for_byte(tmp_path: Path) -> None:
    written = gen_protos.generate(tmp_path)
    assert written, "protoc wrote nothing: is proto/ empty?"
    fresh_dir = tmp_path / gen_protos.PACKAGE_PATH
    assert _generated_names(fresh_dir) == _generated_names(COMMITTED), (
        "stub files differ from proto/: run `uv run python tools/gen_protos.py` and commit"
    )
    stale = [
        p.name for p in written if p.read_bytes() != (COMMITTED / p.name).read_bytes()
    ]
    assert not stale, f"stale stubs {stale}: run `uv run python tools/gen_protos.py` and commit"


@pytest.mark.parametrize("proto", [p.stem for p in gen_protos.proto_sources()])
def test_every_proto_has_importable_package_qualified_stubs(proto: str) -> None:
    module = importlib.import_module(f"cluster.transport._pb.{proto}_pb2")
    assert module.DESCRIPTOR.package == "cluster_runtime.v1"
    assert module.DESCRIPTOR.name == f"cluster/transport/_pb/{proto}.proto"


def test_tensor_payload_field_is_last_so_raw_bytes_can_be_appended() -> None:
    # The fast path writes header fields, then field 15's tag and length, then the raw buffer;
    # the result must parse as an ordinary protobuf message.
    from cluster.transport._pb import collective_pb2

    header = collective_pb2.Frame(src_rank=3, group="g", seq=7, step=1, chunk=2).SerializeToString()
    payload = bytes(range(200))
    tag = bytes([(15 << 3) | 2])
    length = bytes([0xC8, 0x01])  # varint(200)
    frame = collective_pb2.Frame.FromString(header + tag + length + payload)
    assert (frame.src_rank, frame.group, frame.seq, frame.step, frame.chunk) == (3, "g", 7, 1, 2)
    assert frame.data == payload


def test_proto_sources_are_never_a_python_package() -> None:
    # A top-level `proto` module would clash with proto-plus; proto/ holds .proto sources only.
    assert not list((REPO / "proto").glob("*.py"))
