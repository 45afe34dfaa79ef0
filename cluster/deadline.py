"""One monotonic deadline per operation, computed once and passed down."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

__all__ = ["Deadline"]


@dataclass(frozen=True)
class Deadline:
    """An absolute point on ``time.monotonic()``'s clock; ``math.inf`` means none.

    Create one at the top of an operation (``Deadline.after(timeout_seconds)``) and hand the same
    object to every blocking call below it, which waits at most ``remaining()``.
    """

    at: float

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """A deadline ``seconds`` from now; ``None`` gives one that never expires."""
        if seconds is None:
            return cls(math.inf)
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"timeout must be >= 0 seconds, got {seconds!r}")
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        """Seconds left, never negative; ``math.inf`` for a deadline that never expires."""
        return max(0.0, self.at - time.monotonic())

    def timeout(self) -> float | None:
        """``remaining()`` in the form ``threading`` and ``grpc`` expect: ``None`` for no limit."""
        return None if math.isinf(self.at) else self.remaining()

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at
