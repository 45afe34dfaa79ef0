"""A serving task's answer to a preemption notice (``cluster._serving.serve``), with real
runtimes in this process: chief:0 (hosting the coordination service) and ps:0.

SIGTERM is sent to this process for real; :func:`cluster.lifecycle.install_termination_handlers`
turns it into ``Terminated`` in the main thread, where ``serve`` waits, as in ``python -m ps``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from cluster import _serving, exitcodes, lifecycle
from cluster.deadline import Deadline
from cluster.settings import TaskSettings
from cluster.task_runtime import TaskRuntime
from cluster.testing import loopback_cluster
from resolver import ClusterSpec, SimpleClusterResolver

pytestmark = pytest.mark.timeout(60)

FAST = TaskSettings(connect_timeout=10, heartbeat_interval=0.2, heartbeat_timeout=5,
                    report_timeout=2)


class Pair:
    def __init__(self, grace: float | None) -> None:
        spec = ClusterSpec(loopback_cluster(chief=1, ps=1))
        self.chief = TaskRuntime.create(SimpleClusterResolver(spec, task_type="chief",
                                                              task_id=0), FAST)
        self.ps = TaskRuntime.create(SimpleClusterResolver(spec, task_type="ps", task_id=0),
                                     FAST.replace(grace_period=grace))
        self.chief.join()
        self.ps.join()

    def close(self) -> None:
        for rt in (self.ps, self.chief):
            rt.shutdown(grace=0)


@pytest.fixture
def signals() -> Iterator[None]:
    """The entry point's signal handlers, restored afterwards."""
    previous = {s: signal.getsignal(s) for s in _serving.SERVING_SIGNALS}
    lifecycle.install_termination_handlers(_serving.SERVING_SIGNALS)
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _serve_with(pair: Pair, meanwhile: Callable[[], None]) -> tuple[int, list[BaseException]]:
    """``serve(pair.ps)`` here, while ``meanwhile()`` runs in a thread (it sends the signals)."""
    errors: list[BaseException] = []
    serving = threading.Event()
    wait_for_shutdown = pair.ps.wait_for_shutdown

    def wait_serving(deadline: Deadline | None = None) -> bool:
        serving.set()  # inside serve(): a signal from now on is serve()'s to answer
        return wait_for_shutdown(deadline)

    pair.ps.wait_for_shutdown = wait_serving

    def run() -> None:
        try:
            if not serving.wait(20):
                raise AssertionError("serve() never waited for shutdown")
            meanwhile()
        except BaseException as e:  # surfaced to the test
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        code = _serving.serve(pair.ps)
    finally:
        lifecycle.absorb_termination(_serving.SERVING_SIGNALS)  # as the entry point does
        thread.join(30)
    return code, errors


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def pair(request) -> Iterator[Pair]:
    p = Pair(request.param)
    yield p
    p.close()


@pytest.mark.parametrize("pair", [30.0], indirect=True)
def test_a_notice_is_reported_and_the_task_serves_until_the_coordinator_left(
        pair, signals, capfd) -> None:
    def meanwhile() -> None:
        _sigterm()
        # The chief hosts the service: it hears the notice as soon as it is reported.
        assert pair.chief.wait_for_preemption_notice(Deadline.after(20)) == ("ps:0",)
        assert pair.ps.coordinator_exited == ""  # still serving for the coordinator
        pair.chief.shutdown()  # the coordinator saved and left

    code, errors = _serve_with(pair, meanwhile)
    assert errors == []
    assert code == exitcodes.EXIT_PREEMPTED
    err = capfd.readouterr().err
    assert ("ps:0: preemption notice (received SIGTERM): serving up to 30 s for the "
            "coordinator's checkpoint") in err
    assert "ps:0: shutting down after the preemption notice (chief:0 has finished)" in err


@pytest.mark.parametrize("pair", [1.0], indirect=True)
def test_when_the_grace_period_runs_out_first_the_task_exits_143(pair, signals,
                                                                  capfd) -> None:
    started = time.monotonic()
    code, errors = _serve_with(pair, _sigterm)
    assert errors == []
    assert code == 128 + signal.SIGTERM
    assert time.monotonic() - started >= 1.0  # it served the whole grace period
    assert pair.chief.preemption_notices == ("ps:0",)
    assert "the grace period of 1 s ran out before chief:0 finished" in capfd.readouterr().err


@pytest.mark.parametrize("pair", [60.0], indirect=True)
def test_a_second_signal_ends_the_grace_at_once(pair, signals, capfd) -> None:
    def meanwhile() -> None:
        _sigterm()
        assert pair.chief.wait_for_preemption_notice(Deadline.after(20)) == ("ps:0",)
        os.kill(os.getpid(), signal.SIGINT)

    started = time.monotonic()
    code, errors = _serve_with(pair, meanwhile)
    assert errors == []
    assert code == 128 + signal.SIGINT
    assert time.monotonic() - started < 30  # far from the 60 s grace (generous: a loaded box)
    assert "shutting down now (received SIGINT again" in capfd.readouterr().err


@pytest.mark.parametrize("pair", [None, 0.0], indirect=True)
def test_without_a_grace_period_the_task_stops_at_once_as_before(pair, signals,
                                                                 capfd) -> None:
    code, errors = _serve_with(pair, _sigterm)
    assert errors == []
    assert code == exitcodes.EXIT_OK
    # The notice was not reported: the chief hosts the service, so it would know by now.
    assert pair.chief.preemption_notices == ()
    assert "ps:0: shutting down (received SIGTERM; no grace period" in capfd.readouterr().err


@pytest.mark.parametrize("pair", [30.0], indirect=True)
def test_after_the_coordinator_left_a_notice_stops_the_task_at_once(pair, signals,
                                                                    capfd) -> None:
    pair.chief.shutdown()  # e.g. clusterctl stopping the servers after the chief's exit
    assert pair.ps.wait_for_coordinator_exit(Deadline.after(20)) == "chief:0 has finished"
    code, errors = _serve_with(pair, _sigterm)
    assert errors == []
    assert code == exitcodes.EXIT_OK
    assert "ps:0: shutting down (received SIGTERM; chief:0 has finished)" in \
        capfd.readouterr().err


@pytest.mark.parametrize("pair", [30.0], indirect=True)
def test_a_shutdown_request_still_stops_a_serving_task_with_exit_0(pair, signals,
                                                                   capfd) -> None:
    code, errors = _serve_with(pair, lambda: pair.ps.request_shutdown("Shutdown RPC"))
    assert errors == []
    assert code == exitcodes.EXIT_OK
    assert pair.chief.preemption_notices == ()
    assert "ps:0: shutting down (Shutdown RPC)" in capfd.readouterr().err
