"""Torch and JAX values through the collectives: they come back in their own family, shape and
dtype (JAX stays JAX, 0-d tensors stay 0-d, bfloat16 is reduced)."""

from __future__ import annotations

import numpy as np
import pytest

from tests._requires import require

from ._threads import make_groups, run_ranks

torch = require("torch")
jax = require("jax")
jnp = require("jax.numpy")


def test_jax_arrays_come_back_as_jax_with_their_dtype() -> None:
    hub, groups = make_groups(2)
    values = [jnp.arange(6.0).reshape(2, 3), jnp.ones(3, jnp.bfloat16), jnp.float32(2.5),
              jnp.arange(4, dtype=jnp.int32)]
    outs = run_ranks(lambda r: [groups[r].all_reduce(v) for v in values], 2,
                     transports=hub.transports, timeout=60)
    for out in outs:
        for value, result in zip(values, out, strict=True):
            assert isinstance(result, jax.Array), type(result)
            assert result.shape == value.shape and result.dtype == value.dtype
            np.testing.assert_array_equal(np.asarray(result, np.float64),
                                          2 * np.asarray(value, np.float64))


def test_a_0d_tensor_stays_0d() -> None:
    hub, groups = make_groups(2)
    outs = run_ranks(lambda r: (groups[r].all_reduce(torch.tensor(1.5)),
                                groups[r].all_reduce_many([torch.tensor(2), torch.ones(2)])),
                     2, transports=hub.transports, timeout=60)
    for single, (a, b) in outs:
        assert single.shape == () and single.item() == 3.0
        assert a.shape == () and a.dtype == torch.int64 and a.item() == 4 and b.shape == (2,)


def test_bfloat16_tensors_are_reduced_with_ml_dtypes() -> None:
    require("ml_dtypes")
    hub, groups = make_groups(2)
    value = torch.tensor([1.5, -2.0, 3.0], dtype=torch.bfloat16)
    outs = run_ranks(lambda r: groups[r].all_reduce(value, "MEAN"), 2,
                     transports=hub.transports, timeout=60)
    for out in outs:
        assert out.dtype == torch.bfloat16 and out.tolist() == [1.5, -2.0, 3.0]


def test_a_dtype_problem_gets_a_dtype_hint_not_detach() -> None:
    hub, groups = make_groups(1)
    with pytest.raises(TypeError) as info:
        groups[0].all_reduce(torch.ones(2, dtype=torch.complex64))
    assert "dtype" in str(info.value) and "detach" not in str(info.value)
    with pytest.raises(TypeError, match="requires grad.*detach"):
        groups[0].all_reduce(torch.ones(2, requires_grad=True))


def test_every_array_family_comes_back_in_its_own() -> None:
    hub, groups = make_groups(2)

    def rank(r: int) -> object:
        g = groups[r]
        works = [g.all_reduce_async(v) for v in (
            torch.tensor(1.5), torch.ones(2, dtype=torch.bfloat16), jnp.ones((2, 2)), 2.0, [1, 2])]
        return [w.wait(timeout=30) for w in works]

    for t0, tb, j, f, lst in run_ranks(rank, 2, transports=hub.transports, timeout=60):
        assert isinstance(t0, torch.Tensor) and t0.shape == () and t0.item() == 3.0
        assert tb.dtype == torch.bfloat16 and tb.tolist() == [2.0, 2.0]
        assert type(j).__module__.startswith("jax") and j.shape == (2, 2) and float(j[0, 0]) == 2
        assert f == 4.0 and lst.tolist() == [2, 4] and lst.dtype == np.int32


