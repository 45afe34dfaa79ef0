"""Plain values of an elastic state (numbers, strings, lists, dicts, NumPy arrays): a copy that
later changes to the live value cannot reach, and an encoding without pickle to broadcast it.

The encoding is a JSON tree of ``[tag, payload]`` pairs plus a list of NumPy arrays that the tree
refers to by index:

=====  ===========================================  ==========================================
tag    value                                        payload
=====  ===========================================  ==========================================
``n``  ``None``                                     ``null``
``b``  ``bool``                                     ``true`` / ``false``
``i``  ``int``                                      the integer (any size)
``f``  ``float``                                    the float (JSON keeps every bit of finite
                                                    floats; ``NaN``/``Infinity`` allowed)
``s``  ``str``                                      the string
``l``  ``list``                                     the encoded items
``t``  ``tuple``                                    the encoded items
``d``  ``dict``                                     ``[[encoded key, encoded value], ...]``
``a``  ``numpy.ndarray``                            its index in the array list
``g``  a NumPy scalar (``np.float64(1.5)``)         its index in the array list (a 0-d array)
=====  ===========================================  ==========================================
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["Encoded", "decode", "encode", "is_plain"]

Encoded = tuple[str, list[np.ndarray]]
"""A plain value as JSON text and the arrays it refers to (private copies)."""

_SCALARS = (type(None), bool, int, float, str)


def is_plain(value: Any) -> bool:
    """Whether ``value`` is a plain value (see the module docstring), nests included."""
    if isinstance(value, _SCALARS) or isinstance(value, np.generic):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype != object
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(is_plain(k) and is_plain(v) for k, v in value.items())
    return False


def encode(value: Any, what: str) -> Encoded:
    """``value`` as JSON text and private copies of its arrays; ``TypeError`` naming ``what``
    and the position of anything that is not a plain value."""
    arrays: list[np.ndarray] = []
    tree = _encode(value, what, arrays)
    return json.dumps(tree, separators=(",", ":")), arrays


def decode(encoded: Encoded) -> Any:
    """A new value equal to the one :func:`encode` was given (arrays copied again, so the
    encoding stays unchanged whatever is done to the result)."""
    text, arrays = encoded
    return _decode(json.loads(text), arrays)


def _encode(value: Any, where: str, arrays: list[np.ndarray]) -> list[Any]:
    # bool before int: True is an int too.
    if value is None:
        return ["n", None]
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", int(value)]
    if isinstance(value, float):
        return ["f", float(value)]
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, np.generic):
        arrays.append(np.array(value))
        return ["g", len(arrays) - 1]
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"elastic.State: {where} is a NumPy array of Python objects; only "
                            "arrays of numbers (or bool) can be committed and broadcast")
        arrays.append(np.array(value, copy=True, order="C"))
        return ["a", len(arrays) - 1]
    if isinstance(value, (list, tuple)):
        tag = "l" if isinstance(value, list) else "t"
        return [tag, [_encode(v, f"{where}[{i}]", arrays) for i, v in enumerate(value)]]
    if isinstance(value, dict):
        return ["d", [[_encode(k, f"{where} (a key)", arrays),
                       _encode(v, f"{where}[{k!r}]", arrays)] for k, v in value.items()]]
    raise TypeError(
        f"elastic.State: {where} is a {type(value).__name__}; plain values are None, bool, int, "
        "float, str, NumPy arrays and scalars, and lists, tuples and dicts of them (anything "
        "else: track it as a cluster.Variable or through cluster.checkpoint's trackables)")


def _decode(node: list[Any], arrays: list[np.ndarray]) -> Any:
    tag, payload = node
    if tag in ("n", "b", "i", "f", "s"):
        return payload
    if tag == "a":
        return arrays[payload].copy()
    if tag == "g":
        return arrays[payload][()]
    if tag == "l":
        return [_decode(v, arrays) for v in payload]
    if tag == "t":
        return tuple(_decode(v, arrays) for v in payload)
    if tag == "d":
        return {_decode(k, arrays): _decode(v, arrays) for k, v in payload}
    raise ValueError(f"elastic.State: unknown tag {tag!r} in an encoded plain value")
