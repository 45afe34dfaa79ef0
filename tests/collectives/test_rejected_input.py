"""Bad input is rejected on each rank before any byte moves, and the group survives it.

A bool tensor, or a torch tensor that requires grad, passed to a collective must not abort the
group: every rank validates its input locally; when every rank rejects (the same
code everywhere), each raises its own error and the next collective works.
"""

from __future__ import annotations

import numpy as np
import pytest

from cluster.collectives import CommunicationOptions
from tests._requires import require

from ._threads import make_groups, run_ranks

torch = require("torch")


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda r: np.ones(3, bool), id="numpy-bool"),
        pytest.param(lambda r: torch.ones(3, dtype=torch.bool), id="torch-bool"),
        pytest.param(lambda r: torch.ones(3, requires_grad=True), id="torch-requires-grad"),
        pytest.param(lambda r: "text", id="str"),
    ],
)
def test_every_rank_rejects_and_the_group_goes_on(bad) -> None:
    hub, groups = make_groups(3)

    def rank(r: int) -> object:
        with pytest.raises(TypeError) as rejected:
            groups[r].all_reduce(bad(r))
        after = groups[r].all_reduce(np.full(4, r + 1, np.float32))
        many = groups[r].all_reduce_many([np.ones(2, np.float32), np.ones(3, np.int32)])
        return rejected.value, after, many

    for error, after, many in run_ranks(rank, 3, transports=hub.transports, timeout=30):
        assert "dtype" in str(error) or "requires grad" in str(error) or "type" in str(error)
        assert after.tolist() == [6.0] * 4
        assert [m.tolist() for m in many] == [[3.0, 3.0], [3, 3, 3]]


def test_rejected_options_and_arguments_keep_the_group() -> None:
    hub, groups = make_groups(2)

    def rank(r: int) -> object:
        errors = []
        for call in (
            lambda: groups[r].all_reduce(np.ones(2), "PROD"),
            lambda: groups[r].broadcast(np.ones(2), root=7),
            lambda: groups[r].all_gather(np.float32(1.0)),
            lambda: groups[r].all_reduce(np.ones(2), options="fast"),
        ):
            with pytest.raises((TypeError, ValueError)) as info:
                call()
            errors.append(type(info.value).__name__)
        return errors, groups[r].all_reduce(np.ones(2, np.float32)).tolist()

    for errors, result in run_ranks(rank, 2, transports=hub.transports, timeout=30):
        assert errors == ["ValueError", "ValueError", "ValueError", "TypeError"]
        assert result == [2.0, 2.0]


def test_a_rejected_async_call_fails_its_work_and_the_group_goes_on() -> None:
    hub, groups = make_groups(2)

    def rank(r: int) -> object:
        bad = groups[r].all_reduce_async(torch.ones(2, dtype=torch.bool))
        good = groups[r].all_reduce_async(torch.ones(2))
        with pytest.raises(TypeError, match="bool"):
            bad.wait(timeout=20)
        return good.wait(timeout=20)

    for result in run_ranks(rank, 2, transports=hub.transports, timeout=30):
        assert isinstance(result, torch.Tensor) and result.tolist() == [2.0, 2.0]


def test_a_rank_alone_with_bad_input_does_not_leave_its_peers_waiting() -> None:
    """No deadline is involved: the peers learn at once (the call's timeout is far away)."""
    hub, groups = make_groups(2)
    options = CommunicationOptions(timeout_seconds=600)

    def rank(r: int) -> object:
        value = torch.ones(2, dtype=torch.bool) if r == 0 else torch.ones(2)
        return groups[r].all_reduce(value, options=options)

    outcomes = run_ranks(rank, 2, transports=hub.transports, return_exceptions=True, timeout=30)
    assert isinstance(outcomes[0], TypeError)
    assert any("group is aborted" in note for note in outcomes[0].__notes__)
    assert "worker:0" in str(outcomes[1]) and "rejected all_reduce" in str(outcomes[1])
