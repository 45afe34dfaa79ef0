"""The emulated-host harness (cluster.testing.netns): what the multi-host and pod tests rely on."""

from __future__ import annotations

import shutil
import sys

import pytest

from cluster.testing import netns

pytestmark = pytest.mark.timeout(60)

CONNECT = ("import socket, sys\n"
           "try:\n"
           "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()\n"
           "    print('connected')\n"
           "except OSError as e:\n"
           "    print('failed', type(e).__name__)\n")
LISTEN = ("import socket\n"
          "s = socket.socket(); s.bind(('0.0.0.0', 5000)); s.listen(8)\n"
          "print('listening', flush=True)\n"
          "while True:\n"
          "    s.accept()[0].close()\n")


def test_hosts_have_their_own_name_shm_pids_and_see_each_other(netns_hosts, task_processes,
                                                                marker) -> None:
    cluster = netns_hosts(["h1", "h2"])
    h1, h2 = cluster["h1"], cluster["h2"]
    assert h1.run(["hostname"]).stdout.strip() == "h1"
    assert h2.run(["hostname"]).stdout.strip() == "h2"
    shm = [h.run(["stat", "-c", "%d:%i", "/dev/shm"]).stdout for h in (h1, h2)]
    assert shm[0] != shm[1]
    pidns = [h.run(["readlink", "/proc/self/ns/pid"]).stdout for h in (h1, h2)]
    assert pidns[0] != pidns[1]
    server = task_processes.start(h2.command([sys.executable, "-c", LISTEN]),
                                  env={"CLUSTER_TEST_MARKER": marker})
    server.read_until("listening", timeout=20)
    out = h1.run([sys.executable, "-c", CONNECT, "h2", "5000"]).stdout
    assert out.strip() == "connected"


def test_late_names_resolve_once_published(netns_hosts) -> None:
    cluster = netns_hosts(["h1", "h2"], aliases={"h2": ["pod-1.run.default.svc"]},
                          late=["pod-1.run.default.svc"])
    lookup = ["getent", "hosts", "pod-1.run.default.svc"]
    assert cluster["h1"].run(lookup, check=False).returncode != 0
    cluster.publish("pod-1.run.default.svc")
    assert cluster["h1"].run(lookup).stdout.split()[0] == cluster["h2"].address


@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed (apt)")
def test_a_partition_drops_silently_and_close_kills_everything(netns_hosts, task_processes,
                                                                marker) -> None:
    cluster = netns_hosts(["h1", "h2"])
    server = task_processes.start(cluster["h2"].command([sys.executable, "-c", LISTEN]),
                                  env={"CLUSTER_TEST_MARKER": marker})
    server.read_until("listening", timeout=20)
    cluster.partition("h1", "h2")
    out = cluster["h1"].run([sys.executable, "-c", CONNECT, "h2", "5000"]).stdout
    assert out.strip() == "failed TimeoutError"  # dropped, not refused
    cluster["h2"].kill()
    assert server.wait(timeout=10) == -9
    cluster.close()
    assert not [ns for ns in netns.leftover_namespaces() if ns.startswith(cluster.switch[:-3])]
