"""Communication options, mirroring ``tf.distribute.experimental.CommunicationOptions``.

Process-wide choices (``CLUSTER_COLLECTIVE_PATH``, ``CLUSTER_COLLECTIVE_ALGORITHM``,
``CLUSTER_RING_LANES``) are parsed
here from a mapping the caller passes (:meth:`CollectiveSettings.from_env`); this package never
reads ``os.environ`` itself: ``cluster.settings`` does, once, at the edge.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "ALGORITHM_ENV",
    "LANES_ENV",
    "MAX_LANES",
    "PATH_ENV",
    "Algorithm",
    "CollectivePath",
    "CommunicationImplementation",
    "CommunicationOptions",
    "CollectiveSettings",
    "algorithm_from_env",
    "lanes_from_env",
    "path_from_env",
]


class CommunicationImplementation(enum.Enum):
    """Which implementation carries the collectives, like TensorFlow's enum of the same name.

    - ``AUTO``: chosen by the runtime: shared memory between the ranks of one host (reduce
      inside each host, ring across one leader per host, broadcast inside), and on the network
      recursive doubling for small messages, the ring for large ones.
    - ``RING``: the network for everything (the gRPC/TCP ring, whatever the hosts), the ring
      algorithms at every size. The switch that keeps the network path tested and measurable;
      ``CLUSTER_COLLECTIVE_PATH=network`` does the same for a whole process.
    - ``NCCL``: NVIDIA NCCL among GPUs inside a host; for host memory it is ``AUTO``.
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


@dataclass(frozen=True)
class CommunicationOptions:
    """Options for cross-process collectives (``tf.distribute.experimental.CommunicationOptions``).

    - ``bytes_per_pack``: ``all_reduce_many`` fuses consecutive tensors of one dtype into packs of
      at most this many bytes (a larger tensor travels alone). ``0`` lets the runtime decide: every
      tensor below a default size goes into one pack per dtype.
    - ``timeout_seconds``: deadline of each collective call. ``None`` (or ``0``, which disables
      the timeout in TensorFlow too) means no deadline.
    - ``implementation``: a :class:`CommunicationImplementation` or its name (any case, as
      TensorFlow accepts).

    Raises ``ValueError`` (as TensorFlow does) or ``TypeError`` with a message saying how to fix.
    """

    bytes_per_pack: int = 0
    timeout_seconds: float | None = None
    implementation: CommunicationImplementation = CommunicationImplementation.AUTO

    def __post_init__(self) -> None:
        bpp = self.bytes_per_pack
        if isinstance(bpp, bool) or not isinstance(bpp, int):
            raise TypeError(
                f"CommunicationOptions: bytes_per_pack must be an int number of bytes, got "
                f"{bpp!r}; pass e.g. bytes_per_pack=32 * 1024 * 1024, or 0 for automatic packing"
            )
        if bpp < 0:
            raise ValueError(
                f"CommunicationOptions: bytes_per_pack must be >= 0, got {bpp}; use 0 to let "
                "the runtime choose the pack size"
            )
        timeout = self.timeout_seconds
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                raise TypeError(
                    f"CommunicationOptions: timeout_seconds must be a number of seconds or None, "
                    f"got {timeout!r}"
                )
            if math.isnan(timeout) or timeout < 0:
                raise ValueError(
                    f"CommunicationOptions: timeout_seconds must be > 0 (or None / 0 for no "
                    f"timeout), got {timeout!r}"
                )
        impl = self.implementation
        if isinstance(impl, str):
            try:
                impl = CommunicationImplementation(impl.upper())
            except ValueError:
                raise ValueError(
                    f"CommunicationOptions: unknown implementation {self.implementation!r}; "
                    f"use one of {_implementation_names()}"
                ) from None
            object.__setattr__(self, "implementation", impl)
        if not isinstance(impl, CommunicationImplementation):
            raise ValueError(
                f"CommunicationOptions: implementation must be a CommunicationImplementation, "
                f"got {impl!r} ({type(impl).__name__}); use one of {_implementation_names()}"
            )

    @property
    def deadline_seconds(self) -> float | None:
        """``timeout_seconds`` with TensorFlow's "0 disables the timeout" applied."""
        return self.timeout_seconds or None


def _implementation_names() -> str:
    return ", ".join(f"CommunicationImplementation.{m.name}" for m in CommunicationImplementation)


class Algorithm(enum.Enum):
    """The all-reduce algorithm a group uses; ``AUTO`` picks by message size (doubling or
    ring); ``TREE``, the binomial tree, is only ever forced (see ``route.network_algorithm``)."""

    AUTO = "auto"
    RING = "ring"
    DOUBLING = "doubling"
    TREE = "tree"


ALGORITHM_ENV = "CLUSTER_COLLECTIVE_ALGORITHM"


def algorithm_from_env(environ: Mapping[str, str]) -> Algorithm:
    """The algorithm forced by ``CLUSTER_COLLECTIVE_ALGORITHM`` (``auto``, ``ring``, ``doubling``,
    ``tree``).

    Unset or empty means ``AUTO``. Raises ``ValueError`` naming the variable for other values.
    """
    return _choice_from_env(ALGORITHM_ENV, Algorithm, Algorithm.AUTO, environ)


class CollectivePath(enum.Enum):
    """How co-located ranks talk: ``AUTO`` (shared memory inside a host) or ``NETWORK``."""

    AUTO = "auto"
    NETWORK = "network"


PATH_ENV = "CLUSTER_COLLECTIVE_PATH"


def path_from_env(environ: Mapping[str, str]) -> CollectivePath:
    """The path forced by ``CLUSTER_COLLECTIVE_PATH`` (``auto``, the default, or ``network``).

    ``network`` sends everything over the network data plane, as
    ``CommunicationOptions(implementation=RING)`` does. Raises ``ValueError`` naming the variable
    for other values.
    """
    return _choice_from_env(PATH_ENV, CollectivePath, CollectivePath.AUTO, environ)


_E = TypeVar("_E", bound=enum.Enum)


def _choice_from_env(name: str, choices: type[_E], default: _E,
                     environ: Mapping[str, str]) -> _E:
    """The member of ``choices`` named by variable ``name`` (any case); unset or empty gives
    ``default``; anything else is a ``ValueError`` naming the variable and the choices."""
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    try:
        return choices(raw)
    except ValueError:
        valid = ", ".join(str(c.value) for c in choices)
        raise ValueError(f"{name}={raw!r} is not one of: {valid} (unset it for auto)") from None


LANES_ENV = "CLUSTER_RING_LANES"
MAX_LANES = 2
"""A ring all-reduce runs as one ring, or as two in opposite directions (each link's two
directions are its two lanes): see :mod:`~cluster.collectives.lanes`."""


def lanes_from_env(environ: Mapping[str, str]) -> int | None:
    """The lanes forced by ``CLUSTER_RING_LANES`` (``1`` or ``2``); unset, empty or ``auto``
    gives ``None`` (decided per host shape). Raises ``ValueError`` naming the variable for other
    values."""
    raw = environ.get(LANES_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw.isdigit() and 1 <= int(raw) <= MAX_LANES:
        return int(raw)
    raise ValueError(f"{LANES_ENV}={raw!r} is not one of: auto, 1, 2 (unset it for auto)")


@dataclass(frozen=True)
class CollectiveSettings:
    """Process-wide collective choices: ``path`` (``NETWORK`` keeps co-located ranks off shared
    memory), ``algorithm`` (forces the network all-reduce) and ``lanes`` (forces the network
    ring's lanes, 1 or 2; ``None`` decides per host shape). Defaults: all automatic."""

    path: CollectivePath = CollectivePath.AUTO
    algorithm: Algorithm = Algorithm.AUTO
    lanes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, CollectivePath):
            raise TypeError(f"path must be a CollectivePath, got {self.path!r}")
        if not isinstance(self.algorithm, Algorithm):
            raise TypeError(f"algorithm must be an Algorithm, got {self.algorithm!r}")
        lanes = self.lanes
        if lanes is not None and (isinstance(lanes, bool) or not isinstance(lanes, int)
                                  or not 1 <= lanes <= MAX_LANES):
            raise ValueError(f"lanes must be None (automatic), 1 or {MAX_LANES}, got {lanes!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CollectiveSettings:
        """Read ``CLUSTER_COLLECTIVE_PATH``, ``CLUSTER_COLLECTIVE_ALGORITHM`` and
        ``CLUSTER_RING_LANES`` from ``environ``; ``ValueError`` naming the variable for a bad
        value."""
        return cls(path_from_env(environ), algorithm_from_env(environ), lanes_from_env(environ))
