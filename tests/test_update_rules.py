"""``cluster._update_rules``: the large-array SGD path is bitwise the plain NumPy rule."""

from __future__ import annotations

import numpy as np
import pytest

from cluster import _update_rules
from cluster._update_rules import sgd_update

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("size", [2 * (1 << 16) + 1, 5 * (1 << 16) + 12345])
def test_blocked_sgd_is_bitwise_keras_rule(dtype, size) -> None:
    rng = np.random.default_rng(size)
    value = rng.standard_normal(size).astype(dtype).reshape(-1, 1)
    grad = (rng.standard_normal(size) * 1e3).astype(dtype).reshape(-1, 1)
    assert _update_rules._blockable(value, grad)  # this size takes the blocked path
    want = value.copy()
    want -= dtype(0.037) * grad  # Keras' w -= lr * g, lr cast to the variable's dtype
    sgd_update(value, grad, None, learning_rate=0.037, momentum=0.0, nesterov=False)
    assert value.tobytes() == want.tobytes()


def test_small_strided_or_mixed_arrays_take_the_plain_rule() -> None:
    big = np.ones(3 << 16, np.float32)
    assert not _update_rules._blockable(np.ones(10, np.float32), np.ones(10, np.float32))
    assert not _update_rules._blockable(big[::2], big[::2])
    assert not _update_rules._blockable(big, big.astype(np.float64))
    value = np.ones(3 << 16, np.float32)[::2]  # strided: still updated, through the plain rule
    sgd_update(value, np.full(value.shape, 2, np.float32), None, learning_rate=0.5,
               momentum=0.0, nesterov=False)
    assert np.all(value == 0)
