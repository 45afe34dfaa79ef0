"""The coordinator's parts without a cluster: reply MACs and the worker's runner (the queue:
test_queue.py)."""

from __future__ import annotations

import threading

import cloudpickle
import pytest

from cluster.coordinator._calls import Call, ResourceRef, ResourceSpec, WorkerState
from cluster.coordinator._reply_mac import reply_mac, verify_reply
from cluster.errors import OutOfRangeError
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
