"""GPU values through the host paths against NumPy: two tasks sharing one GPU, both paths.

    uv run python bench/gpu_staging.py                          # 4 KiB, 1 MiB, 64 MiB
    uv run python bench/gpu_staging.py --sizes 64M --iters 5 --json bench/results/gpu-staging.json

Two fresh processes on loopback, both on GPU 0 (the layout of two tasks sharing a GPU: no NCCL
between them), all-reduce (float32 SUM) through the public API (``CollectiveGroup``): NumPy
arrays, CuPy arrays and, when torch sees CUDA, torch CUDA tensors, on the shared-memory path
(``CLUSTER_COLLECTIVE_PATH=auto``) and on the network path (``network``). GPU values are staged
through pinned, reused host buffers (``cluster._staging``); ``x numpy`` is the GPU value's time
over NumPy's (1.00: staging costs nothing; the target at 64 MiB is 1.15 or less).

Every iteration starts after a barrier; its time is the slowest rank's; the table shows the
median over ``--iters`` iterations after ``--warmup``. Every rank checks that each GPU result
holds exactly the bytes of its NumPy result (same inputs, same algorithm), and the ranks'
results are compared byte for byte (a digest each). A second table times the copies themselves
on one process: ``.get()`` into fresh pageable memory, and the staging's pinned copies.

Without a GPU (CuPy missing, or no CUDA device) it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.allreduce import fmt_size, parse_size  # noqa: E402
from bench.record import Column, Figure, Table, write_result  # noqa: E402
from cluster.testing import run_group  # noqa: E402

PATHS = {"shm": "auto", "network": "network"}
TARGET = 1.15


def gpu_missing() -> str | None:
    """Why this machine cannot run the benchmark, or ``None``. Never raises."""
    try:
        import cupy
    except ImportError:
        return ("CuPy is not installed (uv sync --inexact --extra gpu: CUDA 12 and 13 drivers; "
                "--extra gpu-cuda13 for CUDA 13 builds)")
    except Exception as e:  # a broken CUDA install can fail CuPy's import with any error
        return f"CuPy cannot be imported: {e!r}"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver / no device: CuPy raises its own runtime error types
        return f"CuPy sees no CUDA device: {e}"
    return None if count else "CuPy sees no CUDA device"


def torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# -- one rank ----------------------------------------------------------------------------------


def _rank(transport, sizes: list[int], iters: int, warmup: int, families: list[str]) -> dict:
    """``{"times": {family: {size: [s, ...]}}, "digests": {family: {size: hex}}}``."""
    import cupy

    from cluster.collectives import CollectiveGroup, ReduceOp
    from cluster.settings import TaskSettings

    cupy.cuda.Device(0).use()
    settings = TaskSettings.from_env().collectives  # CLUSTER_COLLECTIVE_PATH, as a task reads it
    group = CollectiveGroup(transport, name="bench", settings=settings)
    group.barrier()
    rng = np.random.default_rng(transport.rank)
    times: dict[str, dict[int, list[float]]] = {f: {} for f in families}
    digests: dict[str, dict[int, str]] = {f: {} for f in families}
    for size in sizes:
        values = rng.standard_normal(size // 4).astype(np.float32)
        want = None
        for family in families:
            x = _on(family, values)
            per_iter = []
            for i in range(warmup + iters):
                group.barrier()
                start = time.perf_counter()
                out = group.all_reduce(x, ReduceOp.SUM)
                elapsed = time.perf_counter() - start
                if i >= warmup:
                    per_iter.append(elapsed)
            got = _host_bytes(family, out)
            if want is None:
                want = got  # numpy runs first
            elif got != want:
                raise AssertionError(f"{family} {fmt_size(size)}: not the bytes NumPy's "
                                     "all-reduce gave")
            times[family][size] = per_iter
            digests[family][size] = hashlib.sha256(got).hexdigest()
    group.close()
    return {"times": times, "digests": digests}


def _on(family: str, values: np.ndarray):
    if family == "numpy":
        return values
    if family == "cupy":
        import cupy

        return cupy.asarray(values)
    import torch

    return torch.from_numpy(values).to("cuda:0")


def _host_bytes(family: str, out) -> bytes:
    if family == "numpy":
        return np.ascontiguousarray(out).tobytes()
    if family == "cupy":
        import cupy

        return cupy.asnumpy(out).tobytes()
    return out.cpu().numpy().tobytes()


def bench_path(path: str, sizes: list[int], iters: int, warmup: int,
               families: list[str]) -> dict[str, dict[int, float]]:
    """Medians (slowest rank per iteration) per family and size, two tasks on ``path``."""
    env = {"CLUSTER_TOKEN": os.urandom(16).hex(), "CLUSTER_DATA_PLANE": "tcp",
           "CLUSTER_COLLECTIVE_PATH": PATHS[path]}
    outcomes = run_group(_rank, 2, args=(sizes, iters, warmup, families), timeout=600, env=env)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        summary = "; ".join(f"rank {o.rank}: {(o.traceback or '').strip().splitlines()[-1:]}"
                            for o in failed)
        raise RuntimeError(f"{path}: {len(failed)} rank(s) failed: {summary}")
    results = [o.result for o in outcomes]
    for family in families:
        for size in sizes:
            if len({r["digests"][family][size] for r in results}) != 1:
                raise AssertionError(f"{path} {family} {fmt_size(size)}: the ranks' results "
                                     "differ")
    return {family: {size: statistics.median(max(per) for per in zip(
        *(r["times"][family][size] for r in results), strict=True)) for size in sizes}
        for family in families}


# -- the copies alone --------------------------------------------------------------------------


def bench_copies(sizes: list[int], iters: int) -> list[tuple]:
    """``(size, get ms, pinned d2h ms, pinned h2d ms)`` medians on GPU 0 in this process."""
    import cupy

    from cluster._staging import Staging

    staging = Staging()
    rows = []
    with cupy.cuda.Device(0):
        for size in sizes:
            x = cupy.ones(size // 4, cupy.float32)
            get, d2h, h2d = [], [], []
            for _ in range(iters + 1):
                cupy.cuda.get_current_stream().synchronize()
                start = time.perf_counter()
                x.get()
                get.append(time.perf_counter() - start)
                start = time.perf_counter()
                host = staging.to_host(x)
                d2h.append(time.perf_counter() - start)
                start = time.perf_counter()
                staging.to_device(host, 0)
                h2d.append(time.perf_counter() - start)
                del host
            rows.append((size, *(statistics.median(t[1:]) * 1e3 for t in (get, d2h, h2d))))
    staging.close()
    return rows


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4K,1M,64M", help="comma list")
    parser.add_argument("--paths", default="shm,network", help="comma list: shm, network")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    paths = [p.strip() for p in args.paths.split(",")]
    if set(paths) - set(PATHS):
        parser.error(f"--paths: shm and/or network, got {paths}")
    missing = gpu_missing()
    if missing:
        print(f"gpu_staging: skipped, no GPU here: {missing}", flush=True)
        return 0
    families = ["numpy", "cupy"] + (["torch"] if torch_cuda() else [])
    gpu = [f for f in families if f != "numpy"]
    head = "| path | size | numpy ms |" + "".join(f" {f} ms | {f} x numpy |" for f in gpu)
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    rows = []
    for path in paths:
        medians = bench_path(path, sizes, args.iters, args.warmup, families)
        for size in sizes:
            base = medians["numpy"][size]
            row = [path, fmt_size(size), round(base * 1e3, 2)]
            for f in gpu:
                row += [round(medians[f][size] * 1e3, 2), round(medians[f][size] / base, 2)]
            rows.append(tuple(row))
            print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
    copies = bench_copies(sizes, args.iters)
    print("\n| size | .get() ms | pinned d2h ms | pinned h2d ms |\n|---|---|---|---|")
    for size, get, d2h, h2d in copies:
        print(f"| {fmt_size(size)} | {get:.2f} | {d2h:.2f} | {h2d:.2f} |", flush=True)
    largest = max(sizes)
    verdicts = [(row[0], f, row[4 + 2 * i]) for row in rows if row[1] == fmt_size(largest)
                for i, f in enumerate(gpu)]
    for path, family, ratio in verdicts:
        ok = "within" if ratio <= TARGET else "ABOVE"
        print(f"{family} {path} {fmt_size(largest)}: {ratio:.2f}x numpy ({ok} {TARGET}x)")
    if args.json:
        columns = [Column("path"), Column("size"), Column("numpy", "ms", 2)]
        for f in gpu:
            columns += [Column(f, "ms", 2), Column(f"{f} x numpy", "x", 2)]
        tables = [
            Table(title="All-reduce medians, two tasks on one GPU", columns=tuple(columns),
                  rows=tuple(rows)),
            Table(title="Copies alone, one process",
                  columns=(Column("size"), Column(".get()", "ms", 2),
                           Column("pinned d2h", "ms", 2), Column("pinned h2d", "ms", 2)),
                  rows=tuple((fmt_size(s), *(round(v, 2) for v in t)) for s, *t in copies)),
        ]
        write_result(args.json, name=args.json.stem,
                     title="GPU values through the host paths", summary=SUMMARY,
                     script="gpu_staging.py", argv=list(sys.argv[1:] if argv is None else argv),
                     tables=tables,
                     figures=[Figure(f"{f} {p} {fmt_size(largest)} x numpy", r, "x")
                              for p, f, r in verdicts])
    return 0


SUMMARY = ("All-reduce (float32 SUM) of two tasks sharing one GPU, GPU values (staged through "
           "pinned host buffers) against NumPy arrays, on the shared-memory and the network "
           "path. Slowest rank per iteration, median over the timed iterations; x numpy is "
           "the GPU value's time over NumPy's.")


if __name__ == "__main__":
    sys.exit(main())
