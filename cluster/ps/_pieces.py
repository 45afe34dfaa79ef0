"""A gradient received in pieces: views of the messages that carried it, never joined by copy.

A ``PushChunks`` stream (``proto/ps.proto``) carries a large gradient in chunks, one per
message, so that the sender writes chunk k+1 while chunk k travels. The receiver keeps each
chunk as the read-only view of its message that ``_ps_codec`` parses, and the store applies its
(elementwise) update rule one piece at a time on the matching slices of the variable and its
slots: the same bytes as one update over the joined gradient, without a copy to join it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GradientPieces", "PieceAssembler"]


@dataclass(frozen=True)
class GradientPieces:
    """A gradient of ``shape`` and ``dtype`` as ``pieces``: ``(start, flat)`` pairs, ``flat`` a
    1-D array holding elements ``[start, start + flat.size)`` of the C-order flattened gradient.
    The pieces cover every element exactly once (:class:`PieceAssembler` checks it); their order
    is unspecified."""

    shape: tuple[int, ...]
    dtype: np.dtype
    pieces: tuple[tuple[int, np.ndarray], ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def join(self) -> np.ndarray:
        """The whole gradient as one new array (a copy; for paths that keep the gradient)."""
        out = np.empty(self.size, self.dtype)
        for start, flat in self.pieces:
            out[start:start + flat.size] = flat
        return out.reshape(self.shape)


@dataclass
class _Partial:
    shape: tuple[int, ...]
    dtype: np.dtype
    pieces: list[tuple[int, np.ndarray]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # sorted: overlap is checked on neighbours
    ends: list[int] = field(default_factory=list)  # ends[i] belongs to starts[i]
    filled: int = 0


class PieceAssembler:
    """Collects the chunks of a stream's gradients, checking each as it arrives.

    :meth:`add` refuses (``ValueError`` naming the gradient and the fix) a chunk whose dtype or
    shape differs from an earlier chunk of its gradient, one overlapping an earlier chunk, one
    reaching past the tensor's end, and more than ``1 + total_bytes // min_piece_bytes`` chunks
    of one gradient (so that a peer cannot make us hold a Python object per few bytes it sends:
    memory stays proportional to the bytes received, which the caller bounds by the variables'
    sizes). :meth:`finish` refuses a gradient with elements no chunk covered.
    """

    def __init__(self, min_piece_bytes: int) -> None:
        self.min_piece_bytes = min_piece_bytes
        self._partial: dict[str, _Partial] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._partial

    def add(self, name: str, shape: tuple[int, ...], dtype: np.dtype, start: int,
            flat: np.ndarray) -> None:
        """Record ``flat`` as elements ``[start, start + flat.size)`` of gradient ``name``."""
        partial = self._partial.get(name)
        if partial is None:
            partial = self._partial[name] = _Partial(shape, dtype)
        elif partial.shape != shape or partial.dtype != dtype:
            raise ValueError(f"push: chunks of the gradient of {name} disagree on its tensor: "
                             f"{partial.shape} {partial.dtype}, then {shape} {dtype}; every "
                             "chunk of a gradient names the whole tensor's dtype and shape")
        size = math.prod(shape)
        if flat.size == 0 and size:
            raise ValueError(f"push: an empty chunk of the gradient of {name}; leave it out")
        if start < 0 or start + flat.size > size:
            raise ValueError(f"push: a chunk of the gradient of {name} holds elements "
                             f"[{start}, {start + flat.size}) of a {size}-element tensor")
        limit = 1 + size * dtype.itemsize // self.min_piece_bytes
        if len(partial.pieces) >= limit:
            raise ValueError(f"push: the gradient of {name} came in more than {limit} chunks; "
                             f"send chunks of {self.min_piece_bytes} bytes or more (all but "
                             "one may be smaller)")
        end = start + flat.size
        i = bisect.bisect_right(partial.starts, start)
        if (i and partial.ends[i - 1] > start) or (i < len(partial.starts)
                                                    and partial.starts[i] < end):
            raise ValueError(f"push: chunks of the gradient of {name} overlap at elements "
                             f"[{start}, {end}); send each element once")
        partial.starts.insert(i, start)
        partial.ends.insert(i, end)
        partial.pieces.append((start, flat))
        partial.filled += flat.size

    def finish(self) -> dict[str, np.ndarray | GradientPieces]:
        """Each gradient, in first-chunk order: the chunk's own view when one chunk holds all
        of it, else its :class:`GradientPieces`."""
        out: dict[str, np.ndarray | GradientPieces] = {}
        for name, partial in self._partial.items():
            size = math.prod(partial.shape)
            if partial.filled != size:
                raise ValueError(f"push: the chunks of the gradient of {name} hold "
                                 f"{partial.filled} of its {size} elements; send all of them")
            if len(partial.pieces) == 1:
                out[name] = partial.pieces[0][1].reshape(partial.shape)
            else:
                out[name] = GradientPieces(partial.shape, partial.dtype,
                                           tuple(partial.pieces))
        return out
