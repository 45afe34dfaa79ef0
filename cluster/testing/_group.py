"""Run a function in N real processes that form one gRPC group on loopback: :func:`run_group`.

One fresh interpreter per rank (``spawn``), each with its own task server on ``127.0.0.1:0``;
the parent collects the bound ports, hands every child the full peer list, and gathers one
:class:`RankOutcome` per rank. Every child is reaped before :func:`run_group` returns, whatever
happened (timeouts kill them), so nothing leaks.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from typing import Any

from cluster.deadline import Deadline

__all__ = ["GroupTimeoutError", "RankOutcome", "run_group"]


@dataclass
class RankOutcome:
    """What one rank's process did: a result, an error (type, message, traceback) or a death."""

    rank: int
    exitcode: int | None = None
    result: Any = None
    error_type: str = ""
    error: str = ""
    traceback: str = ""
    elapsed: float | None = None

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and not self.error_type


class GroupTimeoutError(TimeoutError):
    """Some rank neither finished nor died before the deadline; all were killed."""


def _child(rank: int, fn: Callable, args: tuple, conn, env: dict[str, str],
           options: dict[str, Any]) -> None:
    os.environ.update(env)  # a process entry point: fn may read the environment too
    import time

    from cluster import settings as task_settings
    from cluster.settings import TaskSettings
    from cluster.transport.api import PeerInfo
    from cluster.transport.auth import Token
    from cluster.transport.endpoint import CollectiveEndpoint
    from cluster.transport.network import NetworkTransport
    from cluster.transport.server import TaskServer

    settings = TaskSettings.from_env()  # this child's entry point: read once, installed
    task_settings.install(settings)
    token = Token(settings.token)
    task = f"worker:{rank}"
    server = TaskServer("127.0.0.1:0", token)
    endpoint = CollectiveEndpoint.install(server, task, heartbeat_interval=options["hb_interval"])
    server.start()
    conn.send(server.port)
    ports = conn.recv()
    peers = [PeerInfo(r, f"worker:{r}", f"127.0.0.1:{p}") for r, p in enumerate(ports)]
    transport = NetworkTransport(endpoint, rank, peers, token,
                              heartbeat_timeout=options["hb_timeout"],
                              data_plane=settings.data_plane)
    start = time.monotonic()
    try:
        transport.connect(Deadline.after(options["connect_timeout"]))
        result = fn(transport, *args)
        conn.send(("ok", result, time.monotonic() - start))
    except BaseException as e:  # report everything to the parent, then exit non-zero
        conn.send(("error", (type(e).__name__, str(e), traceback.format_exc()),
                   time.monotonic() - start))
        transport.close()
        server.stop(0)
        os._exit(1)
    transport.close()
    server.stop(0.5)


def run_group(
    fn: Callable,
    world_size: int,
    *,
    args: tuple = (),
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    heartbeat_interval: float = 1.0,
    heartbeat_timeout: float = 5.0,
    connect_timeout: float = 30.0,
) -> list[RankOutcome]:
    """Run ``fn(transport, *args)`` on ``world_size`` processes; one outcome per rank.

    One fresh interpreter per rank (``spawn``), each with its own task server on
    ``127.0.0.1:0``; the parent collects the bound ports and hands every child the full peer
    list. ``fn`` must be a module-level function (it is pickled by reference).

    Raises :class:`GroupTimeoutError` (after killing every child) if any rank is still running
    at ``timeout``. Never leaves a child process behind.
    """
    ctx = mp.get_context("spawn")
    deadline = Deadline.after(timeout)
    options = {"hb_interval": heartbeat_interval, "hb_timeout": heartbeat_timeout,
               "connect_timeout": connect_timeout}
    procs, conns = [], []
    outcomes = [RankOutcome(rank=r) for r in range(world_size)]
    try:
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_child, name=f"worker:{rank}",
                               args=(rank, fn, args, child_end, env or {}, options))
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        ports = []
        for rank, conn in enumerate(conns):
            if not conn.poll(deadline.timeout()):
                raise GroupTimeoutError(f"worker:{rank} did not start its server in time")
            ports.append(conn.recv())
        for conn in conns:
            conn.send(ports)
        waiting = {conn: rank for rank, conn in enumerate(conns)}
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(procs)}
        while waiting:
            ready = mp_wait([*waiting, *[p.sentinel for p in procs if p.is_alive()]],
                            timeout=deadline.timeout())
            if not ready:
                names = ", ".join(f"worker:{r}" for r in sorted(waiting.values()))
                raise GroupTimeoutError(f"{names} still running after {timeout} s; killed")
            for item in ready:
                if item in waiting:
                    rank = waiting.pop(item)
                    try:
                        status, payload, elapsed = item.recv()
                    except EOFError:
                        continue  # died without reporting: its exit code tells
                    outcomes[rank].elapsed = elapsed
                    if status == "ok":
                        outcomes[rank].result = payload
                    else:
                        (outcomes[rank].error_type, outcomes[rank].error,
                         outcomes[rank].traceback) = payload
                elif item in sentinels:
                    rank = sentinels[item]
                    conn = conns[rank]
                    if conn in waiting and not conn.poll(0):
                        waiting.pop(conn)  # died before reporting
        for proc in procs:
            proc.join(max(deadline.remaining(), 5.0))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5.0)
        for rank, proc in enumerate(procs):
            outcomes[rank].exitcode = proc.exitcode
        for conn in conns:
            conn.close()
    return outcomes
