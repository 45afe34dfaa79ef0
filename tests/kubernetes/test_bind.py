"""Where a task listens, on real hosts (network namespaces): the spec's address when it is the
host's, every interface when it is not (yet), and the log line that says which."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]

SERVE = """
import logging, sys, threading
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
from cluster.transport.auth import Token
from cluster.transport.server import TaskServer
servers = [TaskServer(address, Token("t")) for address in sys.argv[1:]]
for server in servers:
    server.start()
    print("bound", server.address, server.bind_host, flush=True)
print("all started", flush=True)
threading.Event().wait()
"""
CONNECT = """
import socket, sys
for port in sys.argv[2:]:
    try:
        socket.create_connection((sys.argv[1], int(port)), timeout=2).close()
        print(port, "connected")
    except OSError as e:
        print(port, "failed", type(e).__name__)
"""


def test_a_task_serves_on_every_interface_only_when_its_address_is_not_its_hosts(
        netns_hosts, task_processes, marker) -> None:
    late = "pod-0.run.default.svc"
    cluster = netns_hosts(["h1", "h2"], aliases={"h1": [late]}, late=[late])
    h1, h2 = cluster["h1"], cluster["h2"]
    addresses = [f"{late}:5000",          # not published yet: every interface
                 "127.0.0.1:5001",        # loopback: loopback only
                 f"{h1.address}:5002",    # the host's own address: that address only
                 "10.77.0.200:5003"]      # someone else's (NAT, stale): every interface
    server = task_processes.start(h1.command([sys.executable, "-c", SERVE, *addresses],
                                             cwd=REPO), env={"CLUSTER_TEST_MARKER": marker})
    out = server.read_until("all started", timeout=30)
    assert f"bound {late}:5000 ::" in out
    assert "bound 127.0.0.1:5001 127.0.0.1" in out
    assert f"bound {h1.address}:5002 {h1.address}" in out
    assert "bound 10.77.0.200:5003 ::" in out
    assert (f"INFO serving {late}:5000 on every interface ([::]:5000): {late}: name does not "
            "resolve (yet)") in out
    assert ("WARNING serving 10.77.0.200:5003 on every interface ([::]:5003): 10.77.0.200 is "
            "not an address of this host") in out
    reached = h2.run([sys.executable, "-c", CONNECT, h1.address, "5000", "5001", "5002",
                      "5003"]).stdout.split("\n")
    assert reached[:4] == ["5000 connected", "5001 failed ConnectionRefusedError",
                           "5002 connected", "5003 connected"]
    loopback = h1.run([sys.executable, "-c", CONNECT, "127.0.0.1", "5002"]).stdout
    assert loopback.strip() == "5002 failed ConnectionRefusedError"  # bound to one address
