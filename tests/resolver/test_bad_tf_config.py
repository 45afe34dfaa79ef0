"""A bad ``TF_CONFIG`` is refused at start-up with exit 2 and a message naming the field and the
fix, before any port is bound: IPv6 hosts without brackets, absurd nesting, two tasks
at one address. Real ``python -m worker`` processes, one at a time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from cluster._address import check_address, check_host, duplicate_address
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(120)


def start(tmp_path, marker: str, tf_config: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    env = {**os.environ, "TF_CONFIG": tf_config, "CLUSTER_CONNECT_TIMEOUT": "20",
           "CLUSTER_TEST_MARKER": marker, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "worker", str(script)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=90)


def config(*addresses: str) -> str:
    return json.dumps({"cluster": {"worker": list(addresses)},
                       "task": {"type": "worker", "index": 0}})


def test_ipv6_without_brackets_exits_2_naming_the_fix(tmp_path, marker) -> None:
    proc = start(tmp_path, marker, config("::1:23456"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ("TF_CONFIG: cluster.worker[0]: IPv6 address in '::1:23456' needs brackets: "
            "write [::1]:23456") in proc.stderr
    assert "the script ran" not in proc.stdout


def test_30000_levels_of_nesting_exit_2_without_a_traceback(tmp_path, marker) -> None:
    proc = start(tmp_path, marker, "[" * 30000 + "]" * 30000)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "TF_CONFIG: invalid JSON: nested too deeply" in proc.stderr
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr


def test_duplicate_addresses_are_refused_before_any_port_is_bound(tmp_path, marker) -> None:
    # The test holds the port: a task that tried to bind it would exit 203 (address in use),
    # one that waited for its twin would exit 202 after CLUSTER_CONNECT_TIMEOUT.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        address = f"127.0.0.1:{held.getsockname()[1]}"
        proc = start(tmp_path, marker, config(address, address))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (f"TF_CONFIG: worker:1 and worker:0 have the same address {address}: every task "
            "needs its own host:port") in proc.stderr


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1", True), ("localhost", True), ("[::1]", True), ("[fe80::1%eth0]", True),
    ("quickstart-worker-0.quickstart.default.svc", True), ("my_service", True),
    ("node01.", True), ("0.0.0.0", True),
    ("no such host!", False), ("::1", False), ("[::1", False), ("[not-v6]", False),
    ("999.1.1.1", False), ("-bad.example", False), ("a" * 64, False), ("", False), (5, False),
])
def test_check_host(host, ok) -> None:
    assert (check_host(host) == "") is ok, check_host(host)


@pytest.mark.parametrize(("address", "problem"), [
    ("127.0.0.1:2222", ""),
    ("[::1]:2222", ""),
    ("::1:2222", "needs brackets: write [::1]:2222"),
    ("host name:2222", "is not a valid host name"),
    ("localhost", 'expected "host:port"'),
    ("localhost:0", "port must be an integer 1-65535"),
])
def test_check_address(address, problem) -> None:
    assert problem in check_address(address)
    assert (check_address(address) == "") is (problem == "")


def test_duplicate_address() -> None:
    assert duplicate_address([("a:0", "h:1"), ("b:0", "h:2")]) is None
    assert duplicate_address([("a:0", "H:1"), ("b:0", "h:2"), ("b:1", "h:1")]) == (
        "h:1", "b:1", "a:0")
