"""``bench/allreduce.py --netns-hosts H``: N tasks spread over H emulated hosts (network
namespaces on one switch, :mod:`cluster.testing.netns`; root only), each ``python -m worker
bench/_netns_rank.py``, so co-located tasks reduce through shared memory and the hosts' leaders
over the network: the hierarchical all-reduce as it runs across machines, but on one kernel (the
"network" is a veth bridge: latency and bandwidth are this machine's, not a NIC's).

:func:`bench_netns_gloo` runs torch.distributed gloo on the same hosts, in the same layout, so
the two are compared where both cross the same links."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from cluster.testing import TaskProcesses

__all__ = ["bench_netns", "bench_netns_gloo"]

RANK = Path(__file__).resolve().parent / "_netns_rank.py"
GLOO_RANK = RANK.parent / "_netns_gloo.py"
GLOO_PORT = 29500
REPO = RANK.parent.parent


def layout(n: int, hosts: int) -> dict[str, list[str]]:
    """``n`` tasks (chief:0, worker:0..) over ``hosts`` hosts in contiguous blocks."""
    names = ["chief:0"] + [f"worker:{i}" for i in range(n - 1)]
    per = -(-n // hosts)
    return {f"h{h + 1}": names[h * per:(h + 1) * per] for h in range(hosts) if names[h * per:]}


Times = dict[int, list[tuple[float, float]]]
"""A rank's ``{size: [(wall seconds, process CPU seconds), ...]}``."""


def _times(task: str, proc, timeout: float) -> tuple[Times, str]:
    """A rank's ``TIMES`` line (and its whole output); ``RuntimeError`` naming it when it failed."""
    code, output = proc.finish(timeout=timeout)
    times = re.search(r"^TIMES (.*)$", output, re.M)
    if code != 0 or times is None:
        raise RuntimeError(f"netns {task} exited {code}: {output[-2000:]}")
    return {int(k): [tuple(p) for p in v] for k, v in json.loads(times.group(1)).items()}, output


def bench_netns_gloo(n: int, hosts: int, sizes: list[int], iters: int,
                     warmup: int) -> list[Times] | None:
    """gloo's ranks in :func:`bench_netns`'s layout, rank 0 (its store) on the first host;
    every rank's per-iteration times, or None where torch is not installed."""
    from cluster.testing import netns

    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return None
    reason = netns.unavailable()
    if reason is not None:
        raise RuntimeError(f"--netns-hosts: {reason}")
    plan = layout(n, hosts)
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    with netns.NetnsCluster(list(plan)) as cluster, TaskProcesses() as processes:
        address = cluster[next(iter(plan))].address
        started, rank = [], 0
        for host, tasks in plan.items():
            for _ in tasks:
                argv = cluster[host].command([
                    sys.executable, GLOO_RANK, str(rank), str(n), address, str(GLOO_PORT),
                    ",".join(map(str, sizes)), str(iters), str(warmup)])
                started.append((f"gloo rank {rank} on {host}",
                                processes.start(argv, name=f"gloo-{rank}", env=env, cwd=REPO)))
                rank += 1
        return [_times(task, proc, 1800)[0] for task, proc in started]


def bench_netns(n: int, hosts: int, sizes: list[int], iters: int,
                warmup: int) -> list[Times]:
    """Every rank's per-iteration times; raises ``RuntimeError`` naming a failed task, or one
    whose all-reduces did not take the hierarchical route."""
    from cluster.testing import netns
    from cluster.testing.netns_tasks import HostTasks

    reason = netns.unavailable()
    if reason is not None:
        raise RuntimeError(f"--netns-hosts: {reason}")
    plan = layout(n, hosts)
    env = {"CLUSTER_TOKEN": os.urandom(16).hex(), "CLUSTER_CONNECT_TIMEOUT": str(60 + n)}
    args = ["-m", "worker", RANK, ",".join(map(str, sizes)), str(iters), str(warmup)]
    results = []
    with netns.NetnsCluster(list(plan)) as cluster, TaskProcesses() as processes:
        run = HostTasks(cluster, plan, args, processes=processes, env=env, cwd=REPO)
        for task, proc in run.tasks.items():
            times, output = _times(task, proc, 1800)
            routes = re.search(r"^ROUTES (.*)$", output, re.M)
            if routes is None:
                raise RuntimeError(f"netns {task} printed no routes: {output[-2000:]}")
            taken = json.loads(routes.group(1))
            if len(plan) > 1 and any(len(t) > 1 for t in plan.values()) and \
                    "all_reduce/hier" not in taken:
                raise RuntimeError(f"netns {task}: no hierarchical all-reduce ran: {taken}")
            results.append(times)
    return results
