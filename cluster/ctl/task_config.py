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
    ``OSError`` when ``host`` cannot be bound, and so does this function. Ports a listed task
    uses on ``host`` are never handed to a counted task: a chosen port may be one a listed task
    has not bound yet, and a renderer's default ``port_base`` may run into one (a file's own
    ``port_base`` that does is refused by validation).
    """
    counted = sum(job.count for job in spec.jobs if job.addresses is None)
    taken = {int(port) for job in spec.jobs for host, _, port in
             (a.rpartition(":") for a in job.addresses or ()) if host.lower() == spec.host.lower()}
    if spec.port_base is not None:
        free = (p for p in range(spec.port_base, 65536) if p not in taken)
        ports = [p for _, p in zip(range(counted), free, strict=False)]
    elif counted:
        ports = [p for p in pick(spec.host, counted + len(taken)) if p not in taken][:counted]
    else:
        ports = []
    if len(ports) < counted:
        raise OSError(f"no {counted} free ports from {spec.port_base} on {spec.host}")
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
