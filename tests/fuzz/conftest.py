"""The fuzz suite's victim process (one per test module) and its budget.

``CLUSTER_FUZZ_EXAMPLES`` sets Hypothesis' ``max_examples`` per fuzz test (default
:data:`DEFAULT_EXAMPLES`, chosen so that ``tests/fuzz`` runs in well under a minute on two busy
cores); raise it to fuzz longer, e.g. ``CLUSTER_FUZZ_EXAMPLES=2000 uv run pytest tests/fuzz``.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from cluster.deadline import Deadline
from cluster.transport._pb import control_pb2
from cluster.transport.api import MessageKey, PeerInfo
from cluster.transport.auth import Token
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.network import NetworkTransport
from cluster.transport.ps_client import PsClient
from cluster.transport.server import TaskServer
from tests.conftest import REPO
from tests.fuzz._victim import GROUP, PAYLOAD, TASKS

__all__ = ["DEFAULT_EXAMPLES", "EXAMPLES", "TOKEN", "Victim", "assert_serves_real_peers", "victim"]

DEFAULT_EXAMPLES = 50
EXAMPLES = int(os.environ.get("CLUSTER_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
TOKEN = Token("fuzz-suite-secret")
# RLIMIT_DATA of the victim: a request that made it allocate without bound dies there (the
# test then fails on its exit) instead of endangering the machine.
VICTIM_DATA_LIMIT = 1 << 30


class Victim:
    """The running ``tests.fuzz._victim`` process, and the test process's own rank 2 of its
    group (``peer``: a lazy transport, so it connects only when a test sends with it)."""

    def __init__(self) -> None:
        self.server = TaskServer("127.0.0.1:0", TOKEN)
        self.endpoint = CollectiveEndpoint.install(self.server, TASKS[2], heartbeat_interval=0.5)
        self.server.start()
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        env = {**os.environ, "CLUSTER_TOKEN": TOKEN.value,
               "FUZZ_PEER_ADDRESS": self.server.address, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            ["prlimit", f"--data={VICTIM_DATA_LIMIT}", sys.executable, "-m", "tests.fuzz._victim"],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.address = self._expect("address", 60)
        self.data_port = int(self._expect("data_port", 10))
        self._expect("ready", 10)
        self.pid = self.proc.pid
        self.rss_before = self.status_mib("VmRSS")  # the bound is on growth from here
        self.peer = NetworkTransport(self.endpoint, 2, [
            PeerInfo(0, TASKS[0], self.address), PeerInfo(1, TASKS[1], "127.0.0.1:1"),
            PeerInfo(2, TASKS[2], self.server.address), PeerInfo(3, TASKS[3], "127.0.0.1:1"),
        ], TOKEN, data_plane="tcp", lazy=True)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line.rstrip("\n"))

    def _next(self, timeout: float) -> str:
        deadline = Deadline.after(timeout)
        while True:
            try:
                return self.lines.get(timeout=max(deadline.remaining(), 0.01))
            except queue.Empty:
                raise AssertionError(f"victim said nothing for {timeout} s; exit "
                                     f"{self.proc.poll()}; output:\n{self.log}") from None

    def _expect(self, word: str, timeout: float) -> str:
        """The rest of the next stdout line starting with ``word`` (log lines skipped)."""
        deadline = Deadline.after(timeout)
        while True:
            line = self._next(max(deadline.remaining(), 0.01))
            if line.split(" ", 1)[0] == word:
                return line[len(word):].strip()

    def assert_healthy(self) -> None:
        """Alive, and no handler or thread of it died with an exception (gRPC logs one that
        escapes a handler; Python prints one that ends a thread)."""
        assert self.proc.poll() is None, f"victim exited {self.proc.poll()}:\n{self.log}"
        text = "".join(self.output)
        assert "Traceback" not in text and "Exception calling application" not in text, text

    @property
    def log(self) -> str:
        return "".join(self.output[-60:])

    def command(self, line: str, timeout: float = 60) -> str:
        """Send one command (see ``tests.fuzz._victim``); returns its answer line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        deadline = Deadline.after(timeout)
        while True:
            answer = self._next(max(deadline.remaining(), 0.01))
            if answer.startswith(("ok", "failed")):
                return answer

    def status_mib(self, key: str) -> float:
        """``VmRSS``, ``VmHWM``... of the victim, in MiB."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
        raise AssertionError(f"{key} missing from /proc/{self.pid}/status")

    def close(self) -> None:
        try:
            if hasattr(self, "peer"):  # absent when the victim never became ready
                self.peer.close(Deadline.after(2))
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # EOF: the victim closes its transports and exits
            self.proc.wait(10)
        except (subprocess.TimeoutExpired, OSError):
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self.server.stop(0)


@pytest.fixture(scope="module")
def victim() -> Iterator[Victim]:
    if shutil.which("prlimit") is None:
        pytest.skip("needs prlimit (util-linux) to confine the victim's memory")
    v = Victim()
    try:
        yield v
    finally:
        v.close()


def assert_serves_real_peers(victim: Victim, seq: int) -> None:
    """The victim still does its real work for real, authenticated peers: a health check, a
    parameter-server create/push/pull round of a real variable, a 1 MiB collective message from
    its in-process peer over the data plane, and one from this process's rank 2, which opens a
    fresh data connection now (Hello, then the TCP handshake at the port the fuzz hit)."""
    victim.assert_healthy()
    with grpc.insecure_channel(victim.address) as channel:
        check = channel.unary_unary(
            "/cluster_runtime.v1.Control/Check",
            request_serializer=control_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=control_pb2.HealthCheckResponse.FromString)
        reply = check(control_pb2.HealthCheckRequest(expected_task=TASKS[0]), timeout=30,
                      metadata=TOKEN.metadata)
        assert reply.status == control_pb2.HealthCheckResponse.SERVING, reply
    name = f"real/after-fuzz-{seq}"
    with PsClient(victim.address, TOKEN, task=TASKS[0]) as ps:
        ps.create(name, np.arange(4, dtype=np.float32), timeout=30)
        ps.assign(name, np.full(4, 2.0, np.float32), timeout=30)
        [pulled] = ps.pull([name], timeout=30)
        np.testing.assert_array_equal(pulled.value, np.full(4, 2.0, np.float32))
    assert victim.command(f"roundtrip {seq}") == "ok", victim.log
    victim.peer.send(0, MessageKey(GROUP, seq, 0), PAYLOAD, deadline=Deadline.after(30))
    answer = victim.command(f"recv 2 {seq} {len(PAYLOAD)}")
    assert answer.startswith("ok"), f"{answer}\n{victim.log}"
