"""Two hosts (network namespaces, :mod:`cluster.testing.netns`) x two tasks, each task
``python -m worker SCRIPT`` with a ``TF_CONFIG`` naming hosts by hostname.

- exact all-reduce, all_gather and broadcast, and the quickstart's MultiWorkerMirroredStrategy
  training equal to one process; the groups' route counters prove that the hierarchical path
  (shared memory inside a host, the network across the hosts' leaders) really ran;
- a silent partition mid-training (nftables drop: no RST, no ICMP), and a host's link going
  down: every task exits non-zero within :data:`STOP_BOUND` s, naming an unreachable peer;
- a slow link (``tc tbf`` 100 mbit) still completes.

Root only (namespaces, nftables, tc): skipped with the reason elsewhere; CI runs them (as root).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from cluster import exitcodes
from cluster.testing.netns_tasks import HostTasks
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.hosts, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
TRAIN_FOREVER = REPO / "tests" / "processes" / "scripts" / "scale_train.py"
QUICKSTART = REPO / "examples" / "quickstart"
LAYOUT = {"h1": ["chief:0", "worker:0"], "h2": ["worker:1", "worker:2"]}
STARTUP = 90.0  # seconds: four interpreters importing numpy and grpc on 2 cores
BIG = str(16 << 20)  # bytes all-reduced across the slow link
# Seconds from a silent partition to the exit of every task. The goal is 5 s, measured
# under load by tools/load_runs.sh, which sets HOSTS_STOP_BOUND=5; in the suite the check is that
# tasks fail fast rather than how fast, with room for a busy CI.
STOP_BOUND = float(os.environ.get("HOSTS_STOP_BOUND", "8"))
UNREACHABLE = re.compile(r"PeerUnavailableError: (chief|worker):\d \((h1|h2):\d+\) "
                         r"(is unavailable|unreachable)")

needs_nft = pytest.mark.skipif(shutil.which("nft") is None,
                               reason="nftables is not installed (apt install nftables)")


def _env(marker: str) -> dict[str, str]:
    return {"CLUSTER_TEST_MARKER": marker, "CLUSTER_TOKEN": os.urandom(16).hex(),
            "CLUSTER_CONNECT_TIMEOUT": f"{STARTUP:g}"}


def _routes(output: str, prefix: str) -> tuple[list, dict[str, int]]:
    match = re.search(rf"^{prefix} .*hosts=(\[.*?\]\]) routes=(\{{.*\}})$", output, re.M)
    assert match, output
    return json.loads(match.group(1)), json.loads(match.group(2))


def test_collectives_across_two_hosts_are_exact_and_hierarchical(netns_hosts, task_processes,
                                                                 marker) -> None:
    hosts = netns_hosts(list(LAYOUT))
    run = HostTasks(hosts, LAYOUT, ["-m", "worker", SCRIPTS / "collectives.py"],
                    processes=task_processes, env=_env(marker), cwd=REPO)
    for task, proc in run.tasks.items():
        code, output = proc.finish(timeout=STARTUP + 60)
        assert code == 0, f"{task}:\n{output}"
        topology, routes = _routes(output, "RESULT")
        assert topology == [[0, 1], [2, 3]], output  # the two hosts, as co-location sees them
        # Every all-reduce took the hierarchical route; gathers and broadcasts crossed the
        # network (no single host holds every rank).
        assert routes["all_reduce/hier"] == 4 and "all_reduce/network" not in routes, output
        assert routes["all_gather/network"] == 1 and routes["broadcast/network"] == 4, output
        # Across the hosts: the 1.2 MB all-reduce in stripes, one per rank of each host; the
        # three small ones through the leaders (ranks 0 and 2) alone.
        leader = run.on(run.host_of[task])[0] == task
        assert routes["hosts/all_reduce/network"] == (4 if leader else 1), output


def test_training_across_two_hosts_equals_one_process(netns_hosts, task_processes, marker,
                                                     tmp_path) -> None:
    hosts = netns_hosts(list(LAYOUT))
    saved = tmp_path / "params.npz"
    args = ["--epochs", "5"]
    run = HostTasks(hosts, LAYOUT,
                    ["-m", "worker", SCRIPTS / "quickstart_routes.py", *args, "--save", saved],
                    processes=task_processes, env=_env(marker), cwd=REPO)
    for task, proc in run.tasks.items():
        code, output = proc.finish(timeout=STARTUP + 120)
        assert code == 0, f"{task}:\n{output}"
        topology, routes = _routes(output, "ROUTES")
        assert topology == [[0, 1], [2, 3]], output
        assert routes.get("all_reduce/hier", 0) > 10, output  # every step's gradients
    assert "4 replica(s) in sync" in run["chief:0"].output

    spec = importlib.util.spec_from_file_location("quickstart_train", QUICKSTART / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    single = tmp_path / "single.npz"
    assert module.main(["--strategy", "default", *args, "--save", str(single)]) == 0
    with np.load(saved) as distributed, np.load(single) as reference:
        for i in range(4):
            np.testing.assert_allclose(distributed[f"arr_{i}"], reference[f"arr_{i}"],
                                       rtol=0, atol=2e-6)


def _train_then(hosts, task_processes, marker, fault,
                plane: str = "tcp") -> dict[str, tuple[int, float, str]]:
    """Train forever on both hosts (tensors on the ``plane`` data plane); once steps run, apply
    ``fault()``; then every task's exit code, seconds from the fault to its exit, and output."""
    run = HostTasks(hosts, LAYOUT, ["-m", "worker", TRAIN_FOREVER, "--forever",
                                    "--report-steps", "worker:1"],
                    processes=task_processes, env={**_env(marker), "CLUSTER_DATA_PLANE": plane},
                    cwd=REPO)
    run["worker:1"].read_until("STEP 20", timeout=STARTUP + 30)
    start = time.monotonic()
    fault()
    exits = run.wait_exits(timeout=60)
    outcome = {task: (code, at - start, run[task].output) for task, (code, at) in exits.items()}
    print("\n" + " ".join(f"{t}={c}@{s:.2f}s" for t, (c, s, _) in outcome.items()))
    return outcome


def _check_stopped(outcome: dict[str, tuple[int, float, str]]) -> None:
    for task, (code, seconds, output) in outcome.items():
        # Each stops because of another task (the launcher's "retryable" code), not by a crash.
        assert code == exitcodes.EXIT_PEER_FAILED, f"{task} exited {code}:\n{output}"
        assert UNREACHABLE.search(output), f"{task} names no unreachable peer:\n{output}"
        assert seconds < STOP_BOUND, f"{task} exited {seconds:.1f} s after the fault:\n{output}"


@needs_nft
@pytest.mark.parametrize("plane", ["tcp", "grpc"])
def test_a_silent_partition_stops_every_task_naming_an_unreachable_peer(
        netns_hosts, task_processes, marker, plane) -> None:
    hosts = netns_hosts(list(LAYOUT))
    outcome = _train_then(hosts, task_processes, marker, lambda: hosts.partition("h1", "h2"),
                          plane)
    _check_stopped(outcome)
    for task, (_, _, output) in outcome.items():  # the exit path raised nothing of its own
        assert "FutureTimeoutError" not in output, f"{task}:\n{output}"


def test_a_host_link_going_down_stops_every_task(netns_hosts, task_processes, marker) -> None:
    hosts = netns_hosts(list(LAYOUT))
    outcome = _train_then(hosts, task_processes, marker, lambda: hosts.link_down("h2"))
    _check_stopped(outcome)


def test_a_slow_link_still_completes(netns_hosts, task_processes, marker) -> None:
    hosts = netns_hosts(list(LAYOUT))
    hosts.shape("h2", "100mbit")
    started = time.monotonic()
    run = HostTasks(hosts, LAYOUT, ["-m", "worker", SCRIPTS / "collectives.py", "--big", BIG],
                    processes=task_processes, env=_env(marker), cwd=REPO)
    for task, proc in run.tasks.items():
        code, output = proc.finish(timeout=STARTUP + 120)
        assert code == 0, f"{task}:\n{output}"
        _, routes = _routes(output, "RESULT")
        assert routes["all_reduce/hier"] == 5, output
        seconds = float(re.search(r"^BIG ([0-9.]+) s", output, re.M).group(1))
        # The leaders' ring sends BIG bytes each way across the shaped link: a lower bound (the
        # link really is slow), never an upper one.
        assert seconds > int(BIG) * 8 / 100e6 * 0.8, output
    print(f"\nslow link (100mbit): {int(BIG) >> 20} MiB all-reduce in {seconds:.2f} s; "
          f"every task done {time.monotonic() - started:.1f} s after the start")
