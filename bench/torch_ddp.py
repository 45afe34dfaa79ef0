"""Training steps/s of the torch example's CNN: ``cluster.torch`` vs torch DDP (gloo), one run.

    uv run python bench/torch_ddp.py                       # N = 2, 3; 1M and 10M; both paths
    uv run python bench/torch_ddp.py --nprocs 2 --models 1M --paths shm --repeats 5

For each N, model and system, N fresh processes on loopback train the model of
``examples/torch/model.py`` (``1M``: ~1.0M parameters, ``10M``: ~10.0M) on fixed random digits,
``--batch`` rows per process, SGD:

- ``ours shm`` / ``ours network``: ``python -m worker`` tasks under
  ``MultiWorkerMirroredStrategy`` (``CLUSTER_COLLECTIVE_PATH=auto`` / ``network``), the
  example's step: forward, backward with ``cluster.torch.DistributedGradients`` (25 MB buckets
  started from the autograd hooks), ``synchronize()``, ``optimizer.step()``;
- ``DDP gloo``: ``torch.nn.parallel.DistributedDataParallel`` (gloo, 25 MB buckets), the same
  step.

A repeat is ``--steps`` timed steps after ``--warmup`` ones: steps/s = steps / wall time on rank
0 (steps are synchronous: every rank waits for the slowest). The compute time is the same step
without communication (``no_sync()`` in both systems, on the same processes, its own repeats);
``comm`` = step time - compute time: what communication adds to a step after overlap. Tables
show medians of ``--rounds`` x ``--repeats`` repeats (each round: fresh processes for every
system in turn, so load drifts hit all alike).

``CPU ms/step`` and ``CPU ms/compute``: the CPU time of the whole process (every thread) per
step, the busiest rank. Robust to load where wall time is not: on a shared 2-core machine a
step's wall time is at least N ranks' CPU time / the cores, so the ratio of the CPU columns is
what the steps/s ratio tends to under load. ``--phases`` adds rank 0's median ms per phase
(forward, backward, ``synchronize()``, optimizer; DDP waits for its buckets inside backward).
``--baseline FILE`` adds rows for another version of ``cluster/torch/_gradients.py``
(``git show REV:cluster/torch/_gradients.py > FILE``), interleaved with ours.

Threads: one intra-op thread per process in both systems (``torch.set_num_threads(1)`` before
any compute, and ``OMP_NUM_THREADS=1`` in both environments), so N ranks on C cores compete
alike; the collective stream (ours) and gloo's threads (DDP) come on top.
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
sys.path.insert(0, str(REPO / "examples" / "torch"))

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

LINE = "TORCH_DDP_BENCH "  # a rank's result line
PATHS = {"shm": "auto", "network": "network"}
PHASES = ("forward", "backward", "sync", "optimizer")  # --phases: where a step's time goes


class BenchError(RuntimeError):
    """A rank failed or did not finish in time; names the system, N and the rank."""


# -- one rank ------------------------------------------------------------------------------------

def _loop(step, steps: int, warmup: int, repeats: int) -> tuple[list[float], float]:
    """Seconds of ``steps`` calls of ``step``, per repeat (after ``warmup`` untimed calls), and
    the CPU seconds of the whole process (every thread) per timed call."""
    for _ in range(warmup):
        step()
    out = []
    cpu = time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        out.append(time.perf_counter() - start)
    return out, (time.process_time() - cpu) / (steps * repeats)


def _gradients_class(path: str | None):
    """``cluster.torch.DistributedGradients``, or the one defined in the file ``path`` (another
    build's ``_gradients.py``, for before/after comparisons: ``--baseline``)."""
    import cluster.torch

    if path is None:
        return cluster.torch.DistributedGradients
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_gradients", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.DistributedGradients


def _rank(system: str, config: dict) -> dict[str, list[float]]:
    import torch
    import torch.nn.functional as F
    from model import make_model

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(config["batch"], 64, generator=gen)
    y = torch.randint(0, 10, (config["batch"],), generator=gen)
    model = make_model(config["model"], seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    if system == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{config['port']}",
                                rank=config["rank"], world_size=config["n"])
        ddp = DistributedDataParallel(model)

        def step() -> None:
            F.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

        def local() -> None:
            with ddp.no_sync():
                step()

        def phased() -> list[float]:
            # DDP waits for its last bucket inside backward (the autograd engine's callback).
            t = [time.perf_counter()]
            loss = F.cross_entropy(ddp(x), y)
            t.append(time.perf_counter())
            loss.backward()
            t += [time.perf_counter()] * 2
            optimizer.step()
            optimizer.zero_grad()
            return [*t, time.perf_counter()]
        barrier = dist.barrier
    else:
        import cluster
        import cluster.torch

        strategy = cluster.MultiWorkerMirroredStrategy()
        cluster.torch.broadcast_module(model, strategy)
        grads = _gradients_class(config.get("gradients"))(model, strategy)
        group = strategy.extended.collective_group

        def step() -> None:
            F.cross_entropy(model(x), y).backward()
            grads.synchronize()
            optimizer.step()
            optimizer.zero_grad()

        def local() -> None:
            with grads.no_sync():
                F.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

        def phased() -> list[float]:
            t = [time.perf_counter()]
            loss = F.cross_entropy(model(x), y)
            t.append(time.perf_counter())
            loss.backward()
            t.append(time.perf_counter())
            grads.synchronize()
            t.append(time.perf_counter())
            optimizer.step()
            optimizer.zero_grad()
            return [*t, time.perf_counter()]
        barrier = group.barrier
    args = (config["steps"], config["warmup"], config["repeats"])
    barrier()
    times, cpu = {}, {}
    times["step"], cpu["step"] = _loop(step, *args)
    barrier()
    times["compute"], cpu["compute"] = _loop(local, *args)
    # CPU time per call, every thread of the process: what a step costs the machine whatever
    # the load (on 2 cores, N ranks' threads share them: CPU time adds up, overlap or not).
    times.update({f"cpu_{k}": [v] for k, v in cpu.items()})
    if config.get("phases"):
        barrier()
        times.update(_phases(phased, config["steps"] * config["repeats"], config["warmup"]))
    barrier()
    return times


def _phases(phased, steps: int, warmup: int) -> dict[str, list[float]]:
    """Seconds of each phase of ``steps`` synchronized steps (``phased`` returns the
    ``perf_counter`` marks of one step: before forward, backward, sync, the optimizer, the end)."""
    for _ in range(warmup):
        phased()
    marks = [phased() for _ in range(steps)]
    return {f"phase:{name}": [m[i + 1] - m[i] for m in marks]
            for i, name in enumerate(PHASES)}


# -- the harness ---------------------------------------------------------------------------------

def _collect(system: str, n: int, tasks: list) -> list[dict[str, list[float]]]:
    results = []
    for task in tasks:
        results.append(task_result(task, 1200.0, LINE, f"{system} N={n}", BenchError))
    return results


def run(system: str, n: int, config: dict) -> list[dict[str, list[float]]]:
    """Per rank ``{"step": [s per repeat], "compute": [...]}`` of N fresh processes."""
    script = str(Path(__file__).resolve())
    with TaskProcesses() as procs:
        if system == "DDP gloo":
            (port,) = pick_free_ports("127.0.0.1", 1)
            tasks = [procs.python(script, "--rank", "ddp", json.dumps(
                dict(config, rank=r, n=n, port=port)), cwd=REPO, env={"OMP_NUM_THREADS": "1"},
                name=f"gloo rank {r}") for r in range(n)]
        else:
            spec = loopback_cluster(worker=n)
            env = {"CLUSTER_TOKEN": os.urandom(16).hex(),
                   "CLUSTER_COLLECTIVE_PATH": PATHS[system.split()[-1]], "OMP_NUM_THREADS": "1",
                   # Importing torch can hold the GIL (and starve the heartbeat thread) for
                   # seconds on a loaded machine: gloo has no heartbeat to lose.
                   "CLUSTER_HEARTBEAT_TIMEOUT": "15"}
            tasks = [procs.python("-m", "worker", script, "--rank", "ours", json.dumps(config),
                                  cwd=REPO, env=env, tf_config=tf_config(spec, "worker", i),
                                  name=f"worker:{i}") for i in range(n)]
        return _collect(system, n, tasks)


def summarize(per_rank: list[dict[str, list[float]]], steps: int) -> dict[str, float]:
    """steps/s (rank 0's repeats: the steps are synchronous) and the split, medians; with
    ``--phases``, rank 0's median ms per phase of a step (``phase:NAME``)."""
    step = statistics.median(per_rank[0]["step"]) / steps
    compute = max(statistics.median(r["compute"]) for r in per_rank) / steps
    out = {"steps_per_s": 1.0 / step, "step_ms": step * 1e3, "compute_ms": compute * 1e3,
           "comm_ms": max(step - compute, 0.0) * 1e3}
    for name in PHASES:
        if f"phase:{name}" in per_rank[0]:
            out[f"phase:{name}"] = statistics.median(per_rank[0][f"phase:{name}"]) * 1e3
    for kind in ("step", "compute"):  # the busiest rank's CPU ms per step (all threads)
        out[f"cpu_{kind}_ms"] = max(statistics.median(r[f"cpu_{kind}"]) for r in per_rank) * 1e3
    return out


def _merge(into: list[dict[str, list[float]]] | None,
           more: list[dict[str, list[float]]]) -> list[dict[str, list[float]]]:
    """Per rank, the repeats of several rounds together."""
    if into is None:
        return more
    return [{k: a[k] + b[k] for k in a} for a, b in zip(into, more, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="2,3")
    parser.add_argument("--models", default="1M,10M")
    parser.add_argument("--paths", default="shm,network")
    parser.add_argument("--batch", type=int, default=32, help="rows per process")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per repeat")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="fresh processes per system, the systems alternating; the "
                             "medians are over every round's repeats")
    parser.add_argument("--phases", action="store_true",
                        help="also time each phase of a step (forward, backward, sync, "
                             "optimizer) on rank 0")
    parser.add_argument("--baseline", type=Path,
                        help="another version of cluster/torch/_gradients.py: adds 'base shm' / "
                             "'base network' rows, interleaved with ours")
    parser.add_argument("--json", type=Path,
                        help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    systems = [f"ours {p}" for p in paths]
    if args.baseline:
        systems += [f"base {p}" for p in paths]
    systems.append("DDP gloo")
    import torch

    ns = [int(v) for v in args.nprocs.split(",")]
    print(machine_line(ns), flush=True)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU(s), batch {args.batch} rows per "
          f"process, medians of {args.rounds} x {args.repeats} repeats x {args.steps} steps, "
          f"load {_load()}", flush=True)
    header = ("| N | cores/rank | model | system | steps/s | step ms | compute ms | comm ms | "
              "x DDP | CPU ms/step | CPU ms/compute |\n" + "|---" * 11 + "|")
    rows, lines, phase_lines = [], [header], []
    for n in ns:
        for model in args.models.split(","):
            config = {"model": model, "batch": args.batch, "steps": args.steps,
                      "warmup": args.warmup, "repeats": args.repeats, "phases": args.phases}
            raw: dict[str, list[dict[str, list[float]]] | None] = dict.fromkeys(systems)
            for _ in range(args.rounds):
                for system in systems:
                    extra = ({"gradients": str(args.baseline.resolve())}
                             if system.startswith("base") else {})
                    raw[system] = _merge(raw[system], run(system, n, dict(config, **extra)))
            found = {s: summarize(r, args.steps) for s, r in raw.items()}
            ddp = found["DDP gloo"]["steps_per_s"]
            for system, r in found.items():
                rows.append(dict(r, n=n, model=model, system=system))
                lines.append(f"| {n} | {cores_per_rank(n):g} | {model} | {system} | "
                             f"{r['steps_per_s']:.2f} | "
                             f"{r['step_ms']:.1f} | {r['compute_ms']:.1f} | {r['comm_ms']:.1f} "
                             f"| {r['steps_per_s'] / ddp:.2f}x | {r['cpu_step_ms']:.1f} | "
                             f"{r['cpu_compute_ms']:.1f} |")
                print(lines[-1], flush=True)
                if args.phases:
                    phase_lines.append(f"| {n} | {model} | {system} | " + " | ".join(
                        f"{r['phase:' + p]:.1f}" for p in PHASES) + " |")
    print("\n".join(lines))
    if phase_lines:
        print("\nrank 0, median ms per phase of a step (DDP: sync happens inside backward)\n"
              "| N | model | system | " + " | ".join(PHASES) + " |\n|---|---|---|"
              + "---|" * len(PHASES))
        print("\n".join(phase_lines))
    print(f"load at the end {_load()}")
    if args.json:
        write_result(args.json, name=args.json.stem, title="PyTorch training steps against DDP",
                     summary=SUMMARY, script="torch_ddp.py",
                     argv=list(sys.argv[1:] if argv is None else argv),
                     tables=[result_table(rows)], figures=result_figures(rows),
                     plots=[Plot(title="Steps/s over DDP's", table=0, kind="bar",
                                 x=("N", "model", "system"), y=("x DDP",),
                                 ylabel="x DDP (above 1: ours faster)")])
    return 0


# -- result file -----------------------------------------------------------------------------

SUMMARY = ("Steps/s of the PyTorch example's CNN, cluster.torch on each path beside DDP (gloo, "
           "25 MB buckets), one thread per process. Medians of rounds x repeats; CPU per step "
           "is the whole process's CPU time per step (all threads, busiest rank), CPU per "
           "compute the same for the step without communication.")


def result_table(rows: list[dict]) -> Table:
    """One row per (N, model, system); ``x DDP`` is its steps/s over DDP's of the same N and
    model."""
    ddp = {(r["n"], r["model"]): r["steps_per_s"] for r in rows if r["system"] == "DDP gloo"}
    columns = (Column("N"), CORES_PER_RANK, Column("model"), Column("system"),
               Column("steps/s", "steps/s", 2),
               Column("step", "ms", 1), Column("compute", "ms", 1), Column("comm", "ms", 1),
               Column("x DDP", "x", 2), Column("CPU per step", "ms", 1),
               Column("CPU per compute", "ms", 1))
    cells = tuple(
        (r["n"], cores_per_rank(r["n"]), r["model"], r["system"], round(r["steps_per_s"], 2),
         round(r["step_ms"], 1),
         round(r["compute_ms"], 1), round(r["comm_ms"], 1),
         round(r["steps_per_s"] / ddp[(r["n"], r["model"])], 2)
         if (r["n"], r["model"]) in ddp else None,
         round(r["cpu_step_ms"], 1), round(r["cpu_compute_ms"], 1)) for r in rows)
    return Table(title="Steps per second", columns=columns, rows=cells)


def result_figures(rows: list[dict]) -> list[Figure]:
    """``x DDP`` of each of our systems, per N and model."""
    table = result_table(rows)
    x, n = table.column("x DDP"), table.column("N")
    model, system = table.column("model"), table.column("system")
    return [Figure(f"{row[system]} {row[model]} N={row[n]}", row[x], "x")
            for row in table.rows if row[system] != "DDP gloo" and row[x] is not None]


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        _times = _rank(sys.argv[2], json.loads(sys.argv[3]))
        print(LINE + json.dumps(_times), flush=True)
        sys.exit(0)
    sys.exit(main())
