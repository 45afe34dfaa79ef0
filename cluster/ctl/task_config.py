"""Each task's address and ``TF_CONFIG``, built from a cluster file.

Jobs given as a count get ports here (free ports on ``host`` from
:func:`cluster.ctl.ports.pick_free_ports`, or consecutive ports from ``port_base``); jobs given
as a list keep their addresses. ``TF_CONFIG`` is written the way Kubeflow's TFJob writes it
(Go's ``json.Marshal``: compact, jobs sorted, then ``task`` and ``"environment": "cloud"``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from cluster.ctl.ports import pick_free_ports
from cluster.ctl.spec import ClusterFile

__all__ = ["assign_addresses", "tf_config"]


def assign_addresses(spec: ClusterFile,
                     pick: Callable[[str, int], list[int]] = pick_free_ports,
                     ) -> dict[str, list[str]]:
    """``{job: [address, ...]}`` for every job of ``spec`` (cluster order).

    ``pick(host, n)`` chooses the ports when ``spec`` has no ``port_base``; it raises
    ``OSError`` when ``host`` cannot be bound, and so does this function.
    """
    counted = sum(job.count for job in spec.jobs if job.addresses is None)
    if spec.port_base is not None:
        ports = list(range(spec.port_base, spec.port_base + counted))
    else:
        ports = pick(spec.host, counted) if counted else []
    addresses: dict[str, list[str]] = {}
    for job in spec.jobs:
        if job.addresses is not None:
            addresses[job.name] = list(job.addresses)
        else:
            addresses[job.name] = [f"{spec.host}:{ports.pop(0)}" for _ in range(job.count)]
    return addresses


def tf_config(addresses: dict[str, list[str]], task_type: str, index: int) -> str:
    """The ``TF_CONFIG`` text of one task, byte-compatible with Kubeflow's TFJob."""
    doc = {
        "cluster": {job: addresses[job] for job in sorted(addresses)},
        "task": {"type": task_type, "index": index},
        "environment": "cloud",
    }
    return json.dumps(doc, separators=(",", ":"))
