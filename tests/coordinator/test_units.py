"""The coordinator's parts without a cluster: reply MACs, the worker's runner, the queue."""

from __future__ import annotations

import threading

import cloudpickle
import pytest

from cluster.coordinator._calls import Call, ResourceRef, ResourceSpec, WorkerState
from cluster.coordinator._wire import reply_mac, verify_reply
from cluster.coordinator.coordinator import _Closure, _Queue
from cluster.coordinator.values import RemoteValue
from cluster.errors import FunctionCancelledError, OutOfRangeError
from cluster.strategies._ps_variables import SyncSlot
from cluster.transport.auth import Token

pytestmark = pytest.mark.timeout(30)


# -- reply authentication ------------------------------------------------------------------------

def test_a_reply_mac_binds_token_nonce_run_id_outcome_and_payload():
    token, nonce = Token("secret"), b"n" * 16
    mac = reply_mac(token, nonce, 7, 0, b"payload")
    assert verify_reply(token, nonce, 7, 0, b"payload", mac)
    assert not verify_reply(Token("other"), nonce, 7, 0, b"payload", mac)
    assert not verify_reply(Token(None), nonce, 7, 0, b"payload", mac)
    assert not verify_reply(token, b"m" * 16, 7, 0, b"payload", mac)  # replayed to another call
    assert not verify_reply(token, nonce, 8, 0, b"payload", mac)
    assert not verify_reply(token, nonce, 7, 1, b"payload", mac)  # OK turned into FAILED
    assert not verify_reply(token, nonce, 7, 0, b"payloaD", mac)


# -- the worker's runner ---------------------------------------------------------------------------

def _payload(fn, *args, resources=(), **kwargs) -> bytes:
    return cloudpickle.dumps(Call(cloudpickle.dumps((fn, args, kwargs)), tuple(resources)))


def test_the_runner_returns_the_pickled_result():
    outcome = WorkerState("worker:3").run(_payload(lambda a, b=0: a * 10 + b, 4, b=2))
    assert outcome.ok and cloudpickle.loads(outcome.payload) == 42


def test_the_runner_sends_the_exception_back_with_its_traceback():
    def fails():
        raise KeyError("missing thing")

    outcome = WorkerState("worker:0").run(_payload(fails))
    assert not outcome.ok
    assert outcome.error_type == "KeyError" and "missing thing" in outcome.error_message
    assert "fails" in outcome.traceback
    assert isinstance(cloudpickle.loads(outcome.payload), KeyError)


def test_an_exception_that_does_not_pickle_travels_as_text():
    class Unpicklable(Exception):
        def __reduce__(self):
            raise TypeError("no")

    def fails():
        raise Unpicklable("odd")

    outcome = WorkerState().run(_payload(fails))
    assert not outcome.ok and outcome.payload == b"" and outcome.error_type == "Unpicklable"


def test_stop_iteration_becomes_out_of_range():
    outcome = WorkerState("worker:1").run(_payload(lambda: next(iter([]))))
    assert not outcome.ok and outcome.error_type == "OutOfRangeError"
    assert isinstance(cloudpickle.loads(outcome.payload), OutOfRangeError)


def test_resources_are_made_once_per_worker_and_substituted_for_refs():
    def make(n):
        return iter(range(n))

    state = WorkerState()
    dataset = ResourceSpec(1, make, (3,))
    first = state.run(_payload(next, ResourceRef(1), resources=[dataset]))
    again = state.run(_payload(next, ResourceRef(1), resources=[dataset]))
    # The second call found the iterator already made: it went on from where it was.
    assert cloudpickle.loads(first.payload) == 0 and cloudpickle.loads(again.payload) == 1
    missing = state.run(_payload(next, ResourceRef(9)))
    assert not missing.ok and "never created" in missing.error_message


def test_an_unpicklable_result_is_a_failure_not_a_crash():
    outcome = WorkerState().run(_payload(lambda: threading.Lock()))
    assert not outcome.ok and "pickle" in outcome.error_message.lower()


# -- the queue -----------------------------------------------------------------------------------

def _closure(seq: int, workers: int | None = None) -> _Closure:
    sync = None if workers is None else SyncSlot(seq // workers, seq % workers, workers)
    return _Closure(seq, lambda: None, (), {}, RemoteValue(), sync, body=b"x")


def test_a_requeued_closure_runs_next():
    queue = _Queue(synchronous=False)
    for i in range(3):
        queue.put(_closure(i))
    first = queue.get()
    queue.requeue(first)
    assert queue.get() is first
    assert queue.get().seq == 1


def test_synchronous_rounds_wait_for_the_previous_round():
    queue = _Queue(synchronous=True)
    closures = [_closure(i, workers=2) for i in range(4)]
    for c in closures:
        queue.put(c)
    a, b = queue.get(0), queue.get(1)
    assert (a.sync, b.sync) == (SyncSlot(0, 0, 2), SyncSlot(0, 1, 2))
    got = []
    taker = threading.Thread(target=lambda: got.append(queue.get(0)), daemon=True)
    taker.start()
    taker.join(0.3)
    assert not got  # round 1 may not start while round 0 runs
    queue.finished(a)
    taker.join(0.3)
    assert not got
    queue.requeue(b)  # b's worker died: b runs again, still in round 0
    assert queue.get(1) is b
    queue.finished(b)
    taker.join(2)
    assert got and got[0].sync == SyncSlot(1, 0, 2)


def test_synchronous_contributors_stay_on_their_worker_unless_it_is_down():
    queue = _Queue(synchronous=True)
    for i in range(2):
        queue.put(_closure(i, workers=2))
    up = {0: True, 1: True}
    got = []
    assert queue.get(0, up.get).sync.contributor == 0
    taker = threading.Thread(target=lambda: got.append(queue.get(0, up.get)), daemon=True)
    taker.start()
    taker.join(0.5)
    assert not got  # contributor 1 waits for worker 1 while it is up
    up[1] = False
    taker.join(2)
    assert got and got[0].sync.contributor == 1  # worker 1 down: worker 0 runs it


def test_an_error_cancels_the_queue_and_is_raised_once():
    queue = _Queue(synchronous=False)
    closures = [_closure(i) for i in range(3)]
    for c in closures:
        queue.put(c)
    running = queue.get()
    queue.finished(running, ValueError("boom"))
    with pytest.raises(FunctionCancelledError):
        closures[1].value.fetch()
    with pytest.raises(ValueError, match="boom"):
        queue.join()
    queue.join()  # raised once: the queue is usable again
    queue.put(_closure(5))
    assert queue.get().seq == 5


def test_a_fatal_error_is_raised_by_every_call():
    queue = _Queue(synchronous=False)
    queue.put(_closure(0))
    queue.fail(RuntimeError("ps gone"), fatal=True)
    for call in (queue.join, queue.raise_error, lambda: queue.put(_closure(1))):
        with pytest.raises(RuntimeError, match="ps gone"):
            call()
