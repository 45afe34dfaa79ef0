"""The coordination service under N emulated tasks: load, cost and failure detection, one run.

    uv run python bench/coordination.py                          # N = 64, 1024, 4096; 1 s / 5 s
    uv run python bench/coordination.py --tasks 4096 --interval 2 --timeout 10
    uv run python bench/coordination.py --tasks 64 --window 5 --kill 4 --json out.json

One process hosts the real ``CoordinationService`` on a real ``TaskServer`` (token check,
32-thread pool). ``--procs`` client processes (spawn) emulate the N tasks with ``grpc.aio``:
one channel (one TCP connection) per task, the generated stubs, the token metadata, the real
client's schedule (``bench/_coord_emul.py``). Task ``worker:0`` is the coordinator's own task,
emulated like the others. Phases, each with a deadline (the bench exits non-zero when one
passes, after reaping every process):

1. join: every task (after ``U(0, --ramp)`` s) registers (``wait_for_ready``), then polls every
   ``--join-poll`` s (the real client: 0.1 s) until a reply says no task is unregistered.
   ``join reg`` = until the last Register was answered; ``join all`` = until the last task saw
   an empty ``unregistered`` (what ``wait_for`` blocks on).
2. steady: after ``--warmup`` s, a ``--window`` of s is measured. ``hb/s`` = heartbeats the
   service answered per second (its own count), beside ``N/interval``; coordinator CPU (% of one
   core, ``getrusage`` of its process), RSS (and its growth over the RSS before any task joined,
   per task), threads and file descriptors; reply latency p50/p99 as the emulated clients time
   it (so it includes their own event loop's delay on a loaded machine) and the handler's
   service time p50/p99 in the coordinator; ``fail`` = heartbeat calls that failed.
3. detection: ``--kill`` tasks (never ``worker:0``) stop heartbeating at once (their loops are
   cancelled; a crashed process looks the same to the service). ``declared`` = from the stop
   until the service declared each lost; ``first``/``all`` = until the first / the last
   surviving task heard of it in a heartbeat reply; p50 and max over the stopped tasks. ``false``
   = tasks heard lost that were never stopped (must be 0).

Expected detection (SCALE.md): between ``timeout - interval`` and ``timeout + 1.5 interval``
after the stop, the stop landing anywhere in a task's interval. All processes share this
machine's cores: the clients' own CPU (``clients CPU``) is the emulation's cost, not the
service's, and on a 2-core machine it competes with the coordinator.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._coord_emul import (  # noqa: E402
    ClientWindow,
    CoordinatorSample,
    clients_main,
    coordinator_main,
)
from cluster.transport.coordination import cluster_digest  # noqa: E402

TOKEN = "bench-coordination-token"
START_DEADLINE = 180.0  # s: processes up, channels made (slow on a loaded machine)


class PhaseTimeout(RuntimeError):
    """A phase of the bench passed its deadline; the message names it."""


@dataclass
class Row:
    n: int
    interval: float
    timeout: float
    join_register_s: float
    join_all_s: float
    hb_per_s: float
    expected_per_s: float
    coordinator_cpu_pct: float
    clients_cpu_pct: float
    rss_mib: float
    rss_per_task_kib: float
    threads: int
    fds: int
    latency_p50_ms: float
    latency_p99_ms: float
    service_p50_ms: float
    service_p99_ms: float
    failures: int
    killed: int
    declared_p50_s: float
    declared_max_s: float
    first_p50_s: float
    first_max_s: float
    all_p50_s: float
    all_max_s: float
    unheard: int
    false_lost: int


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _recv(conn, until: float, what: str):
    if not conn.poll(max(0.0, until - time.monotonic())):
        raise PhaseTimeout(f"no answer for {what} by its deadline")
    return conn.recv()


def _gather(conns: list, until: float, tag: str) -> list:
    """One message tagged ``tag`` from every connection, by ``until``."""
    got: dict[int, tuple] = {}
    while len(got) < len(conns):
        left = until - time.monotonic()
        pending = [c for i, c in enumerate(conns) if i not in got]
        ready = wait(pending, timeout=max(0.0, left))
        if not ready:
            raise PhaseTimeout(f"{len(pending)} client processes did not send {tag!r} in time")
        for conn in ready:
            message = conn.recv()
            if message[0] != tag:
                raise RuntimeError(f"expected {tag!r}, got {message[0]!r}")
            got[conns.index(conn)] = message
    return [got[i] for i in range(len(conns))]


def _broadcast(conns: list, message: tuple) -> None:
    for conn in conns:
        conn.send(message)


def run_one(n: int, interval: float, timeout: float, args: argparse.Namespace) -> Row:
    """Measure one cluster of ``n`` tasks; every process is reaped before it returns."""
    ctx = mp.get_context("spawn")
    names = [f"worker:{i}" for i in range(n)]
    me = names[0]
    digest = cluster_digest([(t, f"127.0.0.1:{20000 + i}") for i, t in enumerate(names)])
    procs: list = []
    conns: list = []
    coord_conn = None
    try:
        coord_conn, child = ctx.Pipe()
        coord = ctx.Process(target=coordinator_main, name="coordinator",
                            args=(child, me, names, digest, TOKEN, interval, timeout))
        coord.start()
        child.close()
        procs.append(coord)
        start_until = time.monotonic() + START_DEADLINE
        _, port = _recv(coord_conn, start_until, "the coordinator's port")
        address = f"127.0.0.1:{port}"
        nprocs = max(1, min(args.procs, n))
        for p in range(nprocs):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=clients_main, name=f"clients-{p}",
                args=(child, names[p::nprocs], address, me, digest, TOKEN, interval,
                      args.jitter, args.join_poll, args.ramp, args.spread,
                      args.join_timeout))
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        _gather(conns, start_until, "ready")
        coord_conn.send("stats")
        base: CoordinatorSample = _recv(coord_conn, start_until, "stats")

        # 1. join
        go = time.monotonic()
        _broadcast(conns, ("go",))
        join_until = go + args.join_timeout + 5
        registered = _gather(conns, join_until, "registered")
        joined = _gather(conns, join_until, "joined")
        for tag, results in (("registered", registered), ("joined", joined)):
            short = n - sum(r[1] for r in results)
            errors = [e for r in results for e in r[3]]
            if short:
                raise PhaseTimeout(f"{short} of {n} tasks not {tag} after "
                                   f"{args.join_timeout:g} s (--join-timeout); {errors[:3]}")
        join_register = max(r[2] for r in registered) - go
        join_all = max(r[2] for r in joined) - go

        # 2. steady
        time.sleep(args.warmup)  # a fixed settling time, not a wait for an event
        coord_conn.send("stats")
        c0: CoordinatorSample = _recv(coord_conn, time.monotonic() + 30, "stats")
        t0 = c0.at
        _broadcast(conns, ("mark", t0))
        _gather(conns, time.monotonic() + 30, "mark")
        time.sleep(args.window)
        coord_conn.send("stats")
        c1: CoordinatorSample = _recv(coord_conn, time.monotonic() + 30, "stats")
        t1 = c1.at
        _broadcast(conns, ("mark", t1))
        _gather(conns, time.monotonic() + 30, "mark")
        _broadcast(conns, ("window", t0, t1))
        windows: list[ClientWindow] = [m[1] for m in _gather(conns, time.monotonic() + 30,
                                                              "window")]
        span = t1 - t0
        latencies = [x for w in windows for x in w.latencies_s]
        served = c1.calls.get("Heartbeat", 0) - c0.calls.get("Heartbeat", 0)

        # 3. detection
        killed = [names[i] for i in range(1, n)][:: max(1, (n - 1) // max(1, args.kill))]
        killed = killed[: args.kill]
        per_proc = [[k for k in killed if names.index(k) % nprocs == p] for p in range(nprocs)]
        for conn, mine in zip(conns, per_proc, strict=True):
            conn.send(("stop", mine))
        stopped = [m[1] for m in _gather(conns, time.monotonic() + 30, "stopped")]
        stop_at = {k: stopped[p] for p in range(nprocs) for k in per_proc[p]}
        until = max(stopped) + timeout + 3 * interval + args.detect_slack
        _broadcast(conns, ("detect", killed, until))
        detected = [m[1] for m in _gather(conns, until + 30, "detected")]
        coord_conn.send("stats")
        c2: CoordinatorSample = _recv(coord_conn, time.monotonic() + 30, "stats")
        first, last, unheard = [], [], 0
        for k in killed:
            heard = [d[k] for d in detected]
            if sum(h[0] for h in heard) < sum(h[3] for h in heard):
                unheard += 1
            firsts = [h[1] for h in heard if h[1] is not None]
            lasts = [h[2] for h in heard if h[2] is not None]
            if firsts:
                first.append(min(firsts) - stop_at[k])
            if lasts:
                last.append(max(lasts) - stop_at[k])
        declared = [c2.declared_lost[k] - stop_at[k] for k in killed if k in c2.declared_lost]
        heard_lost = {t for w in windows for t in w.heard_lost}
        heard_lost |= set(c2.declared_lost)
        false_lost = len(heard_lost - set(killed))

        _broadcast(conns, ("quit",))
        coord_conn.send("quit")
        return Row(
            n=n, interval=interval, timeout=timeout,
            join_register_s=join_register, join_all_s=join_all,
            hb_per_s=served / span, expected_per_s=n / interval,
            coordinator_cpu_pct=100 * (c1.cpu_s - c0.cpu_s) / span,
            clients_cpu_pct=100 * sum(w.cpu_s for w in windows) / span,
            rss_mib=c1.rss_kib / 1024, rss_per_task_kib=(c1.rss_kib - base.rss_kib) / n,
            threads=c1.threads, fds=c1.fds,
            latency_p50_ms=1e3 * _pct(latencies, 0.5), latency_p99_ms=1e3 * _pct(latencies, 0.99),
            service_p50_ms=1e3 * _pct(c1.heartbeat_service_s, 0.5),
            service_p99_ms=1e3 * _pct(c1.heartbeat_service_s, 0.99),
            failures=sum(w.failures for w in windows), killed=len(killed),
            declared_p50_s=_pct(declared, 0.5), declared_max_s=max(declared, default=float("nan")),
            first_p50_s=_pct(first, 0.5), first_max_s=max(first, default=float("nan")),
            all_p50_s=_pct(last, 0.5), all_max_s=max(last, default=float("nan")),
            unheard=unheard + len(killed) - len(last), false_lost=false_lost)
    finally:
        _reap(procs)


def _reap(procs: list) -> None:
    """Join every process (5 s each), terminate then kill any still running."""
    until = time.monotonic() + 5
    for proc in procs:
        proc.join(max(0.0, until - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(3)
        if proc.is_alive():
            proc.kill()
            proc.join(3)


def format_rows(rows: list[Row]) -> str:
    head1 = ("| N | interval / timeout | join reg / all | hb/s (N/interval) | coord CPU | "
             "clients CPU | coord RSS (per task) | threads | fds | latency p50 / p99 | "
             "handler p50 / p99 | fail |")
    head2 = ("| N | interval / timeout | killed | declared p50 / max | first p50 / max | "
             "all p50 / max | unheard | false |")
    lines = [head1, "|" + "---|" * (head1.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.interval:g} s / {r.timeout:g} s | {r.join_register_s:.1f} / "
            f"{r.join_all_s:.1f} s | {r.hb_per_s:.0f} ({r.expected_per_s:.0f}) | "
            f"{r.coordinator_cpu_pct:.0f}% | {r.clients_cpu_pct:.0f}% | {r.rss_mib:.0f} MiB "
            f"({r.rss_per_task_kib:.1f} KiB) | {r.threads} | {r.fds} | "
            f"{r.latency_p50_ms:.1f} / {r.latency_p99_ms:.1f} ms | {r.service_p50_ms:.2f} / "
            f"{r.service_p99_ms:.2f} ms | {r.failures} |")
    lines += ["", head2, "|" + "---|" * (head2.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.interval:g} s / {r.timeout:g} s | {r.killed} | "
            f"{r.declared_p50_s:.2f} / {r.declared_max_s:.2f} s | {r.first_p50_s:.2f} / "
            f"{r.first_max_s:.2f} s | {r.all_p50_s:.2f} / {r.all_max_s:.2f} s | {r.unheard} | "
            f"{r.false_lost} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="64,1024,4096", help="N values, comma-separated")
    parser.add_argument("--interval", type=float, default=1.0, help="heartbeat interval (s)")
    parser.add_argument("--timeout", type=float, default=5.0, help="heartbeat timeout (s)")
    parser.add_argument("--procs", type=int, default=4, help="client processes")
    parser.add_argument("--jitter", type=float, default=0.1,
                        help="each sleep is scaled by U(1-j, 1+j); 0: the real client's")
    parser.add_argument("--join-poll", type=float, default=0.1,
                        help="heartbeat period until all joined (the real client's: 0.1 s)")
    parser.add_argument("--ramp", type=float, default=0.0,
                        help="tasks start registering at U(0, ramp) s after go (process starts)")
    parser.add_argument("--spread", action="store_true",
                        help="after joining, wait U(0, interval) once (the real client beats in "
                             "step with every other task from the join on)")
    parser.add_argument("--join-timeout", type=float, default=180.0, help="join deadline (s)")
    parser.add_argument("--warmup", type=float, default=3.0, help="s after join, not measured")
    parser.add_argument("--window", type=float, default=10.0, help="s of steady state measured")
    parser.add_argument("--kill", type=int, default=8, help="tasks stopped for detection")
    parser.add_argument("--detect-slack", type=float, default=10.0,
                        help="s past timeout + 3 intervals to wait for detection")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    for n in (int(x) for x in args.tasks.split(",")):
        print(f"N={n}: interval {args.interval:g} s, timeout {args.timeout:g} s ...",
              file=sys.stderr, flush=True)
        try:
            rows.append(run_one(n, args.interval, args.timeout, args))
        except PhaseTimeout as e:
            print(f"N={n}: {e}", file=sys.stderr)
            if rows:
                print(format_rows(rows))
            return 1
    print(f"cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}, client processes: "
          f"{args.procs}, jitter {args.jitter:g}, join poll {args.join_poll:g} s, ramp "
          f"{args.ramp:g} s, spread {args.spread}, window {args.window:g} s (one run per N)")
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
