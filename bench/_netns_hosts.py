"""``bench/allreduce.py --netns-hosts H``: N tasks spread over H emulated hosts (network
namespaces on one switch, :mod:`cluster.testing.netns`; root only), each ``python -m worker
bench/_netns_rank.py``, so co-located tasks reduce through shared memory and the hosts' leaders
over the network: the hierarchical all-reduce as it runs across machines, but on one kernel (the
"network" is a veth bridge: latency and bandwidth are this machine's, not a NIC's)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from cluster.testing import TaskProcesses

__all__ = ["bench_netns"]

RANK = Path(__file__).resolve().parent / "_netns_rank.py"
REPO = RANK.parent.parent


def layout(n: int, hosts: int) -> dict[str, list[str]]:
    """``n`` tasks (chief:0, worker:0..) over ``hosts`` hosts in contiguous blocks."""
    names = ["chief:0"] + [f"worker:{i}" for i in range(n - 1)]
    per = -(-n // hosts)
    return {f"h{h + 1}": names[h * per:(h + 1) * per] for h in range(hosts) if names[h * per:]}


def bench_netns(n: int, hosts: int, sizes: list[int], iters: int,
                warmup: int) -> list[dict[int, list[float]]]:
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
            code, output = proc.finish(timeout=1800)
            times = re.search(r"^TIMES (.*)$", output, re.M)
            routes = re.search(r"^ROUTES (.*)$", output, re.M)
            if code != 0 or times is None or routes is None:
                raise RuntimeError(f"netns {task} exited {code}: {output[-2000:]}")
            taken = json.loads(routes.group(1))
            if len(plan) > 1 and any(len(t) > 1 for t in plan.values()) and \
                    "all_reduce/hier" not in taken:
                raise RuntimeError(f"netns {task}: no hierarchical all-reduce ran: {taken}")
            results.append({int(k): v for k, v in json.loads(times.group(1)).items()})
    return results
