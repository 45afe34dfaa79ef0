"""ClusterSpec behaves like tf.train.ClusterSpec (each case checked against TensorFlow 2.21)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resolver.cluster_spec import ClusterSpec

# -- shapes --------------------------------------------------------------------------------------


def test_list_job_maps_position_to_task_index() -> None:
    spec = ClusterSpec({"worker": ["w0:1", "w1:1"], "ps": ["p0:1"]})
    assert spec.task_address("worker", 1) == "w1:1"
    assert spec.num_tasks("worker") == 2
    assert spec.task_indices("worker") == [0, 1]
    assert spec.as_dict() == {"worker": ["w0:1", "w1:1"], "ps": ["p0:1"]}


def test_tuple_job_is_accepted_like_a_list() -> None:
    assert ClusterSpec({"worker": ("a:1", "b:1")}).as_dict() == {"worker": ["a:1", "b:1"]}


def test_sparse_job_as_dict_stays_a_dict_when_indices_have_gaps() -> None:
    spec = ClusterSpec({"worker": {0: "a:1", 3: "b:1"}})
    assert spec.as_dict() == {"worker": {0: "a:1", 3: "b:1"}}
    assert isinstance(spec.as_dict()["worker"], dict)


def test_sparse_job_not_starting_at_zero_stays_a_dict() -> None:
    assert ClusterSpec({"worker": {1: "a", 2: "b"}}).as_dict() == {"worker": {1: "a", 2: "b"}}


def test_sparse_job_with_dense_indices_comes_back_as_a_list_in_index_order() -> None:
    assert ClusterSpec({"worker": {1: "b", 0: "a"}}).as_dict() == {"worker": ["a", "b"]}


def test_job_tasks_fills_gaps_with_none() -> None:
    spec = ClusterSpec({"worker": {1: "a", 3: "b"}})
    assert spec.job_tasks("worker") == [None, "a", None, "b"]
    assert spec.num_tasks("worker") == 2


def test_task_indices_are_sorted() -> None:
    assert ClusterSpec({"ps": {7: "x", 2: "y", 5: "z"}}).task_indices("ps") == [2, 5, 7]


def test_job_with_no_tasks_is_an_empty_dict_in_as_dict_but_still_a_job() -> None:
    spec = ClusterSpec({"worker": []})
    assert spec.as_dict() == {"worker": {}}
    assert spec.jobs == ["worker"]
    assert spec.num_tasks("worker") == 0
    assert bool(spec) is True


def test_job_tasks_of_a_job_without_tasks_raises_value_error() -> None:
    with pytest.raises(ValueError):
        ClusterSpec({"worker": []}).job_tasks("worker")


def test_string_keys_of_a_sparse_job_are_converted_with_int() -> None:
    spec = ClusterSpec({"worker": {"0": "a", " 1": "b", "+3": "c"}})
    assert spec.task_indices("worker") == [0, 1, 3]
    assert spec.task_address("worker", 3) == "c"


def test_duplicate_keys_after_int_conversion_keep_the_last_address() -> None:
    assert ClusterSpec({"worker": {"1": "a", 1: "b"}}).as_dict() == {"worker": {1: "b"}}


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cluster", [None, [], "worker", 5, ("worker",)])
def test_cluster_that_is_neither_dict_nor_spec_raises_type_error(cluster: object) -> None:
    with pytest.raises(TypeError):
        ClusterSpec(cluster)  # type: ignore[arg-type]


@pytest.mark.parametrize("tasks", ["a:1", {"a:1"}, 5, None])
def test_job_that_is_neither_list_nor_dict_raises_type_error(tasks: object) -> None:
    with pytest.raises(TypeError, match="worker"):
        ClusterSpec({"worker": tasks})


@pytest.mark.parametrize("address", [42, None, ["a:1"]])
def test_non_string_address_raises_type_error(address: object) -> None:
    with pytest.raises(TypeError, match="address"):
        ClusterSpec({"worker": ["a:1", address]})


def test_non_string_job_name_raises_type_error() -> None:
    with pytest.raises(TypeError, match="job name"):
        ClusterSpec({5: ["a:1"]})


@pytest.mark.parametrize("key", ["x", "1.5", ""])
def test_non_integer_sparse_key_raises_value_error(key: str) -> None:
    with pytest.raises(ValueError):
        ClusterSpec({"worker": {key: "a:1"}})


@pytest.mark.parametrize("index", [2**31, -(2**31) - 1])
def test_index_outside_int32_raises_value_error(index: int) -> None:
    with pytest.raises(ValueError, match="int32"):
        ClusterSpec({"worker": {index: "a:1"}})


def test_int32_bounds_themselves_are_accepted() -> None:
    spec = ClusterSpec({"worker": {2**31 - 1: "a", -(2**31): "b"}})
    assert spec.task_indices("worker") == [-(2**31), 2**31 - 1]


@pytest.mark.parametrize(
    "query",
    [
        lambda s: s.num_tasks("chief"),
        lambda s: s.task_indices("chief"),
        lambda s: s.task_address("chief", 0),
        lambda s: s.job_tasks("chief"),
    ],
    ids=["num_tasks", "task_indices", "task_address", "job_tasks"],
)
def test_unknown_job_raises_value_error_naming_it(query) -> None:
    with pytest.raises(ValueError, match="No such job in cluster: 'chief'"):
        query(ClusterSpec({"worker": ["a:1"]}))


def test_unknown_task_index_raises_value_error() -> None:
    with pytest.raises(ValueError, match="No task with index 3 in job 'worker'"):
        ClusterSpec({"worker": ["a:1"]}).task_address("worker", 3)


def test_task_address_does_not_coerce_the_index() -> None:
    spec = ClusterSpec({"worker": ["a:1", "b:1"]})
    with pytest.raises(ValueError):
        spec.task_address("worker", "0")
    # A dict lookup, as in TF: True == 1.
    assert spec.task_address("worker", True) == "b:1"


# -- copies, equality, text ----------------------------------------------------------------------


def test_jobs_keep_dict_order_but_a_copy_sorts_them() -> None:
    spec = ClusterSpec({"worker": ["a"], "chief": ["b"], "ps": ["c"]})
    assert spec.jobs == ["worker", "chief", "ps"]
    assert ClusterSpec(spec).jobs == ["chief", "ps", "worker"]
    assert ClusterSpec(spec) == spec


def test_bytes_are_kept_but_a_copy_turns_them_into_str() -> None:
    spec = ClusterSpec({b"worker": [b"a:1"]})
    assert spec.as_dict() == {b"worker": [b"a:1"]}
    assert ClusterSpec(spec).as_dict() == {"worker": ["a:1"]}


def test_spec_equals_specs_and_index_maps_but_not_dicts_of_lists() -> None:
    spec = ClusterSpec({"worker": ["a:1"]})
    assert spec == ClusterSpec({"worker": {0: "a:1"}})
    assert spec == {"worker": {0: "a:1"}}
    assert spec != {"worker": ["a:1"]}
    assert spec != ClusterSpec({"worker": ["b:1"]})
    assert spec != None  # noqa: E711 (comparing with None must not raise)


def test_specs_are_unhashable() -> None:
    with pytest.raises(TypeError):
        hash(ClusterSpec({}))


def test_empty_spec_is_falsy() -> None:
    assert not ClusterSpec({})
    assert ClusterSpec({"worker": ["a"]})


def test_repr_sorts_jobs_and_shows_as_dict_shapes() -> None:
    spec = ClusterSpec({"worker": {1: "a", 3: "b"}, "chief": ["c"]})
    assert repr(spec) == "ClusterSpec({'chief': ['c'], 'worker': {1: 'a', 3: 'b'}})"
    assert str(spec) == repr(spec)


def test_as_dict_returns_a_fresh_copy() -> None:
    spec = ClusterSpec({"worker": ["a"], "ps": {2: "p"}})
    result = spec.as_dict()
    result["worker"].append("x")
    result["ps"][5] = "y"
    assert spec.as_dict() == {"worker": ["a"], "ps": {2: "p"}}


def test_spec_does_not_alias_the_callers_dict() -> None:
    cluster = {"worker": ["a"]}
    spec = ClusterSpec(cluster)
    cluster["worker"].append("b")
    assert spec.num_tasks("worker") == 1


# -- properties ----------------------------------------------------------------------------------

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_addresses = st.text(min_size=0, max_size=12)
_jobs = st.one_of(
    st.lists(_addresses, max_size=6),
    st.dictionaries(st.integers(min_value=0, max_value=40), _addresses, max_size=6),
)


@given(st.dictionaries(_names, _jobs, max_size=5))
@settings(max_examples=200, deadline=None)
def test_as_dict_round_trips_and_is_a_list_exactly_when_indices_are_dense(cluster) -> None:
    spec = ClusterSpec(cluster)
    as_dict = spec.as_dict()
    assert ClusterSpec(as_dict) == spec
    assert list(as_dict) == list(cluster)
    for name, tasks in cluster.items():
        indices = range(len(tasks)) if isinstance(tasks, list) else sorted(tasks)
        dense = len(tasks) > 0 and list(indices) == list(range(len(tasks)))
        assert isinstance(as_dict[name], list) == dense
        for index in indices:
            assert spec.task_address(name, index) == tasks[index]


@given(st.dictionaries(_names, st.lists(_addresses, min_size=1, max_size=6), max_size=5))
@settings(max_examples=100, deadline=None)
def test_list_jobs_come_back_unchanged(cluster) -> None:
    assert ClusterSpec(cluster).as_dict() == cluster


def test_10000_worker_spec_builds_and_answers_well_under_a_second() -> None:
    workers = [f"worker-{i}.svc:2222" for i in range(10_000)]
    started = time.perf_counter()
    spec = ClusterSpec({"chief": ["chief:2222"], "worker": workers})
    as_dict = spec.as_dict()
    addresses = [spec.task_address("worker", i) for i in range(10_000)]
    copy = ClusterSpec(spec)
    elapsed = time.perf_counter() - started
    assert as_dict["worker"] == workers and addresses == workers and copy == spec
    assert elapsed < 1.0
