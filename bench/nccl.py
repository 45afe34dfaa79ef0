"""NCCL all-reduce bus bandwidth among this process's GPUs, and host <-> device copy bandwidth.

    uv run python bench/nccl.py                          # every visible GPU; default sizes
    uv run python bench/nccl.py --devices 0,1 --sizes 4K,1M,256M --iters 50

All-reduce: ``cluster.collectives.nccl.all_reduce_devices`` (float32 SUM, one NCCL group over the
GPUs, a new output array, the streams synchronised), as a user calls it, for 4 KiB .. 256 MiB per
GPU. Each row is the median over ``--iters`` iterations after ``--warmup``. algbw = bytes / time;
busbw = algbw * 2(N-1)/N (nccl-tests' convention; 0 with one GPU, where nothing crosses GPUs).

Copies: device-to-host and host-to-device with pinned (``cupy.cuda.alloc_pinned_memory``) and
pageable (plain NumPy) host memory, 1 MiB .. 256 MiB, on GPU ``--devices[0]``, synchronised.

Where CuPy, NCCL or a GPU is missing, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.allreduce import fmt_size, parse_size  # noqa: E402
from cluster.collectives.nccl import NcclComm, all_reduce_devices, available  # noqa: E402

ALL_REDUCE_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"
COPY_SIZES = "1M,4M,16M,64M,256M"


def median_seconds(fn: Callable[[], object], iters: int, warmup: int) -> float:
    """Median wall time of ``fn`` (which must return only once its GPU work is done)."""
    times = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def bench_all_reduce(devices: list[int], sizes: list[int], iters: int, warmup: int) -> None:
    import cupy

    n = len(devices)
    comms = NcclComm.for_devices(devices)
    print(f"\n### NCCL all-reduce, float32 SUM, N = {n} GPU(s) {devices}\n")
    print("| size | time (us) | algbw (GB/s) | busbw (GB/s) |")
    print("|---:|---:|---:|---:|")
    try:
        for size in sizes:
            arrays = []
            for d in devices:
                with cupy.cuda.Device(d):
                    arrays.append(cupy.ones(size // 4, dtype=cupy.float32))
            seconds = median_seconds(lambda a=arrays: all_reduce_devices(comms, a, "SUM"),
                                     iters, warmup)
            out = all_reduce_devices(comms, arrays, "SUM")
            if float(out[0][:1].get()[0]) != n:
                raise RuntimeError(f"wrong all-reduce result at {fmt_size(size)}")
            algbw = size / seconds / 1e9
            busbw = algbw * 2 * (n - 1) / n
            print(f"| {fmt_size(size)} | {seconds * 1e6:.1f} | {algbw:.2f} | {busbw:.2f} |")
            del arrays, out
    finally:
        for comm in comms:
            comm.close()
    if n == 1:
        print("\nOne GPU: busbw is 0 by definition; algbw is NCCL's local copy.")


def copy_rates(size: int, iters: int, warmup: int) -> list[float]:
    """GB/s of D2H pinned, D2H pageable, H2D pinned, H2D pageable copies of ``size`` bytes."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    dev = cupy.zeros(size, dtype=cupy.uint8)
    pinned_mem = cupy.cuda.alloc_pinned_memory(size)  # freed when the array goes
    pinned = np.frombuffer(pinned_mem, dtype=np.uint8, count=size)
    pageable = np.ones(size, dtype=np.uint8)
    copies = [
        lambda: (dev.get(out=pinned), stream.synchronize()),
        lambda: (dev.get(out=pageable), stream.synchronize()),
        lambda: (dev.set(pinned), stream.synchronize()),
        lambda: (dev.set(pageable), stream.synchronize()),
    ]
    return [size / median_seconds(copy, iters, warmup) / 1e9 for copy in copies]


def bench_copies(device: int, sizes: list[int], iters: int, warmup: int) -> None:
    import cupy

    print(f"\n### Host <-> device copies, GPU {device}\n")
    print("| size | D2H pinned (GB/s) | D2H pageable (GB/s) | H2D pinned (GB/s) "
          "| H2D pageable (GB/s) |")
    print("|---:|---:|---:|---:|---:|")
    with cupy.cuda.Device(device):
        for size in sizes:
            rates = copy_rates(size, iters, warmup)
            print(f"| {fmt_size(size)} | " + " | ".join(f"{r:.2f}" for r in rates) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", help="comma list of GPU ids (default: every visible GPU)")
    parser.add_argument("--sizes", default=ALL_REDUCE_SIZES, help="all-reduce sizes per GPU")
    parser.add_argument("--copy-sizes", default=COPY_SIZES, help="host <-> device copy sizes")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    if not available():
        print("bench/nccl.py: nothing to measure here: CuPy with NCCL and a visible GPU are "
              "needed (pip install 'cluster-runtime[gpu]' plus NCCL).")
        return 0
    import cupy

    count = int(cupy.cuda.runtime.getDeviceCount())
    devices = ([int(d) for d in args.devices.split(",")] if args.devices
               else list(range(count)))
    names = {d: cupy.cuda.runtime.getDeviceProperties(d)["name"] for d in devices}
    print("## cluster-runtime NCCL benchmark")
    print("\n" + ", ".join(f"GPU {d}: {n.decode() if isinstance(n, bytes) else n}"
                           for d, n in names.items()))
    bench_all_reduce(devices, [parse_size(s) for s in args.sizes.split(",")], args.iters,
                     args.warmup)
    bench_copies(devices[0], [parse_size(s) for s in args.copy_sizes.split(",")], args.iters,
                 args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
