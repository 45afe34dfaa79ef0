"""One task of ``bench/strategy.py``: ``python -m worker bench/_strategy_task.py [options]``.

Times the public API under ``cluster.MultiWorkerMirroredStrategy`` (one replica per task):

- ``all_reduce:SIZE``: ``strategy.run(lambda: get_replica_context().all_reduce(SUM, x))`` of a
  float32 array of SIZE bytes (ones; the result must be N everywhere);
- ``apply_gradients:MODEL``: ``strategy.run(lambda: opt.apply_gradients(zip(grads, vars)))``
  with variables of the model's shapes (:mod:`bench._model_shapes`) created under
  ``strategy.scope()``, ``cluster.optimizers.SGD``, and the gradients fixed random float32
  NumPy arrays (the same seed on every task, so the update is checked exactly: after K steps a
  variable holds ``-K * lr * N * g``).

Every iteration starts after a barrier (a 4-byte all-reduce through the strategy); its time is
``perf_counter`` around the one call. The benchmark starts ``worker:0`` .. ``worker:N-1`` (no
chief), so the task index is the rank. Output, the protocol with the benchmark: one line
``STRATEGY_BENCH {json}`` with ``task``, ``rank``, ``n``, ``path`` (the collective path this task
was configured with: ``auto`` or ``network``) and ``times`` (``{case: [seconds per
timed iteration]}``, and ``{"cpu:" + case: [CPU seconds of this process per timed iteration]}``),
printed when every case is done. With ``--profile FILE`` every task runs
one more all-reduce of the largest size (without sizes: one ``apply_gradients`` step of the
first model) under cProfile; rank 0 writes its stats to FILE.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys
import time
from pathlib import Path

import numpy as np

import cluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._model_shapes import MODELS  # noqa: E402

LEARNING_RATE = 0.5  # a power of two: -K * lr * N * g stays exact enough to check tightly


def barrier(strategy) -> None:
    strategy.run(lambda: cluster.get_replica_context().all_reduce(
        cluster.ReduceOp.SUM, np.ones(1, np.float32)))


def timed(strategy, call, iters: int, warmup: int, cpu: list[float] | None = None
          ) -> list[float]:
    """Seconds of each of ``iters`` calls of ``call`` after ``warmup`` untimed ones; with
    ``cpu``, each call's CPU seconds (this process, all its threads) are appended to it."""
    times = []
    for i in range(warmup + iters):
        barrier(strategy)
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
        if i >= warmup:
            times.append(elapsed)
            if cpu is not None:
                cpu.append(used)
    return times


def all_reduce_case(strategy, size: int, iters: int, warmup: int,
                    cpu: list[float] | None = None) -> list[float]:
    x = np.ones(size // 4, np.float32)
    result = []

    def call() -> None:
        result[:] = [strategy.run(lambda: cluster.get_replica_context().all_reduce(
            cluster.ReduceOp.SUM, x))]

    times = timed(strategy, call, iters, warmup, cpu)
    out = np.asarray(strategy.experimental_local_results(result[0])[0])
    if out.shape != x.shape or not np.all(out == strategy.num_replicas_in_sync):
        raise AssertionError(f"all_reduce of {size} bytes of ones gave {out.ravel()[:4]}, "
                             f"expected {strategy.num_replicas_in_sync}")
    return times


def apply_gradients_case(strategy, model: str, iters: int, warmup: int,
                         cpu: list[float] | None = None) -> list[float]:
    shapes = MODELS[model]()
    rng = np.random.default_rng(0)  # the same gradients on every task
    grads = [rng.standard_normal(shape, dtype=np.float32) for _, shape in shapes]
    with strategy.scope():
        variables = [cluster.Variable(np.zeros(shape, np.float32), name=name)
                     for name, shape in shapes]
        optimizer = cluster.optimizers.SGD(LEARNING_RATE)
    pairs = list(zip(grads, variables, strict=True))
    times = timed(strategy, lambda: strategy.run(lambda: optimizer.apply_gradients(pairs)),
                  iters, warmup, cpu)
    steps = iters + warmup
    for g, v in ((grads[0], variables[0]), (grads[-1], variables[-1])):
        want = -steps * LEARNING_RATE * strategy.num_replicas_in_sync * g
        got = np.asarray(v.numpy())
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            raise AssertionError(f"apply_gradients over {model}: {v.name} is {got.ravel()[:3]}, "
                                 f"expected {want.ravel()[:3]}")
    return times


def profile_one(strategy, rank: int, path: str, sizes: list[int], models: list[str]) -> None:
    """One more call under cProfile (rank 0's stats to ``path``): the largest all-reduce, or
    without sizes one ``apply_gradients`` step of the first model."""
    if sizes:
        x = np.ones(max(sizes) // 4, np.float32)
        call = lambda: cluster.get_replica_context().all_reduce(cluster.ReduceOp.SUM, x)  # noqa: E731
    else:
        shapes = MODELS[models[0]]()
        rng = np.random.default_rng(0)
        with strategy.scope():
            pairs = [(rng.standard_normal(shape, dtype=np.float32),
                      cluster.Variable(np.zeros(shape, np.float32), name=name))
                     for name, shape in shapes]
            optimizer = cluster.optimizers.SGD(LEARNING_RATE)
        strategy.run(lambda: optimizer.apply_gradients(pairs))  # warm: slots, pools
        call = lambda: optimizer.apply_gradients(pairs)  # noqa: E731
    barrier(strategy)
    profile = cProfile.Profile()
    profile.enable()
    strategy.run(call)
    profile.disable()
    if rank == 0:
        profile.dump_stats(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="", help="comma list of all-reduce sizes in bytes")
    parser.add_argument("--models", default="", help="comma list of " + ", ".join(MODELS))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--model-iters", type=int, default=5)
    parser.add_argument("--model-warmup", type=int, default=2)
    parser.add_argument("--profile", default="", help="write rank 0's cProfile stats here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    models = [m for m in args.models.split(",") if m]

    strategy = cluster.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    rank = resolver.task_id  # the benchmark starts worker:0 .. worker:N-1, in rank order
    times: dict[str, list[float]] = {}
    for size in sizes:
        case = f"all_reduce:{size}"
        times[case] = all_reduce_case(strategy, size, args.iters, args.warmup,
                                      times.setdefault(f"cpu:{case}", []))
    for model in models:
        case = f"apply_gradients:{model}"
        times[case] = apply_gradients_case(strategy, model, args.model_iters,
                                           args.model_warmup, times.setdefault(f"cpu:{case}", []))
    if args.profile and (sizes or models):
        profile_one(strategy, rank, args.profile, sizes, models)
    barrier(strategy)  # nobody leaves while a peer still needs it
    print("STRATEGY_BENCH " + json.dumps({
        "task": f"{resolver.task_type}:{resolver.task_id}", "rank": rank,
        "n": strategy.num_replicas_in_sync, "times": times,
        "path": cluster.runtime.current().settings.collectives.path.value}), flush=True)


if __name__ == "__main__":
    main()
