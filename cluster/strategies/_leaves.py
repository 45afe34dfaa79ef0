"""What a leaf of a nest of values is to a strategy: plain or distributed, a framework tensor
shared by the replica threads, its first component; the checks every reduction and gather of a
strategy makes on a call's options and axes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cluster.collectives.options import CommunicationOptions
from cluster.values import DistributedValues
from cluster.variables import Variable

__all__ = ["call_options", "check_gather_rank", "first_component", "is_plain",
           "is_shared_tensor"]


def is_plain(value: Any) -> bool:
    """Neither a distributed value nor a variable: the same value for every replica."""
    return not isinstance(value, (DistributedValues, Variable))


def is_shared_tensor(value: Any) -> bool:
    """A framework tensor (not NumPy, not a Python number) that every replica thread passed as
    the very same object: what one model shared by the replicas produces."""
    return hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray | np.generic) \
        and not isinstance(value, DistributedValues | Variable)


def first_component(leaf: Any) -> Any:
    """The first local replica's component of ``leaf`` (a plain leaf is its own)."""
    return leaf.values[0] if isinstance(leaf, DistributedValues) else leaf


def call_options(call: Any, default: CommunicationOptions | None) -> CommunicationOptions | None:
    """A call's ``options`` argument, or the strategy's ``default`` when it is ``None``;
    ``TypeError`` for anything but :class:`CommunicationOptions`."""
    if call is None:
        return default
    if not isinstance(call, CommunicationOptions):
        raise TypeError(f"options must be a CommunicationOptions, got {call!r}")
    return call


def check_gather_rank(components: Sequence[Any], axis: int) -> None:
    """``ValueError`` unless every component has rank >= 1 and ``axis`` is one of its axes."""
    for c in components:
        if c.ndim == 0:
            raise ValueError(
                "gather/all_gather needs values of rank >= 1 (a scalar has no axis to "
                "concatenate along); reshape it to [1] first"
            )
        if not -c.ndim <= axis < c.ndim:
            raise ValueError(f"gather/all_gather: axis {axis} is out of range for rank {c.ndim}")
