"""Keras ``model.fit`` steps/s under ``cluster.keras`` beside the same Keras model under torch
DDP (gloo), in one run.

    uv run python bench/keras_fit.py                        # N = 2, 3; 1M and 10M; both paths
    uv run python bench/keras_fit.py --nprocs 2 --models 1M --paths shm --steps 20

Needs the ``keras`` extra (``uv sync --inexact --extra keras``). For each N, model and system,
N fresh processes on loopback train an MLP (64 -> H -> H -> 10; ``1M``: H = 960, ~1.0M
parameters, ``10M``: H = 3120, ~10.0M) on fixed random rows, ``--batch`` rows per process
(global batch N x ``--batch``), SGD:

- ``ours shm`` / ``ours network``: ``python -m worker`` tasks under
  ``MultiWorkerMirroredStrategy`` (``CLUSTER_COLLECTIVE_PATH=auto`` / ``network``), the model
  compiled in its scope and trained with plain ``model.fit`` (``cluster.keras``);
- ``DDP gloo``: the same Keras model (a ``torch.nn.Module`` on Keras' torch backend) wrapped
  in ``torch.nn.parallel.DistributedDataParallel`` (gloo), trained with a torch loop over each
  rank's rows and ``torch.optim.SGD``, as Keras' guide to multi-GPU training with torch does
  (Keras 3 has no ``keras.distribution`` on the torch backend);
- ``alone``: one process, ``model.fit`` on ``--batch`` rows per step, no strategy: the compute
  a step costs without communication.

steps/s = timed steps / wall time on rank 0 (steps are synchronous), after ``--warmup`` steps,
the median of ``--repeats``; ``comm share`` = 1 - alone's step time / the step time: what
distribution adds to a step, as a share of it. One intra-op thread per process
(``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``), so N ranks on C cores compete alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._results import task_result  # noqa: E402
from bench.record import (  # noqa: E402
    CORES_PER_RANK,
    Column,
    Figure,
    Plot,
    Table,
    cores_per_rank,
    machine_line,
    write_result,
)
from cluster.ctl.ports import pick_free_ports  # noqa: E402
from cluster.testing import TaskProcesses, loopback_cluster, tf_config  # noqa: E402

LINE = "KERAS_FIT_BENCH "  # a rank's result line
PATHS = {"shm": "auto", "network": "network"}
HIDDEN = {"1M": 960, "10M": 3120}


class BenchError(RuntimeError):
    """A rank failed or did not finish in time; names the system, N and the rank."""


# -- one rank ------------------------------------------------------------------------------------

def _model(keras, hidden: int):
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(10)])


def _data(rows: int):
    import numpy as np

    rng = np.random.default_rng(1)
    return (rng.random((rows, 64), dtype=np.float32),
            rng.integers(0, 10, rows).astype(np.int64))


def _rank(system: str, config: dict) -> list[float]:
    """Seconds per repeat of ``steps`` timed steps (after ``warmup``), rank 0's clock."""
    os.environ["KERAS_BACKEND"] = "torch"
    import torch

    torch.set_num_threads(1)
    steps, warmup, repeats = config["steps"], config["warmup"], config["repeats"]
    n = config["n"]
    if system == "ddp":
        import keras
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{config['port']}",
                                rank=config["rank"], world_size=n)
        keras.utils.set_random_seed(0)
        model = _model(keras, config["hidden"])
        ddp = DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = (torch.from_numpy(a) for a in _data(config["batch"]))
        loss_fn = torch.nn.CrossEntropyLoss()

        def step() -> None:
            loss_fn(ddp(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

        times = []
        for _ in range(warmup):
            step()
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times.append(time.perf_counter() - start)
        dist.barrier()
        return times
    import keras

    import cluster

    strategy = cluster.MultiWorkerMirroredStrategy() if system == "ours" else None
    keras.utils.set_random_seed(0)
    if strategy is not None:
        with strategy.scope():
            model = _model(keras, config["hidden"])
            model.compile(optimizer=keras.optimizers.SGD(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    else:
        model = _model(keras, config["hidden"])
        model.compile(optimizer=keras.optimizers.SGD(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    global_batch = config["batch"] * (n if strategy is not None else 1)
    x, y = _data(global_batch * (warmup + steps))
    times: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == warmup:
                self.start = time.perf_counter()

        def on_train_end(self, logs=None):
            times.append(time.perf_counter() - self.start)

    for _ in range(repeats):
        model.fit(x, y, batch_size=global_batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[Clock()])
    return times


# -- the harness ---------------------------------------------------------------------------------

def run(system: str, n: int, config: dict) -> list[float]:
    """Rank 0's seconds per repeat, N fresh processes (one for ``alone``)."""
    script = str(Path(__file__).resolve())
    what = f"{system} N={n} {config['model']}"
    with TaskProcesses() as procs:
        if system == "DDP gloo":
            (port,) = pick_free_ports("127.0.0.1", 1)
            tasks = [procs.python(script, "--rank", "ddp", json.dumps(
                dict(config, rank=r, n=n, port=port)), cwd=REPO, env={"OMP_NUM_THREADS": "1"},
                name=f"gloo rank {r}") for r in range(n)]
        elif system == "alone":
            tasks = [procs.python(script, "--rank", "alone", json.dumps(dict(config, n=1)),
                                  cwd=REPO, env={"OMP_NUM_THREADS": "1"}, name="alone")]
        else:
            spec = loopback_cluster(worker=n)
            env = {"CLUSTER_TOKEN": os.urandom(16).hex(),
                   "CLUSTER_COLLECTIVE_PATH": PATHS[system.split()[-1]], "OMP_NUM_THREADS": "1",
                   # Importing torch and Keras can starve the heartbeat thread for seconds.
                   "CLUSTER_HEARTBEAT_TIMEOUT": "15"}
            tasks = [procs.python("-m", "worker", script, "--rank", "ours",
                                  json.dumps(dict(config, n=n)), cwd=REPO, env=env,
                                  tf_config=tf_config(spec, "worker", i), name=f"worker:{i}")
                     for i in range(n)]
        results = [task_result(t, 1200.0, LINE, what, BenchError) for t in tasks]
    return results[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", nargs=2, metavar=("SYSTEM", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--models", nargs="+", default=["1M", "10M"], choices=list(HIDDEN))
    parser.add_argument("--hidden", type=int, help="override the models' hidden width")
    parser.add_argument("--paths", nargs="+", default=["shm", "network"], choices=list(PATHS))
    parser.add_argument("--batch", type=int, default=32, help="rows per process per step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path,
                        help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    if args.rank:
        system, config = args.rank
        print(LINE + json.dumps(_rank(system, json.loads(config))), flush=True)
        return 0
    print(machine_line(args.nprocs), flush=True)
    print(f"{'model':>5} {'N':>2} {'system':<13} {'steps/s':>8} {'ms/step':>8} "
          f"{'comm share':>10} {'x DDP':>6}")
    rows: list[list] = []
    for model in args.models:
        config = {"model": model, "hidden": args.hidden or HIDDEN[model], "batch": args.batch,
                  "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats}
        alone = statistics.median(run("alone", 1, config)) / args.steps
        rows.append([model, 1, cores_per_rank(1), "alone", 1 / alone, alone * 1e3, None, None])
        print(f"{model:>5} {1:>2} {'alone':<13} {1 / alone:8.1f} {alone * 1e3:8.1f}", flush=True)
        for n in args.nprocs:
            steps = {system: statistics.median(run(system, n, config)) / args.steps
                     for system in [*(f"ours {p}" for p in args.paths), "DDP gloo"]}
            for system, step in steps.items():
                share = max(1.0 - alone / step, 0.0)
                ratio = steps["DDP gloo"] / step
                rows.append([model, n, cores_per_rank(n), system, 1 / step, step * 1e3,
                             100 * share, ratio])
                print(f"{model:>5} {n:>2} {system:<13} {1 / step:8.1f} {step * 1e3:8.1f} "
                      f"{share:10.0%} {ratio:5.2f}x", flush=True)
    if args.json:
        write_result(args.json, name=args.json.stem, title="Keras model.fit against DDP",
                     summary=SUMMARY, script="keras_fit.py",
                     argv=list(sys.argv[1:] if argv is None else argv),
                     tables=[result_table(rows)], figures=result_figures(rows),
                     plots=[Plot(title="fit steps/s over DDP's", table=0, kind="bar",
                                 x=("model", "N", "system"), y=("x DDP",),
                                 ylabel="x DDP (above 1: ours faster)")])
    return 0


# -- result file -----------------------------------------------------------------------------

SUMMARY = ("Keras model.fit steps/s of an MLP under cluster.keras (MultiWorkerMirroredStrategy, "
           "each path) beside the same Keras model under torch DDP (gloo) with a torch loop, and "
           "one process alone; one thread per process, medians of the repeats. Comm share: the "
           "part of a step that distribution adds (1 - alone's step time / the step time).")


def result_table(rows: list[list]) -> Table:
    """One row per (model, N, system); ``x DDP`` is DDP's step time over the row's (above 1:
    faster than DDP) for the same model and N."""
    columns = (Column("model"), Column("N"), CORES_PER_RANK, Column("system"),
               Column("steps/s", "steps/s", 1), Column("step", "ms", 1),
               Column("comm share", "%", 0), Column("x DDP", "x", 2))
    return Table(title="model.fit steps per second", columns=columns,
                 rows=tuple(tuple(r) for r in rows))


def result_figures(rows: list[list]) -> list[Figure]:
    """The N=2 shared-memory ratio over DDP of each model: the page's headline."""
    return [Figure(f"{r[0]} model, N={r[1]}, {r[3]}", r[7], "x") for r in rows
            if r[3] == "ours shm" and r[1] == 2]


if __name__ == "__main__":
    sys.exit(main())
