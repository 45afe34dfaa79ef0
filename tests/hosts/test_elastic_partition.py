"""An elastic group across two hosts (network namespaces) loses a host to a silent partition
(nftables drop: no RST, no ICMP): the coordination service, on the other host, declares the
cut-off tasks lost within about 5 s; the survivors form a smaller group, train on to the end and
finish with the weights of one process. The cut-off tasks fail, naming the coordination
service they can no longer reach. Root only (namespaces, nftables); CI runs it as root."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import numpy as np
import pytest

from cluster.testing.netns_tasks import HostTasks
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.hosts, pytest.mark.timeout(240)]

SCRIPT = REPO / "tests" / "processes" / "scripts" / "elastic_train.py"
LAYOUT = {"h1": ["chief:0", "worker:0"], "h2": ["worker:1", "worker:2"]}
STEPS = 400
# Seconds from the partition to the survivors' next step: the 5 s of a silent partition's
# detection (3 s heartbeat timeout, a probe), the regroup, a step. Room for a busy CI.
RECOVERY_BOUND = float(os.environ.get("HOSTS_STOP_BOUND", "8"))


@pytest.mark.skipif(shutil.which("nft") is None,
                    reason="nftables is not installed (apt install nftables)")
def test_a_partitioned_host_leaves_the_elastic_group_and_the_rest_trains_on_exactly(
        netns_hosts, task_processes, marker, tmp_path) -> None:
    hosts = netns_hosts(list(LAYOUT))
    env = {"CLUSTER_TEST_MARKER": marker, "CLUSTER_TOKEN": os.urandom(16).hex(),
           "CLUSTER_CONNECT_TIMEOUT": "90", "CLUSTER_ELASTIC": "2:4",
           "ELASTIC_DIR": str(tmp_path), "ELASTIC_STEPS": str(STEPS), "ELASTIC_REPORT": "1",
           "ELASTIC_STEP_SLEEP": "0.02"}
    run = HostTasks(hosts, LAYOUT, ["-m", "worker", SCRIPT], processes=task_processes,
                    env=env, cwd=REPO)
    run["chief:0"].read_until("STEP 30 ", timeout=120)
    cut = time.time()
    hosts.partition("h1", "h2")
    outcome = {}
    for task in ("chief:0", "worker:0"):
        code, out = run[task].finish(timeout=150)
        assert code == 0, f"{task}:\n{out[-4000:]}"
        outcome[task] = out
    for task in ("worker:1", "worker:2"):
        code, out = run[task].finish(timeout=60)
        assert code != 0, f"{task} went on alone:\n{out[-4000:]}"
    chief = outcome["chief:0"]
    steps = [(int(n), float(t), int(r)) for n, t, r in
             re.findall(r"^STEP (\d+) ([\d.]+) (\d+)$", chief, re.M)]
    after = [s for s in steps if s[1] > cut and s[2] == 2]
    assert after, chief[-4000:]
    recovery = after[0][1] - cut
    print(f"\nsurvivors' first step on 2 replicas {recovery:.2f} s after the partition")
    assert recovery < RECOVERY_BOUND, chief[-4000:]
    final = json.loads(re.search(r"FINAL chief:0 (\{.*\})", chief).group(1))
    np.testing.assert_allclose(final["w"], final["reference"], rtol=0, atol=1e-12)
    assert final["applied"] == list(range(STEPS))
    assert "elastic group generation 2: 2 replica(s) (chief:0, worker:0); left: worker:1, " \
           "worker:2" in chief, chief[-4000:]
