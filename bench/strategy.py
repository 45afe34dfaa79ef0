"""The public API as users feel it: ``strategy.run`` all-reduce and ``apply_gradients`` beside
torch.distributed gloo and DDP, one run.

    uv run python bench/strategy.py                        # N = 2, 4; both paths; all cases
    uv run python bench/strategy.py --nprocs 2 --sizes 64M --models "" --paths shm
    uv run python bench/strategy.py --profile              # + cProfile of one ctx.all_reduce
    uv run python bench/strategy.py --json bench/results/strategy.json   # + a result file
    uv run python bench/strategy.py --rounds 3             # interleaved rounds, pooled medians

Ours: for each N and path, N fresh ``python -m worker bench/_strategy_task.py`` tasks
(``worker:0`` .. ``worker:N-1`` on loopback, each with its ``TF_CONFIG`` and a cluster token, as
clusterctl starts them) under ``cluster.MultiWorkerMirroredStrategy``. Paths: ``shm`` (the
default, ``CLUSTER_COLLECTIVE_PATH=auto``: co-located tasks reduce through shared memory) and
``network`` (``CLUSTER_COLLECTIVE_PATH=network``: the network algorithms on the TCP data plane).
Cases (see :mod:`bench._strategy_task`):

- ``all_reduce SIZE``: ``strategy.run(lambda: get_replica_context().all_reduce(SUM, x))``;
  beside it gloo's ``dist.all_reduce`` of the same bytes.
- ``apply_gradients MODEL``: one ``strategy.run(lambda: opt.apply_gradients(...))`` step (SGD)
  over the parameter shapes of ResNet-50 or BERT-base (:mod:`bench._model_shapes`); beside it
  DDP's all-reduce time for the same parameters: DDP (gloo) ``loss.backward()`` minus the same
  backward without DDP (:mod:`bench._strategy_torch` explains the choice). Both backward times
  are shown too.

gloo runs once per N and round (it has no path) and stands beside both tables. Every iteration
starts after a barrier; its time is the slowest rank's; tables show medians over ``--iters``
(all-reduce) or ``--model-iters`` (model steps) iterations after the warm-up ones, pooled over
``--rounds`` rounds. A round launches gloo, then ours on each path, so slow spells of a shared
machine (single runs vary up to 2x here) fall on both sides instead of on one.
``x gloo`` = gloo's (DDP's) time / ours: above 1 we are faster. busbw = bytes / time *
2(N-1)/N (nccl-tests' convention; for a model, bytes = all its float32 gradients). ``target``
is the goal for the row, as an ``x gloo`` to reach (a step time <= 0.5x DDP's all-reduce
time reads ``>= 2.0x``). ``x (DDP + step)`` compares like with like: our step includes the
update, so it is set beside DDP's all-reduce plus torch's own SGD step on the same parameters.
``x buckets`` sets our step beside gloo's all-reduce of DDP's buckets with no backward running:
DDP's own figure is what its all-reduce adds to a backward it overlaps with, while
``apply_gradients`` receives finished gradients and has nothing to overlap with.
``CPU per call`` adds up the CPU time every rank's process (all its threads) used in the call,
median over iterations; gloo's, for a model, is that of its buckets alone. ``cores busy`` is that
over the call's time: at the machine's core count the call is CPU-bound, and the CPU it needs
is its floor.

torch is the ``torch`` extra, never a runtime dependency: ``uv sync --inexact --extra torch``;
without it (or with ``--no-torch``) the gloo columns say
"not installed" ("skipped").
"""

from __future__ import annotations

import argparse
import os
import platform
import pstats
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._model_shapes import MODELS, parameter_count  # noqa: E402
from bench._results import task_result  # noqa: E402
from bench._strategy_torch import bench_torch, torch_version  # noqa: E402
from bench.allreduce import busbw, fmt_size, parse_size  # noqa: E402
from bench.record import (  # noqa: E402
    Column,
    Figure,
    Plot,
    Table,
    cores_per_rank,
    machine_line,
    write_result,
)
from cluster.testing import (  # noqa: E402
    TaskProcesses,
    loopback_cluster,
    tf_config,
)

__all__ = ["BenchError", "bench_ours", "main", "target"]

TASK = Path(__file__).resolve().parent / "_strategy_task.py"
PATHS = {"shm": "auto", "network": "network"}  # our path -> CLUSTER_COLLECTIVE_PATH
LINE = "STRATEGY_BENCH "


class BenchError(RuntimeError):
    """Our tasks of one (N, path) launch failed or did not finish; names them and the output."""


def target(path: str, n: int, case: str) -> float | None:
    """The goal for a row as the ``x gloo`` to reach, or ``None`` where it sets none."""
    kind, _, what = case.partition(":")
    if kind == "apply_gradients":
        return 2.0 if path == "shm" else 1.0  # step <= 0.5x (1.0x) DDP's all-reduce time
    if kind == "all_reduce" and int(what) == 64 << 20:
        if path == "shm":
            return 2.5 if n in (2, 4) else None
        return {2: 1.2, 4: 1.0}.get(n)
    return None


def case_bytes(case: str) -> int:
    kind, _, what = case.partition(":")
    return int(what) if kind == "all_reduce" else 4 * parameter_count(MODELS[what]())


def case_name(case: str) -> str:
    kind, _, what = case.partition(":")
    return f"all_reduce {fmt_size(int(what))}" if kind == "all_reduce" else f"{kind} {what}"


def pooled(so_far: list[dict] | None, more: list[dict]) -> list[dict]:
    """Per rank, every case's iteration times of ``so_far`` followed by those of ``more``."""
    if not so_far:
        return more
    return [{case: times + extra[case] for case, times in mine.items()}
            for mine, extra in zip(so_far, more, strict=True)]


def slowest_median(per_rank: list[dict[str, list[float]]], case: str) -> float:
    """The median over iterations of the slowest rank's time."""
    return statistics.median(max(r[case][i] for r in per_rank)
                             for i in range(len(per_rank[0][case])))


def cpu_median(per_rank: list[dict[str, list[float]]], case: str) -> float | None:
    """The median over iterations of the CPU seconds all ranks used in the call (``cpu:CASE``),
    or ``None`` where it was not recorded."""
    key = f"cpu:{case}"
    if any(not r.get(key) for r in per_rank):
        return None
    return statistics.median(sum(r[key][i] for r in per_rank)
                             for i in range(len(per_rank[0][key])))


# -- ours ------------------------------------------------------------------------------------


def bench_ours(n: int, path: str, argv: list[str], timeout: float = 1200.0
               ) -> list[dict[str, list[float]]]:
    """Per rank, ``{case: [seconds per timed iteration]}`` of N ``python -m worker`` tasks on
    ``path`` running ``bench/_strategy_task.py ARGV``.

    Raises:
        BenchError: a task exited non-zero, printed no result, or was not done within
            ``timeout`` s (every task is killed and reaped first).
    """
    spec = loopback_cluster(worker=n)
    env = {"CLUSTER_TOKEN": os.urandom(16).hex(), "CLUSTER_COLLECTIVE_PATH": PATHS[path]}
    results: list[dict[str, list[float]]] = []
    with TaskProcesses() as tasks:
        started = [tasks.python("-m", "worker", TASK, *argv, cwd=REPO, env=env,
                                tf_config=tf_config(spec, "worker", i), name=f"worker:{i}")
                   for i in range(n)]
        # One deadline for the launch; a task that fails makes its peers fail soon after
        # (heartbeats), so waiting in rank order still ends early.
        for task in started:
            report = task_result(task, timeout, LINE, f"ours ({path}), N={n}", BenchError)
            if report["path"] != PATHS[path]:
                raise BenchError(f"ours ({path}), N={n}: {task.name} ran on {report['path']}")
            results.append(report["times"])
    return results


# -- report ----------------------------------------------------------------------------------


def environment_line() -> str:
    import numpy

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    torch = torch_version() or "not installed"
    return (f"{os.cpu_count()} cores, load {load}, Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, torch {torch}, {platform.platform()}")


def rows_for(n: int, path: str, cases: list[str], ours: list[dict] | None,
             theirs: list[dict] | None, gloo_state: str) -> list[dict]:
    rows = []
    for case in cases:
        size = case_bytes(case)
        row: dict = {"n": n, "path": path, "case": case, "bytes": size, "target": target(
            path, n, case), "ours_s": None, "gloo_s": None, "ddp_backward_s": None,
            "local_backward_s": None, "torch_step_s": None, "buckets_s": None,
            "ours_cpu_s": None, "gloo_cpu_s": None, "gloo": gloo_state}
        if ours is not None:
            row["ours_s"] = slowest_median(ours, case)
            row["ours_cpu_s"] = cpu_median(ours, case)
        if theirs is not None:
            if case.startswith("all_reduce"):
                row["gloo_s"] = slowest_median(theirs, case)
                row["gloo_cpu_s"] = cpu_median(theirs, case)
            else:
                model = case.partition(":")[2]
                row["ddp_backward_s"] = slowest_median(theirs, f"ddp_backward:{model}")
                row["local_backward_s"] = slowest_median(theirs, f"local_backward:{model}")
                row["gloo_s"] = max(row["ddp_backward_s"] - row["local_backward_s"], 0.0)
                row["torch_step_s"] = slowest_median(theirs, f"sgd_step:{model}")
                row["buckets_s"] = slowest_median(theirs, f"bucket_all_reduce:{model}")
                # DDP's backward burns CPU of its own: gloo's CPU is that of its buckets alone.
                row["gloo_cpu_s"] = cpu_median(theirs, f"bucket_all_reduce:{model}")
        for who in ("ours", "gloo"):
            t = row[f"{who}_s"]
            row[f"{who}_busbw"] = busbw(size, n, t) if t else None
        row["x_gloo"] = (row["gloo_s"] / row["ours_s"]
                         if row["ours_s"] and row["gloo_s"] is not None else None)
        # Like for like: our step includes the update, DDP's figure does not.
        row["x_with_step"] = ((row["gloo_s"] + row["torch_step_s"]) / row["ours_s"]
                              if row["ours_s"] and row["torch_step_s"] is not None else None)
        # Like for like again: DDP's figure is what its all-reduce adds to a backward it
        # overlaps with; ours runs after the backward (apply_gradients gets finished gradients).
        row["x_buckets"] = (row["buckets_s"] / row["ours_s"]
                            if row["ours_s"] and row["buckets_s"] is not None else None)
        rows.append(row)
    return rows


HEAD = ("| N | case | ours median (ms) | gloo/DDP median (ms) | x gloo | target | "
        "busbw ours (GB/s) | busbw gloo (GB/s) | DDP backward (ms) | local backward (ms) | "
        "torch SGD step (ms) | x (DDP + step) | gloo on DDP's buckets alone (ms) | "
        "x buckets | CPU per call, all ranks, ours / gloo (ms) | cores busy ours / gloo | "
        "cores/rank |")


def gloo_wall(row: dict) -> float | None:
    """The wall time gloo's CPU figure belongs to: its all-reduce, or for a model its buckets
    alone (DDP's figure is a difference of two backward passes)."""
    return row["gloo_s"] if row["case"].startswith("all_reduce") else row["buckets_s"]


def busy(cpu: float | None, wall: float | None) -> str:
    """CPU seconds over wall seconds: how many cores the call kept busy on average (the
    machine's core count means CPU-bound: a faster call then needs less CPU, not less
    waiting)."""
    return f"{cpu / wall:.2f}" if cpu is not None and wall else "-"


def format_row(row: dict) -> str:
    def ms(t: float | None, missing: str) -> str:
        return f"{t * 1e3:.2f}" if t is not None else missing

    def gbs(b: float | None, missing: str) -> str:
        return f"{b:.2f}" if b is not None else missing

    ours_missing = "failed"
    gloo_missing = row["gloo"] if row["gloo"] != "ok" else "-"
    goal = row["target"]
    met = ("" if row["x_gloo"] is None or goal is None
           else " (met)" if row["x_gloo"] >= goal else " (not met)")
    cells = [str(row["n"]), case_name(row["case"]), ms(row["ours_s"], ours_missing),
             ms(row["gloo_s"], gloo_missing),
             f"{row['x_gloo']:.2f}x" if row["x_gloo"] is not None else "-",
             f">= {goal:.1f}x{met}" if goal is not None else "",
             gbs(row["ours_busbw"], ours_missing), gbs(row["gloo_busbw"], gloo_missing),
             ms(row["ddp_backward_s"], ""), ms(row["local_backward_s"], ""),
             ms(row["torch_step_s"], ""),
             f"{row['x_with_step']:.2f}x" if row["x_with_step"] is not None else "",
             ms(row["buckets_s"], ""),
             f"{row['x_buckets']:.2f}x" if row["x_buckets"] is not None else "",
             f"{ms(row['ours_cpu_s'], '-')} / {ms(row['gloo_cpu_s'], '-')}",
             f"{busy(row['ours_cpu_s'], row['ours_s'])} / "
             f"{busy(row['gloo_cpu_s'], gloo_wall(row))}", f"{cores_per_rank(row['n']):g}"]
    return "| " + " | ".join(cells) + " |"


# -- result file -----------------------------------------------------------------------------

SUMMARY = ("ctx.all_reduce inside strategy.run and optimizer.apply_gradients (SGD) in python -m "
           "worker tasks under MultiWorkerMirroredStrategy, on shared memory (shm) and the "
           "network path, beside torch.distributed gloo (all_reduce) and DDP-gloo (the time its "
           "bucketed all-reduce adds to a backward pass) in the same run. Slowest rank per "
           "iteration, medians pooled over the rounds.")
RESULT_COLUMNS = tuple(Column(name, unit, 2 if unit or name.startswith("cores") else None)
                       for name, unit in (
    ("N", ""), ("case", ""), ("shm", "ms"), ("network", "ms"), ("gloo/DDP", "ms"),
    ("shm x gloo", "x"), ("network x gloo", "x"), ("shm x (DDP + step)", "x"),
    ("network x (DDP + step)", "x"), ("gloo on DDP's buckets alone", "ms"),
    ("shm x buckets", "x"), ("network x buckets", "x"), ("CPU per call shm", "ms"),
    ("CPU per call network", "ms"), ("CPU per call gloo", "ms"), ("cores busy shm", ""),
    ("cores busy network", ""), ("cores busy gloo", ""), ("cores/rank", "")))
PLOTS = [Plot(title="Time per call, ours on each path beside gloo/DDP", table=0, kind="bar",
              x=("N", "case"), y=("shm", "network", "gloo/DDP"), ylabel="ms")]


def result_table(rows: list[dict]) -> Table:
    """One row per (N, case), both paths side by side (the result file's table)."""
    def ms(t: float | None) -> float | None:
        return round(t * 1e3, 2) if t is not None else None

    def x(v: float | None) -> float | None:
        return round(v, 2) if v is not None else None

    def cores(cpu: float | None, wall: float | None) -> float | None:
        return round(cpu / wall, 2) if cpu is not None and wall else None

    by_key: dict[tuple[int, str], dict[str, dict]] = {}
    for row in rows:
        by_key.setdefault((row["n"], row["case"]), {})[row["path"]] = row
    cells = []
    for (n, case), paths in by_key.items():
        shm, net = paths.get("shm", {}), paths.get("network", {})
        any_row = shm or net
        cells.append((
            n, case_name(case), ms(shm.get("ours_s")), ms(net.get("ours_s")),
            ms(any_row["gloo_s"]), x(shm.get("x_gloo")), x(net.get("x_gloo")),
            x(shm.get("x_with_step")), x(net.get("x_with_step")), ms(any_row["buckets_s"]),
            x(shm.get("x_buckets")), x(net.get("x_buckets")), ms(shm.get("ours_cpu_s")),
            ms(net.get("ours_cpu_s")), ms(any_row["gloo_cpu_s"]),
            cores(shm.get("ours_cpu_s"), shm.get("ours_s")),
            cores(net.get("ours_cpu_s"), net.get("ours_s")),
            cores(any_row["gloo_cpu_s"], gloo_wall(any_row)), cores_per_rank(n)))
    return Table(title="Medians per call", columns=RESULT_COLUMNS, rows=tuple(cells),
                 notes=environment_line())


def result_figures(rows: list[dict]) -> list[Figure]:
    """The index's headline numbers: ``x gloo`` of the largest all-reduce and of every model
    step, per N and path."""
    largest = max((case_bytes(r["case"]) for r in rows if r["case"].startswith("all_reduce")),
                  default=None)
    return [Figure(f"{row['path']} {case_name(row['case'])} N={row['n']}",
                   round(row["x_gloo"], 2), "x")
            for row in rows if row["x_gloo"] is not None
            and (row["case"].startswith("apply_gradients") or row["bytes"] == largest)]


def print_profile(stats_file: Path, top: int = 15) -> None:
    """Rank 0's profile of one call: by cumulative time (the call chain), then by own time
    (where the cycles go)."""
    for order in ("cumulative", "tottime"):
        print(f"\ncProfile of rank 0's call (one), top {top} by {order}:\n")
        pstats.Stats(str(stats_file), stream=sys.stdout).sort_stats(order).print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="2,4", help="comma list of process counts")
    parser.add_argument("--sizes", default="4K,1M,64M", help="all-reduce sizes (comma list)")
    parser.add_argument("--models", default="resnet50,bert-base",
                        help=f"apply_gradients cases (comma list of {', '.join(MODELS)}; "
                             "empty for none)")
    parser.add_argument("--paths", default="shm,network", help="ours: shm, network (comma list)")
    parser.add_argument("--iters", type=int, default=10, help="timed all-reduce iterations")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--model-iters", type=int, default=5, help="timed model steps")
    parser.add_argument("--model-warmup", type=int, default=2)
    parser.add_argument("--no-torch", action="store_true", help="skip the gloo/DDP columns")
    parser.add_argument("--rounds", type=int, default=1,
                        help="interleaved rounds (gloo, then ours per path) pooled per case")
    parser.add_argument("--profile", action="store_true",
                        help="print cProfile of one all-reduce of the largest size, or "
                             "without sizes one apply_gradients step (first N, first path)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per launch")
    parser.add_argument("--json", type=Path,
                        help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    ns = [int(x) for x in args.nprocs.split(",") if x]
    if not ns or min(ns) < 2:
        parser.error("--nprocs: every count must be >= 2 (a strategy across tasks)")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if set(models) - set(MODELS):
        parser.error(f"--models: one of {', '.join(MODELS)}; got {models}")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or set(paths) - set(PATHS):
        parser.error(f"--paths: shm, network; got {paths}")
    if min(args.iters, args.model_iters) < 1 or min(args.warmup, args.model_warmup) < 0:
        parser.error("--iters and --model-iters must be >= 1, the warm-ups >= 0")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    cases = [f"all_reduce:{s}" for s in sizes] + [f"apply_gradients:{m}" for m in models]
    task_argv = ["--sizes", ",".join(map(str, sizes)), "--models", ",".join(models),
                 "--iters", str(args.iters), "--warmup", str(args.warmup),
                 "--model-iters", str(args.model_iters),
                 "--model-warmup", str(args.model_warmup)]
    gloo_state = ("skipped" if args.no_torch
                  else "ok" if torch_version() is not None else "not installed")

    print(machine_line(ns), flush=True)
    print(environment_line(), flush=True)
    rows: list[dict] = []
    profile = None
    with tempfile.TemporaryDirectory(prefix="strategy-bench-") as tmp:
        for n in ns:
            theirs = None
            ours: dict[str, list[dict] | None] = {path: [] for path in paths}
            for _ in range(args.rounds):
                if gloo_state == "ok":
                    theirs = pooled(theirs, bench_torch(
                        n, sizes, models, args.iters, args.warmup, args.model_iters,
                        args.model_warmup, args.timeout))
                for path in paths:
                    extra = []
                    if args.profile and profile is None and (sizes or models):
                        profile = Path(tmp) / "call.prof"
                        extra = ["--profile", str(profile)]
                    if ours[path] is None:
                        continue
                    try:
                        ours[path] = pooled(ours[path],
                                            bench_ours(n, path, task_argv + extra, args.timeout))
                    except BenchError as error:  # one launch failing must not lose the others
                        print(f"{path} at N={n} failed: {error}", file=sys.stderr, flush=True)
                        ours[path] = None
            for path in paths:
                rows += rows_for(n, path, cases, ours[path] or None, theirs, gloo_state)
        for path in paths:
            label = {"shm": "shared memory (default, one host)",
                     "network": "network (CLUSTER_COLLECTIVE_PATH=network)"}[path]
            print(f"\n{label}:\n\n{HEAD}\n|" + "---|" * (HEAD.count("|") - 1))
            for row in rows:
                if row["path"] == path:
                    print(format_row(row))
        # The machine's load moves during a run (other work, our own launches): both ends.
        print("\nload average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        if profile is not None and profile.exists():
            print_profile(profile)
    if args.json:
        write_result(args.json, name=args.json.stem, title="Through the public API",
                     summary=SUMMARY, script="strategy.py",
                     argv=list(sys.argv[1:] if argv is None else argv),
                     tables=[result_table(rows)], figures=result_figures(rows), plots=PLOTS)
    failed = [r for r in rows if r["ours_s"] is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
