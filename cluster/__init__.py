"""cluster-runtime: tf.distribute's programming model over processes, gRPC and NCCL."""
