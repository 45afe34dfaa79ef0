"""cluster/_nest.py: the one nest implementation (strategies, coordinator, distributed input)."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from types import MappingProxyType

import pytest

from cluster import _nest, data, errors

Point = namedtuple("Point", ["x", "y"])


@pytest.mark.parametrize(("structure", "leaves"), [
    (1, [1]),
    ((), []),
    ((1, [2, 3]), [1, 2, 3]),
    # Mappings flatten in sorted key order (tf.nest), whatever the insertion order.
    ({"b": 1, "a": 2}, [2, 1]),
    (OrderedDict(b=1, a=2), [2, 1]),
    (MappingProxyType({"b": 1, "a": 2}), [2, 1]),
    ({"y": (1, {"d": 2, "c": 3}), "x": Point(4, 5)}, [4, 5, 1, 3, 2]),
    # Keys with no order among them: insertion order.
    ({2: "two", "a": "a", 1: "one"}, ["two", "a", "one"]),
    # Strings, None and arrays-like are leaves.
    (("ab", None), ["ab", None]),
])
def test_flatten_order(structure, leaves) -> None:
    assert _nest.flatten(structure) == leaves
    assert [leaf for _, leaf in _nest.flatten_with_paths(structure)] == leaves


@pytest.mark.parametrize(("structure", "root", "paths"), [
    ({"x": (1,), "w": 2}, "batch", ["batch['w']", "batch['x'][0]"]),
    ((1, [2]), "", ["[0]", "[1][0]"]),
    (Point(1, 2), "p", ["p[0]", "p[1]"]),
    (7, "leaf", ["leaf"]),
])
def test_flatten_with_paths_names_the_indexing(structure, root, paths) -> None:
    assert [path for path, _ in _nest.flatten_with_paths(structure, root)] == paths


@pytest.mark.parametrize("structure", [
    {"b": 1, "a": 2},
    OrderedDict(b=1, a=2),
    (1, [2, Point(3, 4)], {"k": (5,)}),
    [{"z": 1, "y": [2, 3]}],
    {2: "two", "a": "a"},
])
def test_pack_inverts_flatten_and_keeps_types_and_insertion_order(structure) -> None:
    packed = _nest.pack_sequence_as(structure, _nest.flatten(structure))
    assert packed == structure
    assert type(packed) is type(structure)
    if isinstance(structure, dict):
        assert list(packed) == list(structure)


def test_a_mapping_whose_constructor_takes_other_arguments_packs_as_a_dict() -> None:
    packed = _nest.pack_sequence_as(defaultdict(list, {"k": 1}), [2])
    assert packed == {"k": 2} and type(packed) is dict


@pytest.mark.parametrize(("leaves", "message"), [
    ([1], "fewer leaves"),
    ([1, 2, 3], "more leaves"),
])
def test_pack_refuses_the_wrong_number_of_leaves(leaves, message) -> None:
    with pytest.raises(ValueError, match=message):
        _nest.pack_sequence_as({"a": 0, "b": 0}, leaves)


@pytest.mark.parametrize(("first", "second", "same"), [
    ({"a": 1, "b": 2}, {"b": 3, "a": 4}, True),
    ({"a": 1}, OrderedDict(a=1), True),
    ((1, 2), [1, 2], False),
    ((1, 2), (1, 2, 3), False),
    ({"a": 1}, {"b": 1}, False),
    (Point(1, 2), (1, 2), False),
])
def test_assert_same_structure(first, second, same) -> None:
    if same:
        _nest.assert_same_structure(first, second)
    else:
        with pytest.raises(ValueError, match="same nested structure"):
            _nest.assert_same_structure(first, second, "replies")


def test_map_structure_pairs_leaves_by_key_not_insertion_order() -> None:
    result = _nest.map_structure(lambda a, b: a - b, {"a": 10, "b": 20}, {"b": 2, "a": 1})
    assert result == {"a": 9, "b": 18}


def test_there_is_one_out_of_range_error() -> None:
    assert data.OutOfRangeError is errors.OutOfRangeError
    assert issubclass(errors.OutOfRangeError, errors.ClusterError)
    assert issubclass(errors.OutOfRangeError, LookupError)
