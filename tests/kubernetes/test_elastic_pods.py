"""An elastic job on emulated Kubernetes pods: a worker pod deleted mid-run is replaced (as its
Job controller does), and the replacement rejoins the running job, which ends exact. Needs root
(CI is root); skips with the reason elsewhere."""

from __future__ import annotations

import re

import pytest

from cluster.testing import netns
from cluster.testing.pods import EmulatedPods, describe
from tests.conftest import REPO
from tests.kubernetes._render import render

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

TOKEN = "e2e-token-not-secret"


def test_a_deleted_pods_replacement_rejoins_the_running_job(marker, tmp_path) -> None:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(reason)
    manifests = render("elastic", "k8s", ["--steps", "400", "--step-time", "0.03"])
    assert "CLUSTER_ELASTIC" in manifests
    with EmulatedPods(manifests, workdir=REPO / "examples" / "elastic",
                      secrets={"elastic-token": {"token": TOKEN}},
                      env={"CLUSTER_TEST_MARKER": marker}, log_dir=tmp_path) as pods:
        pods.start(dns_delay=1.0)
        chief = pods.process("elastic-chief-0")
        chief.read_until("step 40:", timeout=90)
        deleted = pods.replace("elastic-worker-1")
        assert deleted.exit_code == 137, describe({"elastic-worker-1": deleted})
        results = pods.wait(timeout=150)
        assert all(r.exit_code == 0 for r in results.values()), describe(results)
        out = results["elastic-chief-0"].output
        # The group went on without it, then took its replacement back.
        assert re.search(r"generation \d+: 3 replica\(s\) .*; left: worker:1", out), out[-4000:]
        assert re.search(r"generation \d+: 4 replica\(s\) .*; joined: worker:1", out), \
            out[-4000:]
        assert re.search(r"exact: max \|w - one process\| = (0\.0e\+00|[0-9.]+e-1[3-9])",
                         out), out[-4000:]
