"""``all_reduce_many(..., in_place=True)``: every result lands in its own value (a lone value
reduced inside it, packed ones written back), the values come back, and values that cannot hold
their result are refused before anything moves. Runs on both paths (see ``conftest.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from tests._requires import require

from ._threads import make_groups, run_ranks

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_results_land_in_the_values(op: str, asynchronous: bool) -> None:
    hub, groups = make_groups(3)
    sizes = [1 << 18, 3, 5]  # 1 MiB of float32 travels alone; the small ones share a pack

    def body(rank: int) -> tuple[list[bool], list[np.ndarray], list[int]]:
        values = [np.full(n, float(rank + 1), np.float32) for n in sizes]
        addresses = [v.ctypes.data for v in values]
        group = groups[rank]
        if asynchronous:
            out = group.all_reduce_many_async(values, op, in_place=True).wait(50)
        else:
            out = group.all_reduce_many(values, op, in_place=True)
        same = [o is v for o, v in zip(out, values, strict=True)]
        return same, values, [v.ctypes.data - a for v, a in zip(values, addresses, strict=True)]

    want = 6.0 if op == "SUM" else 2.0
    for same, values, moved in run_ranks(body, 3, timeout=50):
        assert all(same) and moved == [0, 0, 0]
        assert all(np.all(v == want) for v in values)


def test_torch_tensors_are_reduced_in_place() -> None:
    torch = require("torch")
    hub, groups = make_groups(2)

    def body(rank: int) -> tuple[bool, list[float]]:
        big = torch.full((1 << 18,), float(rank + 1))
        small = torch.full((2,), 10.0 * (rank + 1))
        out = groups[rank].all_reduce_many([big, small], "SUM", in_place=True)
        return out[0] is big and out[1] is small, [float(big[0]), float(big[-1]), float(small[1])]

    for same, got in run_ranks(body, 2, timeout=50):
        assert same and got == [3.0, 3.0, 30.0]


@pytest.mark.parametrize("bad", ["list", "strided", "readonly"])
def test_values_that_cannot_hold_their_result_are_refused(bad: str) -> None:
    hub, groups = make_groups(2)

    def body(rank: int) -> tuple[str, float]:
        if bad == "list":
            value = [1.0, 2.0]
        elif bad == "strided":
            value = np.ones(8, np.float32)[::2]
        else:
            value = np.ones(4, np.float32)
            value.flags.writeable = False
        with pytest.raises(ValueError, match=r"in_place=True\): value 0") as refused:
            groups[rank].all_reduce_many([value], "SUM", in_place=True)
        ok = np.ones(4, np.float32)
        groups[rank].all_reduce_many([ok], "SUM", in_place=True)  # the group goes on
        return str(refused.value), float(ok[0])

    for _, value in run_ranks(body, 2, timeout=50):
        assert value == 2.0
