"""NumPy random generators as trackables: the bit generator's state as one uint64 tensor.

``Checkpoint(rng=np.random.default_rng(0))`` saves ``rng/bit_generator_state``, and restoring
sets the tracked generator's state in place, so its next draws are exactly those an
uninterrupted run would have made. Any bit generator whose ``.state`` is a dict of ints (up to
128 bits), int arrays, nested dicts and its ``bit_generator`` name works: PCG64, PCG64DXSM,
Philox, SFC64, MT19937.

Layout of the uint64 vector (no pickle, and readable without NumPy's help):

- words 0-3: the bit generator's name (``"PCG64"``), ASCII, zero-padded to 32 bytes;
- then every value of ``.state`` other than the name, walking dict keys in sorted order: an int
  as two words (low, high 64 bits), an int array as one word per element (C order).

A ``random.Random`` is saved as ``<path>/random_state``: 628 uint64 words, ``getstate()``'s
version, its 625 Mersenne Twister words, then 1 and the bits of the cached Gaussian draw
(``gauss()`` makes two at a time) or 0 and 0. ``random.SystemRandom`` has no state and is refused.

The layout depends only on the bit generator type, so a freshly made generator of the same type
fixes the shape to restore into. A checkpoint of another bit generator is refused with
``ValueError`` naming the tensor before any tracked object changes.

Under ``MultiWorkerMirroredStrategy`` the chief's generator is saved and every task restores
it: generators that must differ per task should be derived from a saved one and the task index
after restoring, not tracked one per task.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["RANDOM_STATE", "STATE", "describe", "random_entry_parts", "rng_entry_parts"]

STATE = "bit_generator_state"
RANDOM_STATE = "random_state"
_RANDOM_VERSION = 3  # random.Random.getstate()'s format version since Python 2.4
_RANDOM_WORDS = 1 + 625 + 2
_NAME_WORDS = 4
_INT_WORDS = 2  # PCG64's state and increment are 128-bit integers
_MASK = (1 << 64) - 1


def _name_of(generator: np.random.Generator) -> str:
    return generator.bit_generator.state["bit_generator"]


def describe(generator: np.random.Generator | random.Random) -> dict[str, Any]:
    """What the index records about a generator (for people and tools)."""
    if isinstance(generator, random.Random):
        return {"kind": "rng", "type": f"random.{type(generator).__name__}"}
    return {"kind": "rng", "type": "numpy.random.Generator", "bit_generator": _name_of(generator)}


def _encode_name(name: str) -> list[int]:
    raw = name.encode("ascii")
    if len(raw) > 8 * _NAME_WORDS:
        raise ValueError(f"Checkpoint: bit generator name {name!r} is longer than "
                         f"{8 * _NAME_WORDS} bytes")
    return np.frombuffer(raw.ljust(8 * _NAME_WORDS, b"\0"), "<u8").tolist()


def _decode_name(words: np.ndarray) -> str:
    raw = np.asarray(words[:_NAME_WORDS], "<u8").tobytes().rstrip(b"\0")
    return raw.decode("ascii", errors="replace")


def _flatten(value: Any, where: str, out: list[int]) -> None:
    if isinstance(value, dict):
        for key in sorted(value):
            if where == "" and key == "bit_generator":
                continue  # the name: words 0-3
            _flatten(value[key], f"{where}/{key}", out)
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        number = int(value)
        if not 0 <= number < 1 << (64 * _INT_WORDS):
            raise ValueError(f"Checkpoint: generator state {where} = {number} does not fit "
                             f"{64 * _INT_WORDS} unsigned bits")
        out.extend([number & _MASK, number >> 64])
    elif isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        if value.dtype.kind == "i" and (value < 0).any():
            raise ValueError(f"Checkpoint: generator state {where} has negative entries")
        out.extend(value.astype(np.uint64).reshape(-1).tolist())
    else:
        raise TypeError(f"Checkpoint: generator state {where} is a {type(value).__name__}; "
                        "only ints, int arrays and dicts of them can be saved")


def _unflatten(template: Any, words: np.ndarray, pos: int, where: str) -> tuple[Any, int]:
    """The value shaped like ``template`` read from ``words[pos:]``, and the next position."""
    if isinstance(template, dict):
        out = {}
        for key in sorted(template):
            if where == "" and key == "bit_generator":
                out[key] = template[key]
                continue
            out[key], pos = _unflatten(template[key], words, pos, f"{where}/{key}")
        return out, pos
    if isinstance(template, np.ndarray):
        flat = words[pos:pos + template.size]
        if template.dtype.itemsize < 8 and (flat > np.iinfo(template.dtype).max).any():
            raise ValueError(f"generator state {where} holds values too large for "
                             f"{template.dtype}")
        return flat.astype(template.dtype).reshape(template.shape), pos + template.size
    low, high = (int(w) for w in words[pos:pos + _INT_WORDS])
    return low | high << 64, pos + _INT_WORDS


def _words(generator: np.random.Generator) -> np.ndarray:
    state = generator.bit_generator.state
    out = _encode_name(state["bit_generator"])
    _flatten(state, "", out)
    return np.array(out, np.uint64)


def rng_entry_parts(path: str, generator: np.random.Generator) -> tuple[
        str, np.dtype, tuple[int, ...], Callable[[], np.ndarray], Callable[[np.ndarray], None],
        Callable[[np.ndarray], None]]:
    """``(name, dtype, shape, read, apply, check)`` of the generator's one tensor; ``check``
    raises ``ValueError`` naming the tensor when it holds another bit generator's state."""
    name = f"{path}/{STATE}"
    shape = _words(generator).shape  # the layout is fixed by the bit generator type

    def check(array: np.ndarray) -> None:
        if array.dtype != np.uint64 or array.ndim != 1 or array.size < _NAME_WORDS:
            return  # the dtype/shape check names the mismatch
        saved, tracked = _decode_name(array), _name_of(generator)
        if saved != tracked:
            raise ValueError(f"Checkpoint: {name} holds a {saved!r} bit generator state but the "
                             f"tracked generator at {path} uses {tracked!r}; restore into a "
                             f"Generator of {saved}")
        if array.shape == shape:
            try:  # values that do not fit are refused now, before anything is restored
                _unflatten(generator.bit_generator.state, np.asarray(array, np.uint64),
                           _NAME_WORDS, "")
            except ValueError as e:
                raise ValueError(f"Checkpoint: {name}: {e}") from e

    def apply(array: np.ndarray) -> None:
        template = generator.bit_generator.state
        state, _ = _unflatten(template, np.asarray(array, np.uint64), _NAME_WORDS, "")
        generator.bit_generator.state = state

    return name, np.dtype(np.uint64), shape, lambda: _words(generator), apply, check


def random_entry_parts(path: str, generator: random.Random) -> tuple[
        str, np.dtype, tuple[int, ...], Callable[[], np.ndarray], Callable[[np.ndarray], None],
        Callable[[np.ndarray], None]]:
    """``(name, dtype, shape, read, apply, check)`` of a ``random.Random``'s one tensor."""
    name = f"{path}/{RANDOM_STATE}"

    def read() -> np.ndarray:
        version, words, gauss = generator.getstate()
        cached = [0, 0] if gauss is None else [1, int(np.float64(gauss).view(np.uint64))]
        return np.array([version, *words, *cached], np.uint64)

    def check(array: np.ndarray) -> None:
        if array.dtype == np.uint64 and array.shape == (_RANDOM_WORDS,) \
                and int(array[0]) != _RANDOM_VERSION:
            raise ValueError(f"Checkpoint: {name} holds a random.Random state of version "
                             f"{int(array[0])}; this Python reads version {_RANDOM_VERSION}")

    def apply(array: np.ndarray) -> None:
        gauss = float(array[-1:].view(np.float64)[0]) if int(array[-2]) else None
        generator.setstate((int(array[0]), tuple(int(w) for w in array[1:-2]), gauss))

    return name, np.dtype(np.uint64), (_RANDOM_WORDS,), read, apply, check
