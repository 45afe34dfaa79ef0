"""Random and mutated requests against every method of every service a task serves,
with no token, a wrong one and the right one.

The contract checked, per call:

- without the token (none, or a wrong one): UNAUTHENTICATED, whatever the method and bytes;
- with it: OK or a client error (:data:`CLIENT_ERRORS`), never UNKNOWN, INTERNAL or UNAVAILABLE
  (an unexpected exception in a handler, a request the server could not parse by itself, a
  task that looks dead), and never no answer: every call has a generous deadline, which
  only a synchronous Push may use up (DEADLINE_EXCEEDED or ABORTED, its documented "the step
  did not complete in time"), because it alone waits for other callers; it gets a short one.

Afterwards the victim is alive, its RSS grew by less than :data:`MAX_GROWTH_MIB`, and it
still serves real peers (``assert_serves_real_peers``).

With the token the fuzz is a buggy peer, not an attacker: it leaves out ``Collective/Abort``
(a peer may abort the group, which then serves no one) and its Exchange streams name rank 3, a
rank no real peer holds, and always end cleanly, with the goodbye frame (a stream that breaks or
ends without it is a lost peer, which fails the group: also by design).
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.transport.endpoint import SRC_RANK_KEY
from cluster.transport.ps_client import PsClient
from tests.fuzz._strategies import METHODS, Method, frames, request_bytes
from tests.fuzz._victim import TASKS
from tests.fuzz.conftest import EXAMPLES, TOKEN, Victim, assert_serves_real_peers

# Examples take well under a second each; a developer's long run (CLUSTER_FUZZ_EXAMPLES) gets
# a timeout that grows with it.
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120 + 2 * EXAMPLES)]

CLIENT_ERRORS = frozenset({
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.PERMISSION_DENIED,
})
PUSH = "/cluster_runtime.v1.ParameterServer/Push"
PUSH_CHUNKS = "/cluster_runtime.v1.ParameterServer/PushChunks"
# A synchronous push waits for its step's other contributors (none come) until its deadline.
SHORT_DEADLINE = {path: (2.0, {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED})
                  for path in (PUSH, PUSH_CHUNKS)}
CALL_TIMEOUT = 60.0  # an answer must come; generous for a loaded 2-core machine
# Measured +7-8 MiB after 50 and after 500 examples per method (flat: warm-up, not a leak);
# the bound leaves room for glibc arenas of 32 RPC threads on a busy machine.
MAX_GROWTH_MIB = 32
WRONG = (("authorization", "Bearer not-the-token"),)
AUTHENTICATED = [m for m in METHODS if m.path != "/cluster_runtime.v1.Collective/Abort"]


def call(channel: grpc.Channel, method: Method, request, metadata, timeout: float
         ) -> grpc.StatusCode:
    """One call of ``method`` with raw request bytes (a list of them for a client stream);
    returns its status. A server stream is read to its first reply, then cancelled."""
    try:
        if method.client_streaming:
            channel.stream_unary(method.path)(iter(request), timeout=timeout, metadata=metadata)
        elif method.server_streaming:
            replies = channel.unary_stream(method.path)(request, timeout=timeout,
                                                        metadata=metadata)
            try:
                next(replies, None)
            finally:
                replies.cancel()
        else:
            channel.unary_unary(method.path)(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED and method.server_streaming:
            return grpc.StatusCode.OK  # our own cancel after the first reply
        return e.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def channel(victim: Victim):
    # A real variable for requests to find (the strategies' names include it), so that pulls,
    # pushes and assigns reach the store's code, not only its "no such variable".
    with PsClient(victim.address, TOKEN, task=TASKS[0]) as ps:
        ps.create("fuzz/var", np.zeros(4, np.float32), timeout=30)
    with grpc.insecure_channel(victim.address, options=[
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]) as c:
        yield c


@settings(max_examples=EXAMPLES * 2)
@given(method=st.sampled_from(METHODS), data=st.data(), metadata=st.sampled_from([(), WRONG]))
def test_without_the_token_every_method_answers_unauthenticated(channel, method, data,
                                                                metadata) -> None:
    if method.client_streaming:
        request = data.draw(frames(1))
    else:
        request = data.draw(request_bytes(method.request))
    assert call(channel, method, request, metadata, CALL_TIMEOUT) == \
        grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("method", AUTHENTICATED, ids=lambda m: m.path.rsplit(".", 1)[-1])
def test_with_the_token_every_reply_is_ok_or_a_client_error(channel, victim, method) -> None:
    timeout, also = SHORT_DEADLINE.get(method.path, (CALL_TIMEOUT, frozenset()))
    allowed = CLIENT_ERRORS | also

    @settings(max_examples=EXAMPLES)
    @given(data=st.data())
    def fuzz(data) -> None:
        metadata = TOKEN.metadata
        if method.client_streaming:
            request = data.draw(frames(3))
            src = data.draw(st.sampled_from(["3"] * 6 + ["", "4", "99", "-1", "x"]))
            metadata = (*metadata, (SRC_RANK_KEY, src))
        else:
            request = data.draw(request_bytes(method.request))
        code = call(channel, method, request, metadata, timeout)
        assert code in allowed, f"{method.path} answered {code.name} to {request!r}"

    fuzz()
    victim.assert_healthy()


def test_after_the_fuzz_the_victim_is_bounded_and_serves_real_peers(channel, victim) -> None:
    assert_serves_real_peers(victim, seq=1)
    growth = victim.status_mib("VmRSS") - victim.rss_before
    assert growth < MAX_GROWTH_MIB, f"victim grew {growth:.0f} MiB during the fuzz"
