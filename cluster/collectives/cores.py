"""The cores a host gives this process's collectives: the machine's, capped by a CPU quota.

The algorithm decisions of :mod:`~cluster.collectives.cost` depend on a host's shape (cores,
co-located ranks). ``os.cpu_count()`` counts the machine's cores, but a container limited to 2
CPUs on a 64-core server (a Kubernetes ``resources.limits.cpu``, ``docker --cpus``, a CI runner)
gets 2 cores' worth of time: taking it for a 64-core host would pipeline and run lanes where
every thread waits for its turn. So the quota of the process's cgroup (v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), rounded up to whole cores, caps the count.

An affinity mask (``taskset``, Slurm's ``--cpu-bind``) does not: it may differ between the ranks
of one host, whose decisions must agree. A quota belongs to the cgroup, which co-located ranks
that share memory share; and the count is part of :func:`~cluster.collectives.shm_segment.host_key`,
so ranks that see different counts never share memory.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

__all__ = ["host_cores", "quota_cores"]

_CGROUP = Path("/sys/fs/cgroup")
_PROC_CGROUP = Path("/proc/self/cgroup")


@functools.cache
def host_cores() -> int:
    """This machine's cores (``os.cpu_count()``), at most its cgroup's CPU quota; read once."""
    cores = os.cpu_count() or 1
    quota = quota_cores()
    return max(1, min(cores, quota)) if quota is not None else cores


def quota_cores(root: Path = _CGROUP, proc_cgroup: Path = _PROC_CGROUP) -> int | None:
    """Whole cores of this process's cgroup CPU quota (rounded up), or ``None`` when it has
    none, or none can be read (no cgroup file system, another OS). The process's own cgroup and
    the root of its cgroup namespace (a container's own cgroup) are read; the lower quota wins."""
    quotas = []
    for relative in _cgroup_paths(proc_cgroup):
        quotas += [_v2_quota(root / relative / "cpu.max"), _v2_quota(root / "cpu.max")]
        for v1 in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):  # a controller's own hierarchy
            quotas += [_v1_quota(root / v1 / relative), _v1_quota(root / v1)]
    found = [q for q in quotas if q is not None]
    return max(1, math.ceil(min(found))) if found else None


def _cgroup_paths(proc_cgroup: Path) -> list[str]:
    """The process's cgroup paths (relative) from ``/proc/self/cgroup``; ``[""]`` if unknown."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return [""]
    paths = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == "" or "cpu" in parts[1].split(",")):
            paths.append(parts[2].lstrip("/"))
    return paths or [""]


def _v2_quota(path: Path) -> float | None:
    """``cpu.max``: ``"max 100000"`` (no quota) or ``"<quota> <period>"`` in microseconds."""
    try:
        quota, period = path.read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period) if int(period) > 0 and int(quota) > 0 else None
    except (OSError, ValueError):
        return None


def _v1_quota(directory: Path) -> float | None:
    """``cpu.cfs_quota_us`` (``-1``: no quota) over ``cpu.cfs_period_us``."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
