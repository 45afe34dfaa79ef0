"""``clusterctl``: launch, validate and render cluster files.

Library use (no argv)::

    from cluster.ctl import launch, load_cluster_file

    result = launch(load_cluster_file("cluster.yaml"))
    result.exit_code, result.root_cause, result.run_dir

The names are imported on first use (PEP 562): ``clusterctl --help`` must not pay for the
launcher's imports (the task settings pull in the collectives, numpy and grpc).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cluster.ctl.launcher import LaunchError, LaunchResult, TaskResult, launch
    from cluster.ctl.spec import ClusterFile, load_cluster_file, parse_cluster_file

__all__ = [
    "ClusterFile",
    "LaunchError",
    "LaunchResult",
    "TaskResult",
    "launch",
    "load_cluster_file",
    "parse_cluster_file",
]

_HOMES = {
    "LaunchError": "cluster.ctl.launcher",
    "LaunchResult": "cluster.ctl.launcher",
    "TaskResult": "cluster.ctl.launcher",
    "launch": "cluster.ctl.launcher",
    "ClusterFile": "cluster.ctl.spec",
    "load_cluster_file": "cluster.ctl.spec",
    "parse_cluster_file": "cluster.ctl.spec",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'cluster.ctl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
