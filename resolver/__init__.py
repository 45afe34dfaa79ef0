"""Cluster resolvers: ``TF_CONFIG``, Slurm or explicit specs -> ``ClusterSpec``.

Mirrors ``tf.distribute.cluster_resolver`` and ``tf.train.ClusterSpec``, standard library only.
"""

from resolver.base import ClusterResolver, SimpleClusterResolver, UnionClusterResolver
from resolver.cluster_spec import ClusterSpec
from resolver.errors import ClusterConfigError
from resolver.slurm import SlurmClusterResolver
from resolver.tfconfig import TFConfigClusterResolver

# TensorFlow exports the union resolver as ``UnionResolver``; its class is UnionClusterResolver.
UnionResolver = UnionClusterResolver

__all__ = [
    "ClusterConfigError",
    "ClusterResolver",
    "ClusterSpec",
    "SimpleClusterResolver",
    "SlurmClusterResolver",
    "TFConfigClusterResolver",
    "UnionClusterResolver",
    "UnionResolver",
]
