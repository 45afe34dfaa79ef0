"""Errors raised by the resolver package."""

from __future__ import annotations

__all__ = ["ClusterConfigError"]


class ClusterConfigError(ValueError):
    """A cluster description (``TF_CONFIG``, Slurm variables, arguments) is malformed.

    The message names the source and the path of the bad field, e.g.
    ``TF_CONFIG: cluster.worker[2]: expected a "host:port" string, got 42``.
    It subclasses ``ValueError`` so code written for TensorFlow, which raises
    ``ValueError`` in the same places, keeps working.
    """
