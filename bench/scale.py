"""Start-up, small all-reduce latency, failure detection and per-task cost against the task count.

    uv run python bench/scale.py                      # N = 8, 16, 32, 64
    uv run python bench/scale.py --nprocs 8,16,32,64,128 --iters 50
    uv run python bench/scale.py --nprocs 64 --path network --no-baseline

For each N: one fresh cluster of ``python -m worker bench/_scale_task.py`` processes (a chief and
N-1 workers on loopback, with a cluster token, started directly as one launcher would), then:

- ``spawn s``: the time to start the N processes (fork + exec each, nothing waited on);
- ``interp s``: N bare interpreters started at once importing what a task imports, until all
  exited: the interpreters' own start on this machine, the floor for the two figures below
  (skipped with ``--no-baseline``);
- ``joined s``: from the first process start until the last task's script began (every task
  registered with the coordinator and awaited its peers); ``1st coll s``: until the last
  task's first all-reduce returned; ``beyond s`` = ``1st coll s`` - ``interp s``;
- ``4 KiB ms``: a 4 KiB float32 SUM all-reduce, each after a barrier, the slowest rank's time
  per iteration, median over ``--iters`` after ``--warmup``;
- ``threads``, ``fds``, ``RSS MiB``: read from /proc while the group is up and idle, for a task
  (``task``: the median over the workers, their max in brackets when it differs) and for the
  coordinator (``coord``: chief:0, which hosts the coordination service);
- ``detect s``: worker:N/2 is SIGKILLed while every task all-reduces in a loop; the time from the
  kill until each survivor's collective raised (median / max), and ``exit s`` until the last
  survivor's process exited.

The tasks' default collective path applies (shared memory between co-located tasks); ``--path
network`` forces the TCP ring / recursive doubling of the network path. Medians are robust to
the noise of a shared 2-core machine; the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import selectors
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.record import (  # noqa: E402
    Column,
    Figure,
    Plot,
    Table,
    cores_per_rank,
    machine_line,
    write_result,
)
from cluster.ctl.ports import ensure_fd_limit, pick_free_ports  # noqa: E402

TASK = Path(__file__).resolve().parent / "_scale_task.py"
IMPORTS = "import numpy, grpc, worker.process, cluster.runtime, cluster.collectives"


class BenchError(Exception):
    """A cluster of the benchmark did not get through a phase; names N and the phase."""


@dataclass
class Task:
    name: str
    proc: subprocess.Popen
    pidfd: int
    buffer: bytes = b""
    lines: list[str] = field(default_factory=list)
    exited: float | None = None  # time.time() of the exit
    code: int | None = None

    def has(self, prefix: str) -> str | None:
        return next((line for line in self.lines if line.startswith(prefix)), None)


class Cluster:
    """N task processes, their output read line by line, their exits seen through pidfds."""

    def __init__(self, n: int, iters: int, warmup: int, env: dict[str, str]) -> None:
        ports = pick_free_ports("127.0.0.1", n)
        addresses = [f"127.0.0.1:{p}" for p in ports]
        spec = {"chief": addresses[:1], "worker": addresses[1:]}
        names = ["chief:0"] + [f"worker:{i}" for i in range(n - 1)]
        self.sel = selectors.DefaultSelector()
        self.tasks: dict[str, Task] = {}
        self.began = time.time()

        def spawn(name: str) -> subprocess.Popen:
            job, index = name.split(":")
            config = {"cluster": spec, "task": {"type": job, "index": int(index)}}
            return subprocess.Popen(
                [sys.executable, "-m", "worker", str(TASK), str(iters), str(warmup)],
                cwd=REPO, env={**env, "TF_CONFIG": json.dumps(config)},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True)

        try:
            # Started 16 at a time, as clusterctl does (cluster/ctl/_attempt.py).
            with ThreadPoolExecutor(16) as pool:
                futures = {name: pool.submit(spawn, name) for name in names}
            errors = [f.exception() for f in futures.values() if f.exception() is not None]
            for name, future in futures.items():
                if future.exception() is not None:
                    continue
                proc = future.result()
                task = Task(name, proc, os.pidfd_open(proc.pid))
                self.tasks[name] = task
                os.set_blocking(proc.stdout.fileno(), False)
                self.sel.register(proc.stdout, selectors.EVENT_READ, ("out", task))
                self.sel.register(task.pidfd, selectors.EVENT_READ, ("exit", task))
            if errors:
                raise errors[0]
        except BaseException:
            self.close()
            raise
        self.spawned = time.time()

    def wait(self, done, deadline: float, phase: str) -> None:
        """Read output and exits until ``done()`` or ``deadline`` (time.monotonic())."""
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stuck = [t.name for t in self.tasks.values() if t.code is None][:8]
                tails = {t.name: t.lines[-3:] for t in self.tasks.values()
                         if t.code not in (None, 0)}
                raise BenchError(f"N={len(self.tasks)}: {phase}: not done in time; running: "
                                 f"{stuck}; failed: {dict(list(tails.items())[:4])}")
            for key, _ in self.sel.select(remaining):
                kind, task = key.data
                if kind == "out":
                    self._read(task)
                else:
                    task.exited = time.time()
                    self.sel.unregister(task.pidfd)
                    task.code = task.proc.wait(timeout=10)

    def _read(self, task: Task) -> None:
        try:
            chunk = os.read(task.proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.sel.unregister(task.proc.stdout)
            return
        task.buffer += chunk
        *complete, task.buffer = task.buffer.split(b"\n")
        task.lines += [line.decode(errors="replace") for line in complete]

    def all_have(self, prefix: str):
        def done() -> bool:
            failed = [t for t in self.tasks.values() if t.code is not None and not t.has(prefix)]
            if failed:
                raise BenchError(f"N={len(self.tasks)}: {failed[0].name} exited {failed[0].code} "
                                 f"before {prefix!r}: {failed[0].lines[-5:]}")
            return all(t.has(prefix) for t in self.tasks.values())
        return done

    def close(self) -> None:
        for task in self.tasks.values():
            if task.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(task.proc.pid, signal.SIGKILL)
        for task in self.tasks.values():
            task.proc.wait(timeout=30)
            for f in (task.proc.stdin, task.proc.stdout):
                with contextlib.suppress(OSError):
                    f.close()
            with contextlib.suppress(OSError):
                os.close(task.pidfd)
        self.sel.close()


def proc_usage(pid: int) -> tuple[int, int, float]:
    """(threads, open file descriptors, RSS MiB) of a live process."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    threads = int(fields["Threads"])
    rss = int(fields["VmRSS"].split()[0]) / 1024
    return threads, len(os.listdir(f"/proc/{pid}/fd")), rss


def interpreters(n: int, env: dict[str, str], timeout: float) -> float:
    """Seconds for ``n`` interpreters started at once to import what a task imports and exit."""
    began = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", IMPORTS], cwd=REPO, env=env,
                              stdin=subprocess.DEVNULL, start_new_session=True)
             for _ in range(n)]
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, timeout - (time.monotonic() - began)))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return time.monotonic() - began


def _spread(values: list[float], fmt: str) -> str:
    mid, top = statistics.median(values), max(values)
    text = format(mid, fmt)
    return text if format(top, fmt) == text else f"{text} ({format(top, fmt)})"


def bench(n: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    row: dict[str, str] = {"N": str(n), "cores/rank": f"{cores_per_rank(n):g}"}
    interp = None if args.no_baseline else interpreters(n, env, args.timeout)
    group = Cluster(n, args.iters, args.warmup, env)
    try:
        deadline = time.monotonic() + args.timeout
        group.wait(group.all_have("UP"), deadline, "start-up and the latency loop")
        stats = {t.name: json.loads(t.has("SCALE ").split(" ", 1)[1])
                 for t in group.tasks.values()}
        usage = {name: proc_usage(t.proc.pid) for name, t in group.tasks.items()}
        inexact = sorted(name for name, s in stats.items() if not s.get("exact"))
        if inexact:
            raise RuntimeError(f"N={n}: all-reduce results not exact on {', '.join(inexact)}")
        joined = max(s["script"] for s in stats.values()) - group.began
        first = max(s["first"] for s in stats.values()) - group.began
        slowest = [max(s["lat"][i] for s in stats.values()) for i in range(args.iters)]
        workers = [u for name, u in usage.items() if name != "chief:0"]
        coord = usage["chief:0"]
        row.update({
            "spawn s": f"{group.spawned - group.began:.2f}",
            "interp s": "-" if interp is None else f"{interp:.1f}",
            "joined s": f"{joined:.1f}",
            "1st coll s": f"{first:.1f}",
            "beyond s": "-" if interp is None else f"{first - interp:.1f}",
            "4 KiB ms": f"{statistics.median(slowest) * 1e3:.2f}",
            "threads task": _spread([u[0] for u in workers], "d"),
            "threads coord": str(coord[0]),
            "fds task": _spread([u[1] for u in workers], "d"),
            "fds coord": str(coord[1]),
            "RSS MiB task": _spread([u[2] for u in workers], ".0f"),
            "RSS MiB coord": f"{coord[2]:.0f}",
        })
        for t in group.tasks.values():
            t.proc.stdin.write(b"go\n")
            t.proc.stdin.flush()
        group.wait(group.all_have("LOOP"), time.monotonic() + 60, "the all-reduce loop")
        victim = group.tasks[f"worker:{n // 2}"]
        killed = time.time()
        os.kill(victim.proc.pid, signal.SIGKILL)
        group.wait(lambda: all(t.code is not None for t in group.tasks.values()),
                   time.monotonic() + 60, "every survivor's exit after the SIGKILL")
        survivors = [t for t in group.tasks.values() if t is not victim]
        detected = []
        for t in survivors:
            line = t.has("FAILED ")
            detected.append(float(line.split()[1]) - killed if line else t.exited - killed)
        row["detect s"] = (f"{statistics.median(detected):.2f} / {max(detected):.2f}")
        row["exit s"] = f"{max(t.exited for t in survivors) - killed:.2f}"
    finally:
        group.close()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="8,16,32,64", help="comma list of task counts")
    parser.add_argument("--iters", type=int, default=30, help="timed 4 KiB all-reduces")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--path", default="auto", choices=["auto", "network"],
                        help="CLUSTER_COLLECTIVE_PATH of the tasks")
    parser.add_argument("--heartbeat-timeout", type=float,
                        help="CLUSTER_HEARTBEAT_TIMEOUT of the tasks (default: theirs, 5 s)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip timing bare interpreters (the interp s column)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds each cluster may take to start and measure")
    parser.add_argument("--json", type=Path,
                        help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.nprocs.split(",")]
    ensure_fd_limit(4 * max(counts), f"benchmarking {max(counts)} tasks")
    env = {**os.environ, "CLUSTER_TOKEN": secrets.token_urlsafe(32), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "CLUSTER_CONNECT_TIMEOUT": f"{args.timeout:g}",
           "CLUSTER_COLLECTIVE_PATH": args.path}
    if args.heartbeat_timeout:
        env["CLUSTER_HEARTBEAT_TIMEOUT"] = f"{args.heartbeat_timeout:g}"
    rows = []
    for n in counts:
        load = os.getloadavg()[0]
        rows.append(bench(n, args, env))
        rows[-1]["load before"] = f"{load:.1f}"
        print(f"N={n}: {rows[-1]}", file=sys.stderr, flush=True)
    columns = list(rows[0])
    print("\n" + machine_line(counts))
    print(f"path {args.path}, {args.iters} iterations after {args.warmup} warm-up; "
          f"load average at the end {os.getloadavg()[0]:.1f}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row.get(c, "-") for c in columns) + " |")
    if args.json:
        write_result(args.json, name=args.json.stem, title="Scale", summary=SUMMARY,
                     script="scale.py", argv=list(sys.argv[1:] if argv is None else argv),
                     tables=[result_table(rows)], figures=result_figures(rows),
                     plots=[Plot(title="Start-up against N", table=0, kind="line", x=("N",),
                                 y=("interp", "joined", "1st coll"), ylabel="s")])
    return 0


# -- result file -----------------------------------------------------------------------------

SUMMARY = ("Start-up, a 4 KiB all-reduce, failure detection after a SIGKILL, and each task's "
           "threads, open files and memory against the number of python -m worker tasks; each "
           "N a fresh cluster started 16 tasks at a time.")
# The printed columns carry their unit in the name; the result file names the unit apart.
RESULT_COLUMNS = (("N", "N", ""), ("cores/rank", "cores/rank", ""), ("spawn s", "spawn", "s"),
                  ("interp s", "interp", "s"),
                  ("joined s", "joined", "s"), ("1st coll s", "1st coll", "s"),
                  ("beyond s", "beyond", "s"), ("4 KiB ms", "4 KiB", "ms"),
                  ("threads task", "threads task", ""), ("threads coord", "threads coord", ""),
                  ("fds task", "fds task", ""), ("fds coord", "fds coord", ""),
                  ("RSS MiB task", "RSS task", "MiB"), ("RSS MiB coord", "RSS coord", "MiB"),
                  ("detect s", "detect median / max", "s"), ("exit s", "exit", "s"),
                  ("load before", "load before", ""))


def _number_or_text(text: str) -> int | float | str | None:
    """A printed cell as a number where it is one ("12" -> 12, "0.07" -> 0.07), else as
    printed ("12 (14)": the median and the top; "-": not measured -> None)."""
    if text == "-":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def result_table(rows: list[dict[str, str]]) -> Table:
    return Table(title="One run per N",
                 columns=tuple(Column(name, unit) for _, name, unit in RESULT_COLUMNS),
                 rows=tuple(tuple(_number_or_text(row.get(key, "-"))
                                  for key, _, _ in RESULT_COLUMNS) for row in rows))


def result_figures(rows: list[dict[str, str]]) -> list[Figure]:
    """The largest N's start-up beyond bare interpreters and its task's memory."""
    table = result_table(rows)
    last = table.rows[-1]
    n = last[table.column("N")]
    return [Figure(f"{name} at N={n}", last[table.column(name)], unit)
            for name, unit in (("beyond", "s"), ("RSS task", "MiB"))
            if isinstance(last[table.column(name)], int | float)]


if __name__ == "__main__":
    sys.exit(main())
