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
show medians of ``--repeats`` repeats. One thread per process (``torch.set_num_threads(1)``).
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

from cluster.ctl.ports import pick_free_ports  # noqa: E402
from cluster.testing import TaskProcessError, TaskProcesses, loopback_cluster, tf_config  # noqa: E402

LINE = "TORCH_DDP_BENCH "  # a rank's result line
PATHS = {"ours shm": "auto", "ours network": "network"}


class BenchError(RuntimeError):
    """A rank failed or did not finish in time; names the system, N and the rank."""


# -- one rank ------------------------------------------------------------------------------------

def _loop(step, steps: int, warmup: int, repeats: int) -> list[float]:
    """Seconds of ``steps`` calls of ``step``, per repeat (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        step()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        out.append(time.perf_counter() - start)
    return out


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
        barrier = dist.barrier
    else:
        import cluster
        import cluster.torch

        strategy = cluster.MultiWorkerMirroredStrategy()
        cluster.torch.broadcast_module(model, strategy)
        grads = cluster.torch.DistributedGradients(model, strategy)
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
        barrier = group.barrier
    args = (config["steps"], config["warmup"], config["repeats"])
    barrier()
    times = {"step": _loop(step, *args)}
    barrier()
    times["compute"] = _loop(local, *args)
    barrier()
    return times


# -- the harness ---------------------------------------------------------------------------------

def _collect(system: str, n: int, tasks: list) -> list[dict[str, list[float]]]:
    results = []
    for task in tasks:
        try:
            code, output = task.finish(1200.0)
        except TaskProcessError as error:
            raise BenchError(f"{system} N={n}: {error}") from error
        found = [line for line in output.splitlines() if line.startswith(LINE)]
        if code != 0 or not found:
            raise BenchError(f"{system} N={n}: {task.name} exited {code} without a result:\n"
                             f"{output[-3000:]}")
        results.append(json.loads(found[-1][len(LINE):]))
    return results


def run(system: str, n: int, config: dict) -> list[dict[str, list[float]]]:
    """Per rank ``{"step": [s per repeat], "compute": [...]}`` of N fresh processes."""
    script = str(Path(__file__).resolve())
    with TaskProcesses() as procs:
        if system == "DDP gloo":
            (port,) = pick_free_ports("127.0.0.1", 1)
            tasks = [procs.python(script, "--rank", "ddp", json.dumps(
                dict(config, rank=r, n=n, port=port)), cwd=REPO, name=f"gloo rank {r}")
                for r in range(n)]
        else:
            spec = loopback_cluster(worker=n)
            env = {"CLUSTER_TOKEN": os.urandom(16).hex(),
                   "CLUSTER_COLLECTIVE_PATH": PATHS[system], "OMP_NUM_THREADS": "1",
                   # Importing torch can hold the GIL (and starve the heartbeat thread) for
                   # seconds on a loaded machine: gloo has no heartbeat to lose.
                   "CLUSTER_HEARTBEAT_TIMEOUT": "15"}
            tasks = [procs.python("-m", "worker", script, "--rank", "ours", json.dumps(config),
                                  cwd=REPO, env=env, tf_config=tf_config(spec, "worker", i),
                                  name=f"worker:{i}") for i in range(n)]
        return _collect(system, n, tasks)


def summarize(per_rank: list[dict[str, list[float]]], steps: int) -> dict[str, float]:
    """steps/s (rank 0's repeats: the steps are synchronous) and the split, medians."""
    step = statistics.median(per_rank[0]["step"]) / steps
    compute = max(statistics.median(r["compute"]) for r in per_rank) / steps
    return {"steps_per_s": 1.0 / step, "step_ms": step * 1e3, "compute_ms": compute * 1e3,
            "comm_ms": max(step - compute, 0.0) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="2,3")
    parser.add_argument("--models", default="1M,10M")
    parser.add_argument("--paths", default="shm,network")
    parser.add_argument("--batch", type=int, default=32, help="rows per process")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per repeat")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    systems = [f"ours {p}" for p in args.paths.split(",") if p] + ["DDP gloo"]
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPU(s), batch {args.batch} rows per "
          f"process, medians of {args.repeats} repeats x {args.steps} steps", flush=True)
    header = ("| N | model | system | steps/s | step ms | compute ms | comm ms | "
              "x DDP |\n|---|---|---|---|---|---|---|---|")
    rows, lines = [], [header]
    for n in [int(v) for v in args.nprocs.split(",")]:
        for model in args.models.split(","):
            config = {"model": model, "batch": args.batch, "steps": args.steps,
                      "warmup": args.warmup, "repeats": args.repeats}
            found = {s: summarize(run(s, n, config), args.steps) for s in systems}
            ddp = found["DDP gloo"]["steps_per_s"]
            for system, r in found.items():
                rows.append(dict(r, n=n, model=model, system=system))
                lines.append(f"| {n} | {model} | {system} | {r['steps_per_s']:.2f} | "
                             f"{r['step_ms']:.1f} | {r['compute_ms']:.1f} | {r['comm_ms']:.1f} "
                             f"| {r['steps_per_s'] / ddp:.2f}x |")
                print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        _times = _rank(sys.argv[2], json.loads(sys.argv[3]))
        print(LINE + json.dumps(_times), flush=True)
        sys.exit(0)
    sys.exit(main())
