"""The host's memory bandwidth with P processes copying at once, and the floor it puts under a
one-host all-reduce.

    uv run python bench/membw.py                          # P = 1, 2, 4, ... up to the cores
    uv run python bench/membw.py --procs 1,8,16 --modes copy,cma --nprocs 2,4,8

At 64 MiB an all-reduce among the ranks of one host runs from memory, not from cache: what bounds
it on a server with a core (or more) per rank is how many bytes it moves through memory, against
what the machine's memory system carries with all its cores busy. This bench measures that roof
and says, per rank count, how fast an all-reduce could be at most.

Modes, each in P fresh processes (``spawn``) that start every iteration together (a barrier) on
arrays of ``--size`` bytes each, touched before timing:

- ``copy``: ``np.copyto(dst, src)``, 2 bytes moved per byte (read and written);
- ``add``: ``np.add(a, b, out=c)``, 3 per byte;
- ``cma``: each process reads part ``k`` of peer ``k``'s array for every ``k`` but its own,
  straight into its own (``process_vm_readv``, :mod:`cluster.collectives.cma`): the all-gather
  of the shared-memory path's single copy, which pins the peer's pages as it goes; 2 bytes per
  byte read. Alone (P = 1) a process reads its own array.

An iteration's time is its slowest process's; the table gives the median, and the bandwidth all
P processes move together. The roof is the most that any mode moved at any P. The floor table
gives, per rank count N, the time at the roof of the least traffic any all-reduce of ``--size``
bytes must move, :func:`floor_bytes` (``2 N n``: every input read once, every output written
once, the reduced values kept in cache between), and of what the shared-memory path's single
copy moves,
:func:`single_copy_bytes` (``(3 N - 1) n``: its all-gather reads each reduced segment back from
memory). A measured all-reduce close to its model's time is bound by memory, not by its code.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.allreduce import fmt_size, parse_size  # noqa: E402
from bench.record import Column, Figure, Table, machine_line, write_result  # noqa: E402

__all__ = ["MODES", "Measured", "floor_bytes", "main", "measure", "single_copy_bytes"]

MODES = {"copy": 2, "add": 3, "cma": 2}
"""Each mode and the bytes it moves through memory per byte of its arrays."""

_BARRIER_S = 120.0
"""How long a process waits at a barrier for the others (process start-up included)."""


def floor_bytes(ranks: int, nbytes: int) -> int:
    """The least memory traffic of an all-reduce of ``nbytes`` per rank among ``ranks`` ranks of
    one host, each ending with the result in its own memory: every input read once and every
    output written once. It needs each reduced block kept in cache until every output has it.

    >>> floor_bytes(8, 64 << 20) // (1 << 20)
    1024
    """
    _check(ranks, nbytes)
    return 2 * ranks * nbytes if ranks > 1 else 0


def single_copy_bytes(ranks: int, nbytes: int) -> int:
    """The memory traffic of the shared-memory path's single copy: every input read once and
    each rank's reduced segment written to its output (``N n + n``), then each rank reads the
    other ``N - 1`` segments from their owners' outputs into its own (``2 (N - 1) n``).

    >>> single_copy_bytes(8, 64 << 20) // (1 << 20)
    1472
    """
    _check(ranks, nbytes)
    return (3 * ranks - 1) * nbytes if ranks > 1 else 0


def _check(ranks: int, nbytes: int) -> None:
    if ranks < 1 or nbytes < 0:
        raise ValueError(f"ranks >= 1 and nbytes >= 0, got ranks={ranks} nbytes={nbytes}")


@dataclass(frozen=True)
class Measured:
    """One mode at ``procs`` processes: the median iteration (slowest process) in seconds and
    the bytes all of them moved through memory per iteration."""

    mode: str
    procs: int
    nbytes: int
    seconds: float
    moved: int

    @property
    def gb_per_s(self) -> float:
        return self.moved / self.seconds / 1e9


def _moved(mode: str, procs: int, nbytes: int) -> int:
    """Bytes all ``procs`` processes move per iteration of ``mode``."""
    per = nbytes if mode != "cma" or procs == 1 else nbytes * (procs - 1) // procs
    return MODES[mode] * per * procs


def _process(rank: int, procs: int, mode: str, nbytes: int, iters: int, warmup: int,
             barrier, table, results) -> None:
    """One process of a measurement: its arrays, then ``warmup + iters`` timed iterations, each
    after a barrier; puts ``(rank, seconds per timed iteration)`` on ``results``."""
    import numpy as np

    from cluster.collectives import cma
    from cluster.collectives.schedule import segments

    n = nbytes // 4
    src, dst, other = (np.full(n, rank + 1, np.float32) for _ in range(3))  # every page touched
    table[2 * rank], table[2 * rank + 1] = os.getpid(), src.ctypes.data
    barrier.wait(_BARRIER_S)  # every address is published
    if mode == "cma":
        # (peer, first byte, end byte) of each part read; alone, its own array whole
        reads = [(k, lo * 4, hi * 4) for k, (lo, hi) in enumerate(segments(n, procs))
                 if k != rank or procs == 1]
        pids = {k: table[2 * k] for k, _, _ in reads}
        base = {k: table[2 * k + 1] for k, _, _ in reads}

        def run() -> None:
            for k, lo, hi in reads:
                cma.read(pids[k], [(dst.ctypes.data + lo, base[k] + lo, hi - lo)])
    elif mode == "add":
        def run() -> None:
            np.add(src, other, out=dst)
    else:
        def run() -> None:
            np.copyto(dst, src)
    times = []
    for _ in range(warmup + iters):
        barrier.wait(_BARRIER_S)
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    if mode == "cma":  # what was read is the peers' (each array holds its owner's rank + 1)
        for k, lo, hi in reads:
            got = dst[lo // 4 : hi // 4]
            if not np.all(got == k + 1):
                raise AssertionError(f"process {rank} read {got[:4]} from process {k}, "
                                     f"expected {k + 1}")
    results.put((rank, times[warmup:]))
    barrier.wait(_BARRIER_S)  # peers may still be reading our array until every one is here


def measure(mode: str, procs: int, nbytes: int, iters: int, warmup: int) -> Measured:
    """``mode`` in ``procs`` fresh processes at once; raises ``RuntimeError`` naming the
    process that failed (every process is gone when this returns or raises)."""
    if mode not in MODES:
        raise ValueError(f"mode: one of {', '.join(MODES)}, got {mode!r}")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    table = ctx.Array("Q", 2 * procs, lock=False)
    results = ctx.Queue()
    children = [ctx.Process(target=_process, name=f"membw-{mode}-{rank}", daemon=True,
                            args=(rank, procs, mode, nbytes, iters, warmup, barrier, table,
                                  results))
                for rank in range(procs)]
    for child in children:
        child.start()
    got: dict[int, list[float]] = {}
    deadline = time.monotonic() + _BARRIER_S * 2 + iters + warmup
    try:
        while len(got) < procs:
            dead = [c for c in children if c.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited {dead[0].exitcode} ({mode}, P={procs})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode} at P={procs}: no result after {_BARRIER_S * 2:.0f} s")
            try:
                rank, times = results.get(timeout=0.5)
            except Exception:  # queue.Empty: look at the children again
                continue
            got[rank] = times
        for child in children:
            child.join(timeout=_BARRIER_S)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(timeout=10)
    slowest = [max(got[r][i] for r in range(procs)) for i in range(iters)]
    return Measured(mode, procs, nbytes, statistics.median(slowest), _moved(mode, procs, nbytes))


def _ints(text: str, option: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{option}: a comma list of integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{option}: integers from 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = os.cpu_count() or 1
    default_procs = ",".join(str(1 << i) for i in range(cores.bit_length())
                             if 1 << i <= cores)
    parser.add_argument("--procs", default=default_procs,
                        help="comma list of process counts (default: powers of two up to the "
                             "cores)")
    parser.add_argument("--modes", default="copy,add,cma", help="comma list: copy, add, cma")
    parser.add_argument("--size", default="64M", help="bytes per array (K, M, G suffixes)")
    parser.add_argument("--nprocs", default="2,4,8",
                        help="rank counts of the floor table (comma list, from 2)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    procs = _ints(args.procs, "--procs", parser)
    ranks = _ints(args.nprocs, "--nprocs", parser)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: one or more of {', '.join(MODES)}, got {args.modes!r}")
    if min(ranks) < 2:
        parser.error(f"--nprocs: rank counts from 2, got {args.nprocs!r}")
    try:
        nbytes = parse_size(args.size)
    except ValueError:
        parser.error(f"--size: a byte count such as 64M, got {args.size!r}")
    if nbytes < 64 * max(procs) or args.iters < 1 or args.warmup < 0:
        parser.error("--size at least 64 bytes per process, --iters from 1, --warmup from 0")

    print(machine_line())
    print()
    print(f"| P | mode | ms | GB/s moved, all | GB/s moved, per process |  ({fmt_size(nbytes)} "
          "per array)")
    print("|---|---|---|---|---|")
    measured = []
    for mode in modes:
        for p in procs:
            m = measure(mode, p, nbytes, args.iters, args.warmup)
            measured.append(m)
            print(f"| {p} | {mode} | {m.seconds * 1e3:.2f} | {m.gb_per_s:.1f} | "
                  f"{m.gb_per_s / p:.1f} |", flush=True)
    roof = max(measured, key=lambda m: m.gb_per_s)
    print()
    print(f"floor of a {fmt_size(nbytes)} all-reduce at the roof ({roof.gb_per_s:.1f} GB/s, "
          f"{roof.mode} at P={roof.procs}):")
    print()
    print("| N | least traffic MiB | floor ms | single copy MiB | single copy at the roof ms |")
    print("|---|---|---|---|---|")
    floors = []
    for n in ranks:
        least, ours = floor_bytes(n, nbytes), single_copy_bytes(n, nbytes)
        floors.append((n, least >> 20, round(least / roof.gb_per_s / 1e6, 2), ours >> 20,
                       round(ours / roof.gb_per_s / 1e6, 2)))
        print("| " + " | ".join(str(v) for v in floors[-1]) + " |")
    if args.json:
        tables = [
            Table(title="Memory bandwidth, all processes at once",
                  columns=(Column("P"), Column("mode"), Column("time", "ms", 2),
                           Column("moved, all", "GB/s", 1),
                           Column("moved, per process", "GB/s", 1)),
                  rows=tuple((m.procs, m.mode, round(m.seconds * 1e3, 3), round(m.gb_per_s, 2),
                              round(m.gb_per_s / m.procs, 2)) for m in measured)),
            Table(title=f"Floor of a {fmt_size(nbytes)} all-reduce at the roof",
                  columns=(Column("N"), Column("least traffic", "MiB"), Column("floor", "ms", 2),
                           Column("single copy traffic", "MiB"),
                           Column("single copy at the roof", "ms", 2)),
                  rows=tuple(floors),
                  notes=f"roof {roof.gb_per_s:.1f} GB/s: {roof.mode} with {roof.procs} "
                        "processes"),
        ]
        figures = [Figure(f"roof, {roof.mode} with {roof.procs} processes",
                          round(roof.gb_per_s, 1), "GB/s")]
        write_result(args.json, name=args.json.stem, title="Memory bandwidth and the all-reduce "
                     "floor", summary=__doc__.split("\n\n")[0].replace("\n", " "),
                     script="membw.py", argv=argv if argv is not None else sys.argv[1:],
                     tables=tables, figures=figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
