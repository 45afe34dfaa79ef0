"""Telling a busy peer from a dead or cut-off one by what its kernel answers.

:func:`~cluster.transport._reachable.answering` (a TCP connect) against: a port nobody listens on
(refused at once), a listener whose accept queue is full (SYNs dropped: what a silent partition
looks like), a process that holds the GIL (its kernel still completes the handshake); and the
:class:`~cluster.transport.control.HeartbeatMonitor`'s verdicts on a silent peer whose host
answers (stalled, then lost after the stall timeout) and whose host does not (lost).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from cluster.errors import PeerUnavailableError
from cluster.transport import _reachable
from cluster.transport._reachable import PROBE_TIMEOUT, answering
from cluster.transport.api import PeerInfo
from cluster.transport.control import SERVICE, ControlService, HeartbeatMonitor
from cluster.transport.server import TaskServer

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(60)

# A process that listens, says its port, then holds the GIL in one C call for 20 s.
_HOLDER = """
import ctypes, socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
ctypes.PyDLL(None).usleep(20_000_000)
"""


@pytest.fixture
def gil_holder() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        _wait_asleep(proc.pid)
        yield port
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


def _wait_asleep(pid: int) -> None:
    """Until the kernel shows ``pid`` sleeping in a sleep call (``wchan``), 5 s at most."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        with open(f"/proc/{pid}/wchan") as f:
            if "sleep" in f.read():
                return
        threading.Event().wait(0.01)
    pytest.fail(f"process {pid} never went to sleep")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_process_holding_the_gil_still_answers_a_dead_port_is_refused_at_once(
        gil_holder) -> None:
    started = time.monotonic()
    found = answering({"busy": f"127.0.0.1:{gil_holder}", "dead": f"127.0.0.1:{_closed_port()}"})
    assert found == {"busy"}
    assert time.monotonic() - started < PROBE_TIMEOUT  # nobody waited for the timeout


def test_a_host_that_drops_connection_attempts_does_not_answer_within_the_timeout() -> None:
    # A full accept queue makes the kernel drop new SYNs silently, like a partition.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        fillers = []
        try:
            for _ in range(3):  # the queue takes one or two; the kernel drops the rest
                s = socket.socket()
                s.settimeout(0.2)
                fillers.append(s)
                if s.connect_ex(address) != 0:
                    break
            else:
                pytest.fail("the accept queue never filled")
            started = time.monotonic()
            assert answering({"cut": f"127.0.0.1:{address[1]}"}, timeout=0.3) == set()
            assert 0.25 < time.monotonic() - started < 2.0
        finally:
            for s in fillers:
                s.close()


def test_a_probe_that_reports_after_the_timeout_still_counts(gil_holder, monkeypatch) -> None:
    # In a loaded process (a starved CPU, a sibling thread in a long C call) a probe's thread
    # may get its turn long after its connect succeeded: the peer answered all the same.
    connects = _reachable._connects

    def late(address: str, timeout: float) -> bool:
        answered = connects(address, timeout)
        time.sleep(PROBE_TIMEOUT + 0.5)
        return answered

    monkeypatch.setattr(_reachable, "_connects", late)
    found = answering({"busy": f"127.0.0.1:{gil_holder}", "dead": f"127.0.0.1:{_closed_port()}"})
    assert found == {"busy"}


def test_a_probe_that_never_reports_does_not_answer_after_the_resolve_bound(monkeypatch) -> None:
    never = threading.Event()  # a name resolver that hangs
    monkeypatch.setattr(_reachable, "_connects", lambda address, timeout: never.wait(30))
    started = time.monotonic()
    try:
        assert answering({"hung": "unresolvable:1"}, timeout=0.2, resolve_bound=0.3) == set()
        assert 0.45 < time.monotonic() - started < 2.0
    finally:
        never.set()


# -- the heartbeat monitor's verdicts on a silent peer ------------------------------------------

class _Silent:
    """A peer whose Control service sends one heartbeat, then nothing (its Python is busy),
    while its server and kernel stay up."""

    def __init__(self) -> None:
        self.server = TaskServer("127.0.0.1:0", TOKEN)
        self.control = ControlService("worker:1", interval=3600)
        self.server.add_handlers(SERVICE, self.control.handlers())
        self.server.start()
        self.peer = PeerInfo(1, "worker:1", self.server.address)
        self.channel = grpc.insecure_channel(self.server.address)
        self.lost: list[tuple[float, PeerUnavailableError]] = []
        self.gone = threading.Event()

    def watch(self, **kwargs) -> HeartbeatMonitor:
        def on_lost(peer, error):
            self.lost.append((time.monotonic(), error))
            self.gone.set()
        monitor = HeartbeatMonitor(PeerInfo(0, "worker:0", "127.0.0.1:1"), [self.peer],
                                   {1: self.channel}, TOKEN, on_lost=on_lost,
                                   on_departed=lambda peer: self.gone.set(), interval=0.2,
                                   timeout=1.0, **kwargs)
        monitor.start()
        return monitor

    def close(self) -> None:
        self.control.stop()
        self.channel.close()
        self.server.stop(0)


@pytest.fixture
def silent() -> Iterator[_Silent]:
    s = _Silent()
    yield s
    s.close()


def test_a_silent_peer_whose_host_answers_is_stalled_then_lost_after_the_stall_timeout(
        silent, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cluster.transport.control")
    started = time.monotonic()
    monitor = silent.watch(stall_timeout=3.0)
    try:
        assert silent.gone.wait(10)
    finally:
        monitor.close()
    at, error = silent.lost[0]
    assert 3.0 <= at - started < 3.0 + 2.0, at - started
    assert "stalled (its host answers) beyond 3 s" in str(error)
    assert any("worker:1" in r.message and "is stalled" in r.message for r in caplog.records)


def test_a_silent_peer_whose_host_does_not_answer_is_lost_after_the_timeout(silent) -> None:
    started = time.monotonic()
    monitor = silent.watch(stall_timeout=60.0, probe=lambda addresses: set())
    try:
        assert silent.gone.wait(10)
    finally:
        monitor.close()
    at, error = silent.lost[0]
    assert 1.0 <= at - started < 1.0 + 2.0, at - started
    assert "no heartbeat for" in str(error) and "does not answer" in str(error)
