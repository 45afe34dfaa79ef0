"""Nested structures of values (tuples, lists, mappings, namedtuples), as ``tf.nest`` sees them.

The one nest implementation of cluster-runtime: strategies, the coordinator and distributed input
all use it. Tuples, lists and ``collections.abc.Mapping`` instances (dicts, OrderedDicts, ...)
are containers; everything else is a leaf: arrays, scalars, strings, variables and distributed
values.

Mappings flatten in sorted key order, as ``tf.nest`` does, so two ranks that build the same dict
in different insertion orders still agree on which leaf is which. Keys that cannot be compared
with each other (``{1: a, "b": c}``, which ``tf.nest`` refuses) flatten in insertion order.
Rebuilding keeps each container's type and its insertion order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "assert_same_structure",
    "flatten",
    "flatten_with_paths",
    "map_structure",
    "pack_sequence_as",
]


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _sorted_keys(mapping: Mapping) -> list[Any]:
    try:
        return sorted(mapping)
    except TypeError:  # keys of several incomparable types: no sorted order exists
        return list(mapping)


def flatten(structure: Any) -> list[Any]:
    """The leaves of ``structure``, depth first, mappings in sorted key order."""
    out: list[Any] = []
    _flatten_into(structure, out)
    return out


def _flatten_into(structure: Any, out: list[Any]) -> None:
    if isinstance(structure, Mapping):
        for key in _sorted_keys(structure):
            _flatten_into(structure[key], out)
    elif isinstance(structure, (tuple, list)):
        for item in structure:
            _flatten_into(item, out)
    else:
        out.append(structure)


def flatten_with_paths(structure: Any, root: str = "") -> list[tuple[str, Any]]:
    """``(path, leaf)`` for every leaf, in :func:`flatten` order; a path is ``root`` followed by
    the indexing that reaches the leaf: ``flatten_with_paths({"x": (a,)}, "batch")`` is
    ``[("batch['x'][0]", a)]``. (A second walk rather than a flag on :func:`flatten`, which is
    on every step's path and should not build strings.)"""
    out: list[tuple[str, Any]] = []
    _flatten_paths_into(structure, root, out)
    return out


def _flatten_paths_into(structure: Any, path: str, out: list[tuple[str, Any]]) -> None:
    if isinstance(structure, Mapping):
        for key in _sorted_keys(structure):
            _flatten_paths_into(structure[key], f"{path}[{key!r}]", out)
    elif isinstance(structure, (tuple, list)):
        for i, item in enumerate(structure):
            _flatten_paths_into(item, f"{path}[{i}]", out)
    else:
        out.append((path, structure))


def pack_sequence_as(structure: Any, leaves: Sequence[Any]) -> Any:
    """Rebuild ``structure`` with ``leaves`` (in :func:`flatten` order) in place of its leaves.

    Containers keep their type (a mapping type whose constructor takes other arguments, such as
    ``defaultdict``, becomes a ``dict``). Raises ``ValueError`` when the number of leaves differs
    from the structure's.
    """
    it = iter(leaves)
    result = _pack(structure, it)
    if next(it, _END) is not _END:
        raise ValueError("pack_sequence_as: more leaves than the structure has places for")
    return result


_END = object()


def _pack(structure: Any, it: Iterator[Any]) -> Any:
    if isinstance(structure, Mapping):
        packed = {key: _pack(structure[key], it) for key in _sorted_keys(structure)}
        items = [(key, packed[key]) for key in structure]
        try:
            return type(structure)(items)
        except TypeError:  # e.g. defaultdict, whose first argument is its default factory
            return dict(items)
    if _is_namedtuple(structure):
        return type(structure)(*[_pack(item, it) for item in structure])
    if isinstance(structure, (tuple, list)):
        return type(structure)(_pack(item, it) for item in structure)
    leaf = next(it, _END)
    if leaf is _END:
        raise ValueError("pack_sequence_as: fewer leaves than the structure has places for")
    return leaf


def _signature(structure: Any) -> Any:
    if isinstance(structure, Mapping):
        return ("dict", tuple((k, _signature(structure[k])) for k in _sorted_keys(structure)))
    if _is_namedtuple(structure):
        return (type(structure).__qualname__, tuple(_signature(x) for x in structure))
    if isinstance(structure, (tuple, list)):
        return (type(structure).__name__, tuple(_signature(x) for x in structure))
    return "*"


def assert_same_structure(first: Any, second: Any, what: str = "values") -> None:
    """Raise ``ValueError`` naming ``what`` unless both nests have the same shape of containers."""
    if _signature(first) != _signature(second):
        raise ValueError(
            f"{what} do not have the same nested structure: {_describe(first)} vs "
            f"{_describe(second)}. Return (or pass) the same kind of tuple/list/dict, with the "
            "same keys and lengths, from every replica"
        )


def _describe(structure: Any) -> str:
    text = repr(_signature(structure))
    return text if len(text) <= 200 else text[:197] + "..."


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """``fn`` applied leaf-wise over nests of the same structure."""
    if not structures:
        raise ValueError("map_structure needs at least one structure")
    for other in structures[1:]:
        assert_same_structure(structures[0], other)
    flats = [flatten(s) for s in structures]
    return pack_sequence_as(structures[0], [fn(*leaves) for leaves in zip(*flats, strict=True)])
