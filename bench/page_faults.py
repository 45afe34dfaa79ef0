"""Page faults per call of the public strategy API (the goal: none per call).

    uv run python bench/page_faults.py                  # N = 2, 64 MiB, shm and network
    uv run python bench/page_faults.py --size 16M --nprocs 4

N real processes (``cluster.testing.run_group``, gRPC on loopback) under
``MultiWorkerMirroredStrategy`` with one replica each. For every case, after a warm-up,
``resource.getrusage(RUSAGE_SELF).ru_minflt`` is read before and after each of ``--iters``
calls, while the previous call's results have been dropped (a training loop drops last step's
gradients). The table shows the median minor faults per call on rank 0, and what they amount to
in 4 KiB pages of the payload (``pages``: the payload's size in pages; a fresh buffer of the
payload's size costs one fault per page). Paths: ``shm`` (co-located tasks reduce through shared
memory) and ``network`` (``implementation=RING``: everything on the network ring).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.allreduce import fmt_size, parse_size  # noqa: E402
from cluster.testing import run_group  # noqa: E402

__all__ = ["main"]

CASES = ("ctx.all_reduce SUM", "ctx.all_reduce MEAN", "strategy.reduce SUM", "apply_gradients")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _task(transport, size: int, path: str, iters: int) -> dict[str, list[int]]:
    import numpy as np

    import cluster
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    implementation = "RING" if path == "network" else "AUTO"
    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, communication_options=cluster.CommunicationOptions(
            timeout_seconds=120, implementation=implementation))
    x = np.ones(size // 4, np.float32)
    with strategy.scope():
        var = cluster.Variable(np.zeros(size // 4, np.float32))
    opt = cluster.optimizers.SGD(0.5)

    def ctx_reduce(op):
        return lambda: strategy.run(lambda: cluster.get_replica_context().all_reduce(op, x))

    calls = {
        "ctx.all_reduce SUM": ctx_reduce("SUM"),
        "ctx.all_reduce MEAN": ctx_reduce("MEAN"),
        "strategy.reduce SUM": lambda: strategy.reduce("SUM", strategy.run(lambda: x), None),
        "apply_gradients": lambda: strategy.run(lambda: opt.apply_gradients([(x, var)])),
    }
    out = {}
    for case, call in calls.items():
        faults = []
        for i in range(3 + iters):
            before = _faults()
            result = call()
            after = _faults()
            del result
            if i >= 3:
                faults.append(after - before)
        out[case] = faults
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--size", default="64M")
    parser.add_argument("--paths", default="shm,network")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    pages = size // 4096
    print(f"minor page faults per call, rank 0, N={args.nprocs}, {fmt_size(size)} float32 "
          f"({pages} pages of 4 KiB); median of {args.iters}\n")
    print("| path | case | faults/call | x payload pages |")
    print("|---|---|---|---|")
    for path in args.paths.split(","):
        outcomes = run_group(_task, args.nprocs, args=(size, path, args.iters), timeout=600)
        for o in outcomes:
            if not o.ok:
                raise SystemExit(f"worker:{o.rank} failed: {o.error_type} {o.error}\n"
                                 f"{o.traceback}")
        for case in CASES:
            median = statistics.median(outcomes[0].result[case])
            print(f"| {path} | {case} | {median:.0f} | {median / pages:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
