"""What every render format shares: its options and its one error.

A format is a function ``render(spec, options) -> str`` (the text printed, newline-terminated);
:mod:`cluster.ctl.render` holds the table of formats and which options each accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.ctl.spec import ClusterFile

__all__ = ["DEFAULT_IMAGE", "DEFAULT_NAMESPACE", "RenderError", "RenderOptions", "grace_seconds"]

# A placeholder, documented in docs/guide/kubernetes.md and deploy/Dockerfile: the image users
# build and push.
DEFAULT_IMAGE = "cluster-runtime:latest"
DEFAULT_NAMESPACE = "default"


class RenderError(ValueError):
    """The cluster file cannot be rendered in the format asked for (a bad combination of
    options, or a file the format cannot express). The CLI prints it and exits 2."""


def grace_seconds(spec: ClusterFile) -> int:
    """``timeouts.grace`` (SIGTERM to SIGKILL) in whole seconds, rounded up: what every format
    gives the tasks (``terminationGracePeriodSeconds``, ``#SBATCH --signal=TERM@``,
    ``CLUSTER_GRACE_PERIOD``), as ``clusterctl launch`` does."""
    return int(-(-spec.timeouts.grace // 1))


@dataclass(frozen=True)
class RenderOptions:
    """Options of ``clusterctl render``; ``None`` means "not given" (each format that accepts
    an option applies its default). ``task``: one task, ``TYPE:INDEX`` (tf-config only);
    ``image``, ``namespace``: the container image and namespace (k8s and tfjob); ``nodes``,
    ``partition``, ``time``: the allocation's ``#SBATCH`` lines (slurm)."""

    task: str | None = None
    image: str | None = None
    namespace: str | None = None
    nodes: int | None = None
    partition: str | None = None
    time: str | None = None

    def given(self) -> list[str]:
        """The names of the options given, e.g. ``["task"]``."""
        return [name for name in ("task", "image", "namespace", "nodes", "partition", "time")
                if getattr(self, name) is not None]
