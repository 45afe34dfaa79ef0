"""The fuzz suite's victim: one process serving every service a task can serve.

``python -m tests.fuzz._victim`` (``CLUSTER_TOKEN`` set; ``FUZZ_PEER_ADDRESS``: the gRPC address
of the test process's own rank) assembles what ``cluster.task_runtime.TaskRuntime`` assembles
for a task, with every optional service at once: one :class:`TaskServer` (request cap from
:func:`message_limit` of its services) hosting Collective and Control (the endpoint),
Coordination (this task is the service's host), ParameterServer and Worker, and a lazy
:class:`NetworkTransport` on the TCP data plane (its data port). The group has four ranks:

- rank 0 ``worker:0``: the victim;
- rank 1 ``worker:1``: a real peer inside this process (its own server), for roundtrips;
- rank 2 ``worker:2``: the test process, a real peer that connects after the fuzz;
- rank 3 ``worker:3``: never runs; the identity an authenticated fuzz caller claims, so that
  what a buggy peer can legitimately do (end its stream, be lost) never touches ranks 1 and 2.

It prints ``address A``, ``data_port P``, ``ready``, then answers commands on stdin, one a line:
``roundtrip SEQ`` (rank 1 sends rank 0 1 MiB over the data plane, rank 0 receives it),
``recv SRC SEQ NBYTES`` (rank 0 receives that message from ``SRC``); each answers one line,
``ok ...`` or ``failed: ERROR``. EOF on stdin ends it.
"""

from __future__ import annotations

import hashlib
import os
import sys

from cluster.deadline import Deadline
from cluster.errors import ClusterError
from cluster.ps.store import VariableStore
from cluster.transport.api import MessageKey, PeerInfo
from cluster.transport.auth import Token
from cluster.transport.coordination import SERVICE as COORDINATION_SERVICE
from cluster.transport.coordination import CoordinationService, cluster_digest
from cluster.transport.endpoint import CollectiveEndpoint
from cluster.transport.network import NetworkTransport
from cluster.transport.ps_client import SERVICE as PS_SERVICE
from cluster.transport.server import TaskServer, message_limit
from ps.servicer import PsService
from worker.servicer import SERVICE as WORKER_SERVICE
from worker.servicer import WorkerService

__all__ = ["GROUP", "PAYLOAD", "TASKS", "main"]

TASKS = [f"worker:{r}" for r in range(4)]
GROUP = "fuzz"
PAYLOAD = bytes(range(256)) * 4096  # 1 MiB: above the data plane's small-frame path


def _say(*words: object) -> None:
    print(*words, flush=True)


def main() -> None:
    token = Token(os.environ["CLUSTER_TOKEN"])
    ps = PsService(VariableStore(), "worker:0", max_contributors=len(TASKS))
    worker = WorkerService()
    services = {PS_SERVICE: ps.handlers(), WORKER_SERVICE: worker.handlers()}
    server = TaskServer("127.0.0.1:0", token, max_message_bytes=message_limit(services))
    endpoint = CollectiveEndpoint.install(server, TASKS[0], heartbeat_interval=0.5)
    for name, handlers in services.items():
        server.add_handlers(name, handlers)
    tasks = [(t, server.address) for t in TASKS]
    coordination = CoordinationService(TASKS[0], TASKS, cluster_digest(tasks), interval=1.0,
                                       timeout=30.0)
    server.add_handlers(COORDINATION_SERVICE, coordination.handlers())
    # A Shutdown or ReportFailure from an authenticated fuzz caller is taken note of, not acted
    # on: the fuzz goes on against this process (a real task would stop, as asked).
    endpoint.control.on_shutdown = lambda reason: None
    endpoint.control.on_failure_report = lambda report: None
    server.start()
    coordination.start()
    worker.bind(TASKS[0], token)

    helper = TaskServer("127.0.0.1:0", token)
    helper_endpoint = CollectiveEndpoint.install(helper, TASKS[1], heartbeat_interval=0.5)
    helper.start()
    peers = [PeerInfo(0, TASKS[0], server.address), PeerInfo(1, TASKS[1], helper.address),
             PeerInfo(2, TASKS[2], os.environ["FUZZ_PEER_ADDRESS"]),
             PeerInfo(3, TASKS[3], "127.0.0.1:1")]
    me = NetworkTransport(endpoint, 0, peers, token, data_plane="tcp", lazy=True)
    other = NetworkTransport(helper_endpoint, 1, peers, token, data_plane="tcp", lazy=True)
    me.connect(Deadline.after(10))
    other.connect(Deadline.after(10))
    _say("address", server.address)
    _say("data_port", me.data_port)
    _say("ready")
    try:
        for line in sys.stdin:
            words = line.split()
            try:
                if words[:1] == ["roundtrip"]:
                    key = MessageKey(GROUP, int(words[1]), 0)
                    other.send(0, key, PAYLOAD, deadline=Deadline.after(20))
                    got = bytes(me.recv(1, key, deadline=Deadline.after(20)).payload)
                    _say("ok" if got == PAYLOAD else "failed: bytes differ")
                elif words[:1] == ["recv"]:
                    src, seq, nbytes = map(int, words[1:4])
                    got = bytes(me.recv(src, MessageKey(GROUP, seq, 0),
                                        deadline=Deadline.after(20)).payload)
                    ok = len(got) == nbytes
                    _say("ok" if ok else "failed: length", hashlib.sha256(got).hexdigest())
                else:
                    _say(f"failed: unknown command {line.strip()!r}")
            except ClusterError as e:
                _say(f"failed: {type(e).__name__}: {e}")
    finally:
        other.close(Deadline.after(2))
        me.close(Deadline.after(2))
        coordination.stop()
        helper.stop(0)
        server.stop(0)


if __name__ == "__main__":
    main()
