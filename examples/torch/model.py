"""The torch example's CNN and its data, shared by ``train.py``, its test and
``bench/torch_ddp.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

DIGITS = Path(__file__).resolve().parent.parent / "quickstart" / "digits.npz"

SIZES = {"small": ((16, 32), 64), "1M": ((32, 64), 960), "10M": ((32, 64), 9728)}
"""Model variants: ``(conv channels, hidden units)``; ~37k, ~1.0M and ~10.0M parameters."""


def make_model(size: str = "small", seed: int = 0) -> nn.Module:
    """A CNN for 8x8 digits: two 3x3 convolutions, a 2x2 max-pool, two linear layers.
    Same ``seed``, same initial parameters (in any process)."""
    (c1, c2), hidden = SIZES[size]
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(c2 * 16, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def load_digits() -> tuple[torch.Tensor, ...]:
    """``x_train, y_train, x_test, y_test`` (the quickstart's split: 1437 / 360 digits)."""
    with np.load(DIGITS) as data:
        return tuple(torch.from_numpy(data[k]) for k in ("x_train", "y_train", "x_test",
                                                          "y_test"))


def global_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[torch.Tensor]:
    """Row indices of each global batch of an epoch: the same shuffle on every process (the
    quickstart's rule)."""
    order = torch.from_numpy(np.random.default_rng(seed * 7919 + epoch).permutation(n))
    return list(order.split(batch_size))
