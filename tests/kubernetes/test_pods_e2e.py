"""The examples as Kubernetes would run them: rendered manifests on emulated pods.

Each pod is a host of its own (network, mount, PID and UTS namespaces; cluster.testing.pods)
with the environment the kubelet and the controllers give it, and its DNS names published only
once it runs (a second later here: the task binds before its own name resolves, and its peers
resolve it lazily). Needs root (CI is root); skips with the reason elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from cluster.exitcodes import EXIT_PEER_FAILED
from cluster.testing import netns
from cluster.testing.pods import EmulatedPods, describe
from tests.conftest import REPO
from tests.kubernetes._render import render

pytestmark = pytest.mark.multiprocess

TOKEN = "e2e-token-not-secret"
EPOCHS = ["--epochs", "2"]  # the examples' own knob: a light run that still trains
DNS_LAG = 1.0  # seconds between a pod's start and its name resolving


@pytest.fixture
def pods(marker: str, tmp_path) -> Iterator[Callable[..., EmulatedPods]]:
    """``pods(example, fmt, args)``: the example's rendered pods, not started; torn down (every
    process and namespace, checked) when the test ends."""
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(reason)
    made: list[EmulatedPods] = []

    def make(example: str, fmt: str, args: list[str] = EPOCHS) -> EmulatedPods:
        made.append(EmulatedPods(
            render(example, fmt, args), workdir=REPO / "examples" / example,
            secrets={f"{example}-token": {"token": TOKEN}},
            env={"CLUSTER_TEST_MARKER": marker}, log_dir=tmp_path))
        return made[-1]

    yield make
    for emulated in made:
        emulated.close()
    left = [ns for ns in netns.leftover_namespaces()
            if any(e.cluster is not None and ns.startswith(e.cluster.switch[:-3]) for e in made)]
    assert not left, f"network namespaces left behind: {left}"


def _servers(emulated: EmulatedPods) -> list[str]:
    """Pods that serve until stopped: parameter servers, and workers in coordinator mode."""
    return [n for n, p in emulated.pods.items()
            if p.role == "ps" or (p.role == "worker" and p.command[-1] == "worker")]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("fmt", ["k8s", "tfjob"])
@pytest.mark.parametrize("example", ["quickstart", "ps"])
def test_the_example_trains_on_pods(pods, example: str, fmt: str) -> None:
    emulated = pods(example, fmt)
    emulated.start(dns_delay=DNS_LAG)
    servers = _servers(emulated)
    trainers = [n for n in emulated.pods if n not in servers]
    results = emulated.wait(timeout=90, names=trainers)
    assert all(r.exit_code == 0 for r in results.values()), describe(results)
    chief = results[f"{example}-chief-0"]
    assert "test accuracy" in chief.output, chief.output
    # Every data port was reached (bound on every interface, as the gRPC port).
    assert not [n for n, r in results.items() if "over gRPC" in r.output]
    if fmt == "k8s":
        # CLUSTER_STOP_WITH_COORDINATOR: servers exit 0 once the chief has finished, so every
        # Job of the run completes.
        stopped = emulated.wait(timeout=30, names=servers)
        assert all("has finished" in r.output for r in stopped.values()), describe(stopped)
    else:
        # TFJob's cleanPodPolicy deletes them, as `kubectl delete`: they stop cleanly on SIGTERM.
        stopped = emulated.terminate(servers, grace=20)
    assert all(r.exit_code == 0 for r in stopped.values()), describe(stopped)


@pytest.mark.timeout(180)
def test_pods_30_s_late_still_join(pods) -> None:
    emulated = pods("quickstart", "k8s")
    # Two late pods: the chief hosts the coordination service (every task's first call goes to
    # it), its name resolving only 2 s after it starts (it binds before, its peers dial after);
    # worker 1 the others wait for to register.
    late = ["quickstart-chief-0", "quickstart-worker-1"]
    emulated.start(delays=dict.fromkeys(late, 30.0), dns_delay={"quickstart-chief-0": 2.0})
    results = emulated.wait(timeout=120)
    assert all(r.exit_code == 0 for r in results.values()), describe(results)
    assert "test accuracy" in results["quickstart-chief-0"].output
    first = emulated.started_at["quickstart-worker-0"]
    assert all(emulated.started_at[n] - first >= 29.0 for n in late)


@pytest.mark.timeout(120)
def test_a_pod_killed_with_sigkill_ends_the_run_with_the_documented_exit_codes(pods) -> None:
    emulated = pods("quickstart", "k8s", ["--epochs", "100000"])  # still training when killed
    emulated.start(dns_delay=DNS_LAG)
    emulated.process("quickstart-chief-0").read_until("training on", timeout=60)
    emulated.kill("quickstart-worker-1")
    results = emulated.wait(timeout=60)
    assert {n: r.exit_code for n, r in results.items()} == {
        "quickstart-worker-1": 137,  # SIGKILL: retryable, the root cause
        "quickstart-chief-0": EXIT_PEER_FAILED, "quickstart-worker-0": EXIT_PEER_FAILED,
    }, describe(results)
    assert "worker:1" in results["quickstart-chief-0"].output
