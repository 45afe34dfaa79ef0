"""Parameter-server throughput: pull/push MB/s against 1..P ps tasks, and ClusterCoordinator
training steps/s against the number of workers (asynchronous and synchronous), one run.

    uv run python bench/ps.py                                   # the defaults below, ~1-2 min
    uv run python bench/ps.py --sizes 64K,1M,16M --ps 1,2 --iters 10 --skip-train
    uv run python bench/ps.py --workers 1,2,4 --modes async,sync --train-bytes 1M --skip-transfer

Every process is real and fresh: ``python -m ps`` tasks with a cluster token, on loopback.

Transfer: this process is the client (``PsConnections``, as a worker's). A variable of ``size``
bytes (float32) is split in equal shards over ``ps`` tasks (one request per task, concurrently,
as a step does); ``pull`` asks for all of it with ``newer_than=0`` so every byte moves, ``push``
sends a gradient of the same size that the ps applies with SGD (so push includes the update;
from ``STREAM_MIN_BYTES``, 4 MiB, per ps as a ``PushChunks`` stream, as ``PsClient`` does).
MB/s = 10^6 bytes / s of the variable's size; ms = latency of one call; medians of ``--iters``
after ``--warmup``. ``gRPC echo`` rows are the floor: bare grpcio unary calls to a server in
another process that answers a preallocated ``size``-byte reply (pull) or swallows a
``size``-byte request (push), raw bytes, no protobuf, no token, same channel options.

Training: a chief (``bench/_ps_chief.py`` under ``python -m worker``) with a
ParameterServerStrategy and a ClusterCoordinator over ``workers`` serving workers and
``--train-ps`` ps tasks. Each scheduled function (a "step") pulls every variable (about
``--train-bytes`` in four MLP-shaped float32 variables) and pushes as many gradient bytes, so a
step moves 2 x train-bytes. steps/s = functions per second (median of ``--repeats`` runs of
``--steps`` after a warm-up); updates/s counts optimizer applications (sync: one per round of
``workers`` functions, their mean). Every process shares this machine's cores: on a 2-core
machine more workers mostly add contention, which is what the table shows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from bench.allreduce import fmt_size, parse_size  # noqa: E402
from bench.record import Column, Figure, Table, write_result  # noqa: E402
from cluster.ctl.ports import pick_free_ports  # noqa: E402

CHIEF = REPO / "bench" / "_ps_chief.py"
READY = "serving the variable store"
START_SECONDS = 60.0  # a task must be serving this long after it was started
PORT_ATTEMPTS = 3  # clusters started on fresh ports when a chosen port was taken meanwhile
EXIT_ADDRESS_IN_USE = 203  # cluster.exitcodes.EXIT_ADDRESS_IN_USE: a task could not bind
GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL when reaping


# -- processes -------------------------------------------------------------------------------


class PortTaken(RuntimeError):
    """A task exited 203: another process took its port between the choice (``_cluster``) and
    its bind. Choosing ports again helps (:func:`_on_fresh_ports`)."""


def _on_fresh_ports(run, *args):
    """``run(*args)``, started again (up to :data:`PORT_ATTEMPTS` times) while it raises
    :class:`PortTaken`; ``run`` chooses its ports (``_cluster``) each time."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return run(*args)
        except PortTaken as e:
            if attempt == PORT_ATTEMPTS:
                raise
            print(f"  {e}; choosing new ports (attempt {attempt + 1} of {PORT_ATTEMPTS})",
                  file=sys.stderr, flush=True)
    raise AssertionError("unreachable")




class Child:
    """One child process; a thread reads its merged output (last lines kept for errors),
    notes ``marker`` when it appears and a ``RESULT {json}`` line."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str],
                 marker: str | None = None) -> None:
        self.name = name
        self.marker = marker
        self.ready = False
        self.result: dict | None = None
        self.tail: deque[str] = deque(maxlen=40)
        self._settled = threading.Event()  # marker seen, or output closed (process gone)
        self.proc = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.tail.append(line)
            if line.startswith("RESULT "):
                self.result = json.loads(line[len("RESULT "):])
            if self.marker and self.marker in line:
                self.ready = True
                self._settled.set()
        self._settled.set()

    def output(self) -> str:
        return "\n".join(f"  [{self.name}] {line}" for line in self.tail)

    def wait_ready(self, deadline: float) -> None:
        if not self._settled.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"{self.name} not serving after {START_SECONDS:.0f} s:\n"
                               f"{self.output()}")
        if not self.ready:
            try:
                code = self.proc.wait(timeout=GRACE_SECONDS)  # its output ended: it is exiting
            except subprocess.TimeoutExpired:
                code = None
            error = PortTaken if code == EXIT_ADDRESS_IN_USE else RuntimeError
            raise error(f"{self.name} exited (code {code}) before serving:\n{self.output()}")

    def wait_exit(self, deadline: float) -> int:
        try:
            code = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} still running at its deadline:\n"
                               f"{self.output()}") from None
        self._reader.join(timeout=5)  # the rest of its output (its RESULT line)
        return code


class Children:
    """The processes of one measurement: ``with Children() as c: c.start(...)``; on exit,
    however it is left, every one still running gets SIGTERM, then SIGKILL after a grace."""

    def __init__(self) -> None:
        self.children: list[Child] = []

    def start(self, *args, **kwargs) -> Child:
        child = Child(*args, **kwargs)
        self.children.append(child)
        return child

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        alive = [c for c in self.children if c.proc.poll() is None]
        for c in alive:
            c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        for c in alive:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait(timeout=GRACE_SECONDS)
        for c in self.children:
            c._reader.join(timeout=1)
            c.proc.stdout.close()


def _cluster(workers: int, ps: int) -> dict[str, list[str]]:
    ports = iter(pick_free_ports("127.0.0.1", 1 + workers + ps))
    spec = {"chief": [f"127.0.0.1:{next(ports)}"]}
    if workers:
        spec["worker"] = [f"127.0.0.1:{next(ports)}" for _ in range(workers)]
    spec["ps"] = [f"127.0.0.1:{next(ports)}" for _ in range(ps)]
    return spec


def _env(spec: dict, token: str, job: str, index: int,
         tls: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "CLUSTER_TOKEN": token, "PYTHONPATH": str(REPO), **(tls or {}),
            "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": job, "index": index}})}


def _tls_files(directory: Path) -> dict[str, str]:
    """``--tls``: a CA and one certificate for 127.0.0.1 in ``directory``, as CLUSTER_TLS_*."""
    from cluster.ctl.certs import write_host_cert

    write_host_cert(directory, [])
    return {"CLUSTER_TLS_CERT": str(directory / "cluster.pem"),
            "CLUSTER_TLS_KEY": str(directory / "cluster.key"),
            "CLUSTER_TLS_CA": str(directory / "ca.pem")}


def _start_ps(children: Children, spec: dict, token: str,
              tls: dict[str, str] | None = None) -> None:
    started = [children.start(f"ps:{i}", [sys.executable, "-m", "ps"],
                              _env(spec, token, "ps", i, tls), marker=READY)
               for i in range(len(spec["ps"]))]
    deadline = time.monotonic() + START_SECONDS
    for child in started:
        child.wait_ready(deadline)


# -- transfer: pull / push -------------------------------------------------------------------


def _timed(fn, iters: int, warmup: int) -> float:
    times = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_transfer(sizes: list[int], ps_counts: list[int], iters: int, warmup: int,
                   tls: dict[str, str] | None = None
                   ) -> dict[tuple[int, int], tuple[float, float]]:
    """``{(ps, size): (pull seconds, push seconds)}``; ``tls``: CLUSTER_TLS_* for every side."""
    return _on_fresh_ports(_transfer, sizes, ps_counts, iters, warmup, tls)


def _transfer(sizes: list[int], ps_counts: list[int], iters: int, warmup: int,
              tls: dict[str, str] | None = None) -> dict[tuple[int, int], tuple[float, float]]:
    from cluster.ps.connections import PsConnections
    from cluster.ps.store import OptimizerSpec
    from cluster.transport.auth import Token
    from cluster.transport.tls import TlsConfig

    token = os.urandom(16).hex()
    spec = _cluster(0, max(ps_counts))
    out = {}
    with Children() as children:
        _start_ps(children, spec, token, tls)
        tasks = [(f"ps:{i}", address) for i, address in enumerate(spec["ps"])]
        config = tls and TlsConfig.load(cert=tls["CLUSTER_TLS_CERT"],
                                        key=tls["CLUSTER_TLS_KEY"], ca=tls["CLUSTER_TLS_CA"])
        connections = PsConnections(tasks, Token(token, config or None), timeout=120)
        sgd = OptimizerSpec.sgd(0.01)
        try:
            for p in ps_counts:
                for size in sizes:
                    shards = np.array_split(np.ones(size // 4, np.float32), p)
                    names = {ps: f"v{p}_{size}/part_{ps}" for ps in range(p)}
                    for ps, shard in enumerate(shards):
                        connections.create(ps, names[ps], shard, trainable=True)
                    pulls = {ps: [(names[ps], 0)] for ps in range(p)}
                    grads = {ps: {names[ps]: shard} for ps, shard in enumerate(shards)}

                    def pull(pulls=pulls, size=size):
                        got = sum(v.value.nbytes for v in connections.pull(pulls).values())
                        if got != size:
                            raise RuntimeError(f"pulled {got} bytes of a {size}-byte variable")

                    def push(grads=grads):
                        connections.push(grads, optimizer=sgd)

                    out[p, size] = (_timed(pull, iters, warmup), _timed(push, iters, warmup))
        finally:
            connections.close()
    return out


def _echo_server(port: int, ready, stop) -> None:
    """Bare grpcio: ``Down`` answers a preallocated reply of the asked size, ``Up`` swallows."""
    from concurrent import futures

    import grpc

    from cluster.transport.server import SERVER_OPTIONS

    replies: dict[int, bytes] = {}

    def down(request: bytes, context) -> bytes:
        size = int.from_bytes(request, "little")
        return replies.setdefault(size, b"\x01" * size)

    def up(request: bytes, context) -> bytes:
        return b""

    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Down": grpc.unary_unary_rpc_method_handler(down),
        "Up": grpc.unary_unary_rpc_method_handler(up)})
    # The echo has no per-service cap (a task's server sets one per service): any size in.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler],
                         options=(*SERVER_OPTIONS, ("grpc.max_receive_message_length", -1)))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    ready.set()
    stop.wait(3600)
    server.stop(0)


def bench_echo(sizes: list[int], iters: int, warmup: int) -> dict[int, tuple[float, float]]:
    """``{size: (down seconds, up seconds)}`` of bare gRPC unary calls."""
    import grpc

    from cluster.transport.server import CHANNEL_OPTIONS

    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    port = pick_free_ports("127.0.0.1", 1)[0]
    server = ctx.Process(target=_echo_server, args=(port, ready, stop), daemon=True)
    server.start()
    out = {}
    try:
        if not ready.wait(START_SECONDS):
            raise TimeoutError(f"gRPC echo server not serving after {START_SECONDS:.0f} s")
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
            down = channel.unary_unary("/bench.Echo/Down")
            up = channel.unary_unary("/bench.Echo/Up")
            grpc.channel_ready_future(channel).result(timeout=START_SECONDS)
            for size in sizes:
                payload = b"\x01" * size
                ask = size.to_bytes(8, "little")
                out[size] = (_timed(lambda ask=ask: down(ask, timeout=120), iters, warmup),
                             _timed(lambda p=payload: up(p, timeout=120), iters, warmup))
    finally:
        stop.set()
        server.join(GRACE_SECONDS)
        if server.is_alive():
            server.kill()
            server.join(GRACE_SECONDS)
    return out


# -- training: steps/s vs workers ------------------------------------------------------------


def bench_train(workers: int, mode: str, ps: int, train_bytes: int, steps: int, repeats: int,
                timeout: float) -> dict:
    """One fresh cluster (ps tasks, serving workers, the chief); the chief's RESULT."""
    return _on_fresh_ports(_train, workers, mode, ps, train_bytes, steps, repeats, timeout)


def _train(workers: int, mode: str, ps: int, train_bytes: int, steps: int, repeats: int,
           timeout: float) -> dict:
    token = os.urandom(16).hex()
    spec = _cluster(workers, ps)
    with Children() as children:
        _start_ps(children, spec, token)
        for i in range(workers):
            children.start(f"worker:{i}", [sys.executable, "-m", "worker"],
                           _env(spec, token, "worker", i))
        chief = children.start(
            "chief", [sys.executable, "-m", "worker", str(CHIEF), "--mode", mode,
                      "--bytes", str(train_bytes), "--steps", str(steps),
                      "--repeats", str(repeats)],
            _env(spec, token, "chief", 0))
        code = chief.wait_exit(time.monotonic() + timeout)
        taken = [c.name for c in children.children if c.proc.poll() == EXIT_ADDRESS_IN_USE]
        if code != 0 and taken:
            raise PortTaken(f"{', '.join(taken)} could not bind its port (exit 203)")
        if code != 0 or chief.result is None:
            others = "\n".join(c.output() for c in children.children if c is not chief)
            raise RuntimeError(f"training chief ({workers} workers, {mode}) exited with code "
                               f"{code}:\n{chief.output()}\n{others}")
        result = chief.result
    if not np.isclose(result["got"], result["expected"], rtol=1e-3):
        raise RuntimeError(f"training ({workers} workers, {mode}): variable is {result['got']}, "
                           f"expected {result['expected']} after {result['updates']} updates")
    return result


# -- report ----------------------------------------------------------------------------------


def mbps(size: int, seconds: float) -> float:
    return size / seconds / 1e6


def machine_note() -> str:
    import grpc

    return (f"machine: {os.cpu_count()} CPUs ({platform.machine()}, {platform.system()}), "
            f"Python {platform.python_version()}, grpcio {grpc.__version__}, "
            f"numpy {np.__version__}; loopback; every process shares these cores; "
            "MB = 10^6 bytes")


def _csv(text: str, convert=str) -> list:
    return [convert(x.strip()) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64K,1M,16M", help="transfer: comma list of bytes")
    parser.add_argument("--ps", default="1,2", help="transfer: comma list of ps task counts")
    parser.add_argument("--iters", type=int, default=10, help="transfer: timed calls per size")
    parser.add_argument("--warmup", type=int, default=2, help="transfer: untimed calls first")
    parser.add_argument("--no-echo", action="store_true", help="skip the bare gRPC rows")
    parser.add_argument("--tls", action="store_true",
                        help="transfer: also run every size with mutual TLS (docs/guide/"
                             "across-hosts.md, \"Encryption (TLS)\")")
    parser.add_argument("--workers", default="1,2,4", help="training: comma list")
    parser.add_argument("--modes", default="async,sync", help="training: async, sync or both")
    parser.add_argument("--train-ps", type=int, default=1, help="training: ps tasks")
    parser.add_argument("--train-bytes", default="1M", help="training: all variables together")
    parser.add_argument("--steps", type=int, default=40, help="training: functions per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="training: timed repeats")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="training: seconds one chief may run")
    parser.add_argument("--skip-transfer", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--json", type=Path,
                        help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    for mode in _csv(args.modes):
        if mode not in ("async", "sync"):
            parser.error(f"--modes: expected async and/or sync, got {mode!r}")
    # SIGTERM unwinds like Ctrl-C, so every child is reaped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    print(machine_note(), flush=True)
    rows: dict[str, list[dict]] = {"transfer": [], "train": []}

    if not args.skip_transfer:
        sizes = _csv(args.sizes, parse_size)
        ps_counts = _csv(args.ps, int)
        print(f"\n### Pull / push (median of {args.iters}, float32 variable split over the ps "
              "tasks)\n")
        head = "| server | size | pull ms | pull MB/s | push ms | push MB/s |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1), flush=True)
        found = bench_transfer(sizes, ps_counts, args.iters, args.warmup)
        runs = [(f"ps x{p}", {s: found[p, s] for s in sizes}) for p in ps_counts]
        if args.tls:
            with tempfile.TemporaryDirectory() as certs:
                secure = bench_transfer(sizes, ps_counts, args.iters, args.warmup,
                                        _tls_files(Path(certs)))
            runs += [(f"ps x{p} TLS", {s: secure[p, s] for s in sizes}) for p in ps_counts]
        if not args.no_echo:
            runs.append(("gRPC echo", bench_echo(sizes, args.iters, args.warmup)))
        for server, by_size in runs:
            for size in sizes:
                pull, push = by_size[size]
                rows["transfer"].append({"server": server, "bytes": size, "pull_s": pull,
                                         "push_s": push, "pull_mbps": mbps(size, pull),
                                         "push_mbps": mbps(size, push)})
                print(f"| {server} | {fmt_size(size)} | {pull * 1e3:.2f} | "
                      f"{mbps(size, pull):.0f} | {push * 1e3:.2f} | {mbps(size, push):.0f} |",
                      flush=True)

    if not args.skip_train:
        train_bytes = parse_size(args.train_bytes)
        print(f"\n### Training with a ClusterCoordinator ({args.train_ps} ps, "
              f"{fmt_size(train_bytes)} of variables; a step pulls and pushes all of them; "
              f"median of {args.repeats} x {args.steps} steps)\n")
        head = ("| workers | mode | steps/s | ms/step | updates/s | MB/s moved "
                "(pull+push) |")
        print(head)
        print("|" + "---|" * (head.count("|") - 1), flush=True)
        for workers in _csv(args.workers, int):
            for mode in _csv(args.modes):
                r = bench_train(workers, mode, args.train_ps, train_bytes, args.steps,
                                args.repeats, args.timeout)
                rate = r["steps"] / statistics.median(r["seconds"])
                updates = rate / workers if mode == "sync" else rate
                moved = mbps(2 * r["bytes"], 1 / rate)
                rows["train"].append({"workers": workers, "mode": mode, "steps_per_s": rate,
                                      "updates_per_s": updates, "mbps": moved,
                                      "variable_bytes": r["bytes"], "seconds": r["seconds"]})
                print(f"| {workers} | {mode} | {rate:.1f} | {1e3 / rate:.1f} | "
                      f"{updates:.1f} | {moved:.0f} |", flush=True)
    if args.json and (rows["transfer"] or rows["train"]):
        tables = ([transfer_table(rows["transfer"])] if rows["transfer"] else []) + (
            [train_table(rows["train"])] if rows["train"] else [])
        write_result(args.json, name=args.json.stem, title="Parameter-server pull and push",
                     summary=SUMMARY, script="ps.py",
                     argv=list(sys.argv[1:] if argv is None else argv), tables=tables,
                     figures=transfer_figures(rows["transfer"]))
    return 0


# -- result file -----------------------------------------------------------------------------

SUMMARY = ("Pull and push of one float32 variable split over python -m ps tasks, the benchmark "
           "process as the client (push includes the ps applying SGD), beside bare gRPC unary "
           "calls of the same bytes (the echo); then ClusterCoordinator training steps/s. "
           "x echo is the echo's time over ours.")


def transfer_table(rows: list[dict]) -> Table:
    """One row per (server, size), with ``x echo`` where the echo ran at that size."""
    echo = {r["bytes"]: r for r in rows if r["server"] == "gRPC echo"}

    def ratio(r: dict, key: str) -> float | None:
        mine = echo.get(r["bytes"])
        return round(mine[key] / r[key], 2) if mine and r[key] else None

    columns = (Column("server"), Column("size"), Column("pull", "ms", 2),
               Column("pull rate", "MB/s", 0), Column("push", "ms", 2),
               Column("push rate", "MB/s", 0), Column("pull x echo", "x", 2),
               Column("push x echo", "x", 2))
    return Table(title="Pull and push", columns=columns, rows=tuple(
        (r["server"], fmt_size(r["bytes"]), round(r["pull_s"] * 1e3, 2),
         round(r["pull_mbps"]), round(r["push_s"] * 1e3, 2), round(r["push_mbps"]),
         ratio(r, "pull_s"), ratio(r, "push_s")) for r in rows))


def transfer_figures(rows: list[dict]) -> list[Figure]:
    """``x echo`` of pull and push at the largest size, per ps server."""
    if not rows:
        return []
    table = transfer_table(rows)
    largest = fmt_size(max(r["bytes"] for r in rows))
    return [Figure(f"{row[0]} {what} {largest}", row[table.column(f"{what} x echo")], "x")
            for row in table.rows if row[1] == largest and row[0] != "gRPC echo"
            for what in ("pull", "push") if row[table.column(f"{what} x echo")] is not None]


def train_table(rows: list[dict]) -> Table:
    columns = (Column("workers"), Column("mode"), Column("steps/s", "steps/s", 1),
               Column("step", "ms", 1), Column("updates/s", "", 1),
               Column("moved (pull + push)", "MB/s", 0))
    return Table(title="Training with a ClusterCoordinator", columns=columns, rows=tuple(
        (r["workers"], r["mode"], round(r["steps_per_s"], 1),
         round(1e3 / r["steps_per_s"], 1), round(r["updates_per_s"], 1), round(r["mbps"]))
        for r in rows))


if __name__ == "__main__":
    sys.exit(main())
