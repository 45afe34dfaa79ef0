"""The default strategy: what ``get_strategy()`` returns outside every scope (one replica, no
distribution), and ``OneDeviceStrategy``, which places its single replica on one device.

:mod:`cluster._context` sits below the strategies and so cannot import this module: the package
root hands it :func:`default_frame` as a factory, called on first use.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache

from cluster import _context
from cluster.cross_device_ops import ReductionToOneDevice
from cluster.strategies._devices import parse_devices
from cluster.strategies.base import Strategy, StrategyExtended
from cluster.strategies.replica import ReplicaContext

__all__ = ["OneDeviceStrategy", "default_frame"]


class _DefaultStrategy(Strategy, _context.DefaultStrategyMarker):
    """One CPU replica, variables stay plain, ``reduce`` returns its value."""

    def __init__(self) -> None:
        devices = parse_devices(["/cpu:0"], what="default strategy")
        super().__init__(StrategyExtended(self, devices, ReductionToOneDevice()))

    def scope(self):
        """Changes nothing, but like TF refuses to nest inside another strategy's scope or run
        ("Must not nest tf.distribute.Strategy scopes")."""
        if _context.has_strategy():
            raise RuntimeError(
                f"the default strategy's scope cannot be entered inside "
                f"{_context.describe(_context.get_strategy())}'s scope or run; leave it first"
            )
        return contextlib.nullcontext(self)

    # run is Strategy.run: fn runs in this thread, in a replica context of its own (not the
    # default one), so reduce/gather/run inside it raise as in TF.


@lru_cache(maxsize=1)
def default_frame() -> _context.Frame:
    """The frame of a thread outside every strategy: the default strategy (created on first use,
    then shared) in its default replica context."""
    strategy = _DefaultStrategy()
    return _context.Frame(strategy, ReplicaContext(strategy, 0))


class _OneDeviceExtended(StrategyExtended):
    def _check_aggregation_dtype(self, aggregation, dtype, name) -> None:
        pass  # TF's OneDeviceStrategy makes plain variables: any aggregation, any dtype


class OneDeviceStrategy(Strategy):
    """All computation on one device: ``OneDeviceStrategy("/cpu:0")`` or ``("/gpu:0")``."""

    def __init__(self, device: str) -> None:
        devices = parse_devices([device], what="OneDeviceStrategy(device)")
        super().__init__(_OneDeviceExtended(self, devices, ReductionToOneDevice()))
