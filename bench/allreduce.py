"""All-reduce bus bandwidth: cluster-runtime's paths beside torch.distributed gloo, one run.

    uv run python bench/allreduce.py                       # N = 2, 3, 4; 4 KiB .. 256 MiB
    uv run python bench/allreduce.py --nprocs 2,4 --sizes 4K,64M --iters 20
    uv run python bench/allreduce.py --paths shm,tcp,grpc  # every path we have
    uv run python bench/allreduce.py --paths tcp --lanes auto,1,2  # the network ring's lanes
    uv run python bench/allreduce.py --nprocs 8,16,32 --sizes 4K --paths tcp \
        --algorithms doubling,tree,ring --no-gloo          # small messages at larger N
    uv run python bench/allreduce.py --nprocs 8,16,32,64,128 --sizes 4K --paths threads \
        --algorithms doubling,tree,ring --no-gloo          # large N in one process
    sudo uv run python bench/allreduce.py --nprocs 4 --netns-hosts 2   # + 2 emulated hosts

Each N is one launch of N fresh processes on loopback per library and path, all with a cluster
token, as in production. Our paths: ``shm`` (the default: co-located processes reduce through
shared memory), ``tcp`` (``CLUSTER_COLLECTIVE_PATH=network``: the network algorithms on the
raw TCP data plane), ``grpc`` (the network path with tensor bytes on gRPC streams) and
``threads`` (the network algorithms among N threads of this process over the in-process
transport: no sockets and no process start, so N can reach the hundreds on a small machine;
the threads share the GIL, so its times measure the algorithms' total work, not their
latency). ``--netns-hosts H`` adds a column: the N tasks spread over H emulated hosts (network
namespaces, root only; ``bench/_netns_hosts.py``), each ``python -m worker``, so the all-reduce
is the hierarchical one (shared memory inside a host, the network across the hosts' leaders);
with gloo, a second column runs gloo on the same hosts in the same layout, and the hosts'
column's ``x gloo`` is against that one (both crossing the same links), not loopback gloo.
``--algorithms`` forces the network algorithm (``CLUSTER_COLLECTIVE_ALGORITHM``) on
the network paths, one column each; ``shm`` always runs ``auto``. ``--lanes`` (``auto``, ``1``,
``2``) forces the lanes of the network ring (``CLUSTER_RING_LANES``: one ring, or the data in
two halves on two rings running opposite ways, each on a thread of its own) on ``tcp`` and
``grpc``, one column each; ``shm`` and ``threads`` have no lanes to force. A column is named by
its path and whatever varies: ``tcp``, ``tcp/ring``, ``tcp/1 lane``, ``tcp/ring/2 lanes``.

Every iteration starts after a barrier; its time is the slowest rank's;
the table shows the median over ``--iters`` iterations after ``--warmup`` (with ``--rounds R``,
the median of R such medians, each from fresh processes, the columns alternating).
``CPU ns/B`` is the CPU time of all N rank processes together (every thread,
``time.process_time``) per byte reduced, median over the iterations: it carries from one
machine size to another where wall time does not (N ranks on 2 cores wait for each other's
turns; on 16 they run at once). ``thread CPU ns/B`` is the CPU time of the busiest thread
(every thread of a rank's process: ours, and gloo's own threads in its ranks) per byte reduced:
each thread's CPU time summed over the timed iterations (barriers left out) over their count,
the busiest thread's, the most of any rank. Where every busy thread has a core of its own, it
is the floor of the wall time: work spread over more threads lowers it while the CPU column
stays. On a machine with fewer cores than busy threads (2 cores) the wall time cannot show that
gain, but this figure can, and it carries to a server. A line under the table names each
column's busiest thread at the largest size. Linux only (``bench/_threads.py``): elsewhere it
shows ``-``. The output starts with the machine: cores, CPU model, and cores per rank at each N.
busbw = algbw * 2(N-1)/N (nccl-tests' convention), with algbw = bytes / time. ``x gloo`` is
gloo's time over ours, i.e. our speed relative to gloo's: above 1 we are faster.
A first table gives, per N, the message-count model of :mod:`cluster.collectives.cost`
(latencies on the critical path, messages in all) and the algorithm ``auto`` picks at each size.

gloo needs torch (the ``torch`` extra, never a runtime dependency): ``uv sync --inexact --extra
torch``; without it only our columns are shown.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench._threads import busiest, cpu_between, snapshot  # noqa: E402
from bench._timing import time_all_reduce_cpu  # noqa: E402
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
from cluster.testing import run_group  # noqa: E402

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
LANES = ("auto", "1", "2")
"""``--lanes`` values: ``CLUSTER_RING_LANES`` for the network paths' rank processes."""
LANE_PATHS = ("tcp", "grpc")
"""The paths whose ring runs over TCP connections between processes: ``--lanes`` applies."""


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# -- ours ------------------------------------------------------------------------------------


def _ours_rank(transport, sizes: list[int], iters: int, warmup: int, impl: str,
               plane: str) -> dict:
    from cluster.collectives import (
        CollectiveGroup,
        CommunicationImplementation,
        CommunicationOptions,
    )
    from cluster.settings import TaskSettings

    options = CommunicationOptions(
        timeout_seconds=120,
        implementation=CommunicationImplementation[impl.upper()],
    )
    used = set(transport.data_planes.values())
    if used != {"tcp" if plane == "shm" else plane}:
        raise RuntimeError(f"asked for the {plane} path, got the {used} data plane")
    # The path comes from CLUSTER_COLLECTIVE_PATH, read once here as a task's runtime does.
    settings = TaskSettings.from_env().collectives
    group = CollectiveGroup(transport, name="bench", options=options, settings=settings)
    group.barrier()
    on_one_host = group.topology is not None and group.topology.single_host
    if on_one_host != (plane == "shm"):
        raise RuntimeError(f"asked for the {plane} path, got topology {group.topology}")
    times, threads = {}, {}
    for size in sizes:
        meter = ThreadMeter(group, warmup)
        times.update(time_all_reduce_cpu(meter, [size], iters, warmup, transport.world_size))
        meter.close()
        threads[size] = busiest_per_iteration(meter.cpu, iters)
    return {"times": times, "threads": threads}


class ThreadMeter:
    """A group for :func:`time_all_reduce_cpu` that also sums each thread's CPU time over the
    timed all-reduces (``cpu``, ns by thread id): it snapshots right after each barrier and
    again as the next barrier (or :meth:`close`) begins, all outside the loop's timed window,
    so that neither the barriers nor the snapshots count. The first ``warmup`` calls are left
    out, as the loop leaves them out."""

    def __init__(self, group, warmup: int) -> None:
        self._group = group
        self._warmup = warmup
        self._calls = 0
        self._before = None
        self.cpu: Counter[int] = Counter()

    def barrier(self) -> None:
        self.close()
        self._group.barrier()
        self._before = snapshot()

    def all_reduce(self, value, op):
        self._calls += 1
        return self._group.all_reduce(value, op)

    def close(self) -> None:
        """End the interval the last barrier began (after the call that follows it)."""
        before, self._before = self._before, None
        after = snapshot() if before is not None else None
        if after is not None and self._calls > self._warmup:
            self.cpu.update(cpu_between(before, after))


def busiest_per_iteration(cpu: Counter[int], iters: int) -> tuple[str, float] | None:
    """The name of the thread with the most CPU time in ``cpu`` and its CPU seconds per
    iteration; ``None`` where threads cannot be measured (not Linux)."""
    top = busiest(cpu)
    return None if top is None or not iters else (top.name, top.ns / iters / 1e9)


class Medians(NamedTuple):
    """One column's figures at one size, over the timed iterations: the median of the slowest
    rank's wall seconds, the median of the CPU seconds of all ranks together, and the busiest
    thread's CPU seconds per iteration (its total over their count; the most of any rank's)
    with its name (CPU and thread ``None`` where not measured)."""

    wall: float
    cpu: float | None = None
    thread: float | None = None
    thread_name: str | None = None


Timed = dict[int, Medians]
"""``{size: Medians}``: one column's figures."""


def bench_ours(n: int, sizes: list[int], iters: int, warmup: int, impl: str,
               plane: str, algorithm: str = "auto", lanes: str = "auto") -> Timed:
    if plane == "threads":
        return bench_threads(n, sizes, iters, warmup, impl, algorithm)
    if plane.startswith(("netns", "gloo-netns")):
        from bench._netns_hosts import bench_netns, bench_netns_gloo

        gloo = plane.startswith("gloo-")
        hosts = int(plane.rpartition("netns")[2])
        ranks = (bench_netns_gloo if gloo else bench_netns)(n, hosts, sizes, iters, warmup)
        if ranks is None:
            raise RuntimeError("gloo on netns hosts needs torch: uv sync --inexact --extra torch")
        return _medians_with_cpu([{"times": r, "threads": dict.fromkeys(sizes)} for r in ranks],
                                 sizes)
    env = {"CLUSTER_TOKEN": os.urandom(16).hex(),
           "CLUSTER_DATA_PLANE": "tcp" if plane == "shm" else plane,
           "CLUSTER_COLLECTIVE_PATH": "auto" if plane == "shm" else "network",
           "CLUSTER_COLLECTIVE_ALGORITHM": algorithm}
    if plane in LANE_PATHS:  # set for auto too: a value in this shell's environment must not leak
        env["CLUSTER_RING_LANES"] = lanes
    # N processes share this machine's cores: heartbeats must not time out while they start.
    outcomes = run_group(_ours_rank, n, args=(sizes, iters, warmup, impl, plane), timeout=1800,
                         env=env, heartbeat_timeout=max(5.0, n / 2), connect_timeout=60 + n)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        # The lowest failing rank is not always the first: list every rank's last line.
        summary = "; ".join(f"rank {o.rank}: {(o.traceback or '').strip().splitlines()[-1:]}"
                            for o in failed)
        raise RuntimeError(f"ours ({plane}), N={n}: {len(failed)} rank(s) failed: {summary}")
    return _medians_with_cpu([o.result for o in outcomes], sizes)


def bench_threads(n: int, sizes: list[int], iters: int, warmup: int, impl: str,
                  algorithm: str) -> Timed:
    """The network algorithms among ``n`` threads over the in-process transport (no CPU
    figure: the ranks share one process)."""
    import threading

    from cluster.collectives import (
        CollectiveGroup,
        CommunicationImplementation,
        CommunicationOptions,
    )
    from cluster.collectives.options import Algorithm, CollectivePath, CollectiveSettings
    from cluster.transport.inproc import InProcessHub

    hub = InProcessHub(n)
    options = CommunicationOptions(timeout_seconds=120,
                                   implementation=CommunicationImplementation[impl.upper()])
    settings = CollectiveSettings(path=CollectivePath.NETWORK, algorithm=Algorithm(algorithm))
    groups = [CollectiveGroup(t, name="bench", options=options, settings=settings)
              for t in hub.transports]
    per_rank: list[dict[int, list[float]]] = [{} for _ in range(n)]
    errors: list[BaseException] = []

    def rank_body(rank: int) -> None:
        try:
            timed = time_all_reduce_cpu(groups[rank], sizes, iters, warmup, n)
            per_rank[rank] = {s: [wall for wall, _ in pairs] for s, pairs in timed.items()}
        except BaseException as error:  # reported below, after every thread ended
            errors.append(error)
            for t in hub.transports:  # the others would wait for us until their deadline
                t.abort(f"bench rank {rank} failed: {error!r}")

    threads = [threading.Thread(target=rank_body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"ours (threads), N={n}: {errors[:1] or 'still running after 1800 s'}")
    walls = _slowest_rank_medians(per_rank, sizes)
    return {s: Medians(walls[s]) for s in sizes}


def _slowest_rank_medians(per_rank: list[dict[int, list[float]]], sizes: list[int]) -> dict:
    return {s: statistics.median(max(r[s][i] for r in per_rank) for i in range(len(per_rank[0][s])))
            for s in sizes}


def _medians_with_cpu(per_rank: list[dict], sizes: list[int]) -> Timed:
    """Per size, from every rank's ``{"times": {size: [(wall, CPU), ...]}, "threads": {size:
    (name, seconds per iteration) or None}}``: the median of the slowest rank's wall time and
    the median of the ranks' CPU time summed, over the iterations, and the busiest thread of
    the rank whose busiest thread worked most (``None`` if any rank could not measure it)."""
    out: Timed = {}
    for s in sizes:
        times = [r["times"][s] for r in per_rank]
        iters = range(len(times[0]))
        threads = [r["threads"][s] for r in per_rank]
        name, thread = (max(threads, key=lambda t: t[1]) if None not in threads
                        else (None, None))
        out[s] = Medians(statistics.median(max(t[i][0] for t in times) for i in iters),
                         statistics.median(sum(t[i][1] for t in times) for i in iters),
                         thread, name)
    return out


# -- gloo ------------------------------------------------------------------------------------


def _gloo_rank(rank: int, n: int, port: int, sizes: list[int], iters: int, warmup: int, q) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    times, threads = {}, {}
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32)
        per_iter = []
        by_thread: Counter[int] = Counter()  # gloo's own threads are threads of this process
        for i in range(warmup + iters):
            y = x.clone()
            dist.barrier()
            before = snapshot()
            cpu = time.process_time()
            start = time.perf_counter()
            dist.all_reduce(y, op=dist.ReduceOp.SUM)
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
            after = snapshot()
            if i >= warmup:
                per_iter.append((elapsed, cpu))
                if before is not None and after is not None:
                    by_thread.update(cpu_between(before, after))
        times[size] = per_iter
        threads[size] = busiest_per_iteration(by_thread, iters)
    dist.destroy_process_group()
    q.put((rank, {"times": times, "threads": threads}))


def bench_gloo(n: int, sizes: list[int], iters: int, warmup: int) -> Timed | None:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, n, port, sizes, iters, warmup, q))
             for r in range(n)]
    for p in procs:
        p.start()
    try:
        results = dict(q.get(timeout=1800) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    return _medians_with_cpu([results[r] for r in range(n)], sizes)


# -- report ----------------------------------------------------------------------------------


def busbw(size: int, n: int, seconds: float) -> float:
    return size / seconds * 2 * (n - 1) / n / 1e9 if n > 1 else 0.0


def median_of_rounds(rounds: list[Timed], sizes: list[int]) -> Timed:
    """Per size, the median over ``rounds`` of each one's wall, CPU and thread medians; the
    busiest thread's name is the last round's."""
    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    return {s: Medians(median([r[s].wall for r in rounds]), median([r[s].cpu for r in rounds]),
                       median([r[s].thread for r in rounds]), rounds[-1][s].thread_name)
            for s in sizes}


def per_byte(cpu_seconds: float | None, size: int) -> float | None:
    """CPU nanoseconds per byte reduced (``None`` where not measured)."""
    return cpu_seconds / size * 1e9 if cpu_seconds is not None and size else None


def fmt_cpu(ns_per_byte: float | None) -> str:
    """Three significant digits: 4 KiB calls cost tens of ns/B, 64 MiB ones a fraction."""
    return "-" if ns_per_byte is None else f"{ns_per_byte:.3g}"


def model_table(ns: list[int], sizes: list[int]) -> None:
    """Print the message-count model per N, and what ``auto`` picks per size."""
    from cluster.collectives.cost import ALGORITHMS, latency_steps, messages
    from cluster.collectives.group import DEFAULT_CHUNK_BYTES, DEFAULT_SMALL_MESSAGE_BYTES
    from cluster.collectives.options import CollectiveSettings, CommunicationOptions
    from cluster.collectives.route import network_algorithm

    head = "| N |" + "".join(f" {a} latencies |" for a in ALGORITHMS)
    head += "".join(f" {a} messages |" for a in ALGORITHMS)
    head += "".join(f" auto at {fmt_size(s)} |" for s in sizes)
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for n in ns:
        line = f"| {n} |" + "".join(f" {latency_steps(a, n)} |" for a in ALGORITHMS)
        line += "".join(f" {messages(a, n)} |" for a in ALGORITHMS)
        for size in sizes:
            picked = network_algorithm(
                CollectiveSettings(), CommunicationOptions(), size,
                small_message_bytes=DEFAULT_SMALL_MESSAGE_BYTES, chunk_bytes=DEFAULT_CHUNK_BYTES)
            line += f" {picked.split('/')[0]} |"
        print(line)
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="2,3,4", help="comma list of process counts")
    parser.add_argument("--sizes", default="4K,64K,1M,4M,16M,64M,256M", help="comma list")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="fresh launches per N and column, alternating; the table shows "
                             "the median of the rounds' medians")
    parser.add_argument("--impl", default="auto", choices=["auto", "ring"],
                        help="our algorithm choice on the network paths "
                             "(CommunicationImplementation)")
    parser.add_argument("--paths", default="shm,tcp",
                        help="ours: shm, tcp, grpc, threads (comma list)")
    parser.add_argument("--algorithms", default="auto",
                        help="network algorithms to force on tcp, grpc and threads: auto, "
                             "ring, doubling, tree (comma list, one column each)")
    parser.add_argument("--lanes", default="auto",
                        help="lanes of the network ring to force on tcp and grpc "
                             "(CLUSTER_RING_LANES): auto, 1, 2 (comma list, one column each)")
    parser.add_argument("--netns-hosts", type=int, default=0,
                        help="also run over this many emulated hosts (network namespaces; root)")
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--no-model", action="store_true", help="skip the model table")
    parser.add_argument("--json", type=Path,
                        help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ns = [int(x) for x in args.nprocs.split(",")]
    if min(ns) < 1:
        parser.error("--nprocs: every count must be >= 1")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    planes = [p.strip() for p in args.paths.split(",")]
    unknown = set(planes) - {"shm", "tcp", "grpc", "threads"}
    if unknown:
        parser.error(f"--paths: unknown {sorted(unknown)}")
    algorithms = list(dict.fromkeys(a.strip() for a in args.algorithms.split(",")))
    if set(algorithms) - {"auto", "ring", "doubling", "tree"}:
        parser.error(f"--algorithms: one of auto, ring, doubling, tree; got {algorithms}")
    lanes = list(dict.fromkeys(v.strip() for v in args.lanes.split(",")))
    if set(lanes) - set(LANES):
        parser.error(f"--lanes: one of {', '.join(LANES)} (comma list); got {lanes}")
    names = column_names(planes, algorithms, lanes)
    if args.netns_hosts:
        names[(f"netns{args.netns_hosts}", "auto", "auto")] = f"{args.netns_hosts} netns hosts"
        if not args.no_gloo:
            names[(f"gloo-netns{args.netns_hosts}", "auto", "auto")] = \
                f"gloo on {args.netns_hosts} netns hosts"
    variants = list(names)
    print(machine_line(ns) + "\n", flush=True)
    if not args.no_model:
        model_table(ns, sizes)
    rows = []
    head = ("| N | cores/rank | size | gloo ms | gloo busbw GB/s | gloo CPU ns/B |"
            " gloo thread CPU ns/B |")
    for v in variants:
        head += (f" {names[v]} ms | {names[v]} busbw GB/s | {names[v]} CPU ns/B |"
                 f" {names[v]} thread CPU ns/B | {names[v]} x gloo |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    busiest_lines = []
    for n in ns:
        runs: dict[tuple[str, str, str], list[Timed] | None] = {v: [] for v in variants}
        gloo_runs: list[Timed] = []
        for _ in range(args.rounds):
            for v in variants:
                if runs[v] is None:
                    continue
                p, a, lane = v
                try:
                    runs[v].append(bench_ours(n, sizes, args.iters, args.warmup,
                                              "auto" if p == "shm" else args.impl, p, a, lane))
                except RuntimeError as error:  # one variant failing must not lose the others
                    print(f"{names[v]} at N={n} failed: {error}", file=sys.stderr, flush=True)
                    runs[v] = None
            if not args.no_gloo:
                timed = bench_gloo(n, sizes, args.iters, args.warmup)
                if timed is not None:
                    gloo_runs.append(timed)
        ours = {v: None if r is None else median_of_rounds(r, sizes) for v, r in runs.items()}
        gloo = median_of_rounds(gloo_runs, sizes) if gloo_runs else None
        for size in sizes:
            g, g_cpu, g_thread, _ = gloo[size] if gloo else (None,) * 4
            row = {"n": n, "bytes": size, "gloo_s": g,
                   "gloo_busbw": busbw(size, n, g) if g else None,
                   "gloo_cpu": per_byte(g_cpu, size),
                   "gloo_thread_cpu": per_byte(g_thread, size)}
            line = f"| {n} | {cores_per_rank(n):g} | {fmt_size(size)} | "
            line += (f"{g * 1e3:.2f} | {row['gloo_busbw']:.2f} | {fmt_cpu(row['gloo_cpu'])} |"
                     f" {fmt_cpu(row['gloo_thread_cpu'])} |" if g else "- | - | - | - |")
            for v in variants:
                name = names[v]
                ref = _reference(v, size, g, ours)
                if ours[v] is None:
                    row[f"{name}_s"] = None
                    line += " failed | - | - | - | - |"
                    continue
                t, cpu, thread, _ = ours[v][size]
                row[f"{name}_s"] = t
                row[f"{name}_busbw"] = busbw(size, n, t)
                row[f"{name}_cpu"] = per_byte(cpu, size)
                row[f"{name}_thread_cpu"] = per_byte(thread, size)
                row[f"{name}_ratio"] = ref / t if ref else None
                line += (f" {t * 1e3:.2f} | {busbw(size, n, t):.2f} |"
                         f" {fmt_cpu(row[f'{name}_cpu'])} |"
                         f" {fmt_cpu(row[f'{name}_thread_cpu'])} | ")
                line += f"{ref / t:.2f}x |" if ref else "- |"
            rows.append(row)
            print(line, flush=True)
        busiest_lines.append(busiest_threads_line(n, max(sizes), gloo, ours, names))
    print("\n" + "\n".join(busiest_lines))
    if args.json:
        columns = [names[v] for v in variants]
        title, summary = "Collective layer all-reduce", SUMMARY
        if args.netns_hosts:
            title = f"All-reduce across {args.netns_hosts} emulated hosts"
            summary += HOSTS_SUMMARY.format(hosts=args.netns_hosts)
        write_result(args.json, name=args.json.stem, title=title, summary=summary,
                     script="allreduce.py",
                     argv=list(sys.argv[1:] if argv is None else argv),
                     tables=[result_table(rows, columns)],
                     figures=result_figures(rows, columns), plots=result_plots(columns))
    return 0


def _reference(variant: tuple[str, str, str], size: int, gloo: float | None,
               ours: dict[tuple[str, str, str], Timed | None]) -> float | None:
    """The gloo time a column's ``x gloo`` divides: gloo on the same emulated hosts for the
    hosts' column (None where it failed), none for that gloo column itself, loopback gloo for
    every other."""
    path = variant[0]
    if path.startswith("gloo-netns"):
        return None
    if path.startswith("netns"):
        same = ours.get((f"gloo-{path}", "auto", "auto"))
        return same[size][0] if same else None
    return gloo


def column_names(paths: list[str], algorithms: list[str],
                 lanes: list[str]) -> dict[tuple[str, str, str], str]:
    """One column per (path, algorithm, lanes), in that order, named by its path and by what
    varies among the columns: ``tcp``; ``tcp/ring``; ``tcp/1 lane``; ``tcp/ring/2 lanes``.
    ``shm`` has no network algorithm or lanes to force, ``threads`` no lanes (its ring is
    among threads, not over TCP connections): one column each, ``auto``."""
    names = {}
    for path in paths:
        for algorithm in ["auto"] if path == "shm" else algorithms:
            for lane in lanes if path in LANE_PATHS else ["auto"]:
                parts = [path]
                if len(algorithms) > 1 and path != "shm":
                    parts.append(algorithm)
                if len(lanes) > 1 and path in LANE_PATHS:
                    parts.append("1 lane" if lane == "1" else f"{lane} lanes")
                names[(path, algorithm, lane)] = "/".join(parts)
    return names


def busiest_threads_line(n: int, size: int, gloo: Timed | None, ours: dict[tuple, Timed | None],
                         names: dict[tuple, str]) -> str:
    """Which thread was the busiest, at ``size``, in the rank where it worked most, per column
    (gloo's unnamed C++ threads show their process's name)."""
    found = [("gloo", gloo)] if gloo else []
    found += [(names[v], timed) for v, timed in ours.items() if timed is not None]
    named = [f"{column} {timed[size].thread_name}" for column, timed in found
             if timed[size].thread_name is not None]
    return f"busiest thread at {fmt_size(size)}, N={n}: " + (", ".join(named) or "-")


# -- result file -----------------------------------------------------------------------------

SUMMARY = ("All-reduce (float32 SUM) of the collective layer among N fresh processes on "
           "loopback, beside torch.distributed gloo in the same run. Slowest rank per "
           "iteration, median over the timed iterations; busbw = algbw * 2(N-1)/N; CPU = "
           "the N ranks' process CPU time per byte reduced; thread CPU = the busiest thread's "
           "CPU time per byte reduced, in the rank where it is the most.")


HOSTS_SUMMARY = (" The hosts' columns: the N tasks in contiguous blocks over {hosts} hosts "
                 "emulated with network namespaces on one bridge (each `python -m worker`; "
                 "shared memory inside a host, the network across hosts), and gloo on the same "
                 "hosts in the same layout, which their x gloo divides. The hosts share this "
                 "machine's cores and the bridge is its memory, not a NIC: this measures the "
                 "algorithms and their CPU, not a real link.")


def result_table(rows: list[dict], columns: list[str]) -> Table:
    """One row per (N, size): the cores per rank, gloo, then each of our columns' ms, busbw,
    CPU ns/B, thread CPU ns/B and x gloo."""
    def num(v: float | None, scale: float = 1.0, digits: int = 2) -> float | None:
        return round(v * scale, digits) if v is not None else None

    head = [Column("N"), CORES_PER_RANK, Column("size"), Column("gloo", "ms", 2),
            Column("gloo busbw", "GB/s", 2), Column("gloo CPU", "ns/B", 4),
            Column("gloo thread CPU", "ns/B", 4)]
    for name in columns:
        head += [Column(name, "ms", 2), Column(f"{name} busbw", "GB/s", 2),
                 Column(f"{name} CPU", "ns/B", 4), Column(f"{name} thread CPU", "ns/B", 4),
                 Column(f"{name} x gloo", "x", 2)]
    cells = []
    for row in rows:
        line = [row["n"], cores_per_rank(row["n"]), fmt_size(row["bytes"]),
                num(row["gloo_s"], 1e3), num(row["gloo_busbw"]),
                num(row.get("gloo_cpu"), digits=4), num(row.get("gloo_thread_cpu"), digits=4)]
        for name in columns:
            line += [num(row.get(f"{name}_s"), 1e3), num(row.get(f"{name}_busbw")),
                     num(row.get(f"{name}_cpu"), digits=4),
                     num(row.get(f"{name}_thread_cpu"), digits=4), num(row.get(f"{name}_ratio"))]
        cells.append(tuple(line))
    return Table(title="Medians per all-reduce", columns=tuple(head), rows=tuple(cells))


def result_figures(rows: list[dict], columns: list[str]) -> list[Figure]:
    """``x gloo`` of each of our columns at the largest size, per N."""
    largest = max(row["bytes"] for row in rows)
    return [Figure(f"{name} {fmt_size(largest)} N={row['n']}", round(row[f"{name}_ratio"], 2),
                   "x")
            for row in rows if row["bytes"] == largest for name in columns
            if row.get(f"{name}_ratio") is not None]


def result_plots(columns: list[str]) -> list[Plot]:
    return [Plot(title="Bus bandwidth against size", table=0, kind="line", x=("size",),
                 y=tuple(f"{name} busbw" for name in ["gloo", *columns]), ylabel="busbw GB/s",
                 group="N")]


if __name__ == "__main__":
    sys.exit(main())
