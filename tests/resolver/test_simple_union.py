"""ClusterResolver, SimpleClusterResolver and UnionClusterResolver behave like TensorFlow's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resolver._devices import local_accelerators, local_gpu_count
from resolver.base import (
    ClusterResolver,
    SimpleClusterResolver,
    UnionClusterResolver,
    format_master_url,
)
from resolver.cluster_spec import ClusterSpec
from resolver.tfconfig import TFConfigClusterResolver


def simple(cluster: dict, **kwargs) -> SimpleClusterResolver:
    return SimpleClusterResolver(ClusterSpec(cluster), **kwargs)


WORKERS = {"worker": ["w0:1", "w1:1"]}
PS = {"ps": ["p0:1"]}

# -- ClusterResolver and helpers -----------------------------------------------------------------


def test_cluster_resolver_is_abstract() -> None:
    with pytest.raises(TypeError):
        ClusterResolver()  # type: ignore[abstract]


class _Minimal(ClusterResolver):
    def cluster_spec(self) -> ClusterSpec:
        return ClusterSpec(WORKERS)

    def master(self, task_type=None, task_id=None, rpc_layer=None) -> str:
        if task_type == "missing":
            raise ValueError("No such job in cluster: 'missing'")
        return ""


def test_minimal_subclass_gets_default_attributes_that_can_be_set() -> None:
    resolver = _Minimal()
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    assert resolver.environment == ""
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 1, "grpc"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")


def test_base_num_accelerators_consults_master_then_counts_local_gpus(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    resolver = _Minimal()
    assert resolver.num_accelerators() == {"GPU": 3}
    with pytest.raises(ValueError, match="missing"):
        resolver.num_accelerators("missing", 0)
    assert resolver.num_accelerators("worker", 1) == {}  # not this task: unknown here


@pytest.mark.parametrize(
    "rpc_layer, expected", [("grpc", "grpc://h:1"), ("", "h:1"), (None, "h:1")]
)
def test_format_master_url_prefixes_only_a_truthy_rpc_layer(rpc_layer, expected) -> None:
    assert format_master_url("h:1", rpc_layer) == expected


@pytest.mark.parametrize(
    "visible, count",
    [
        ("", 0),
        ("-1", 0),
        ("0", 1),
        ("0,1", 2),
        (" 0 , 1 ,3", 3),
        ("0,-1,1", 1),
        ("GPU-1a2b,GPU-3c4d", 2),
    ],
)
def test_cuda_visible_devices_decides_the_gpu_count_when_set(
    tmp_path: Path, visible, count
) -> None:
    (tmp_path / "nvidia0").touch()  # ignored: the variable wins
    assert local_gpu_count({"CUDA_VISIBLE_DEVICES": visible}, dev_dir=str(tmp_path)) == count


def test_gpu_device_nodes_are_counted_when_cuda_visible_devices_is_unset(tmp_path: Path) -> None:
    for name in (
        "nvidia0",
        "nvidia1",
        "nvidia12",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-modeset",
        "null",
    ):
        (tmp_path / name).touch()
    assert local_gpu_count({}, dev_dir=str(tmp_path), proc_gpus_dir=str(tmp_path / "none")) == 3


def test_proc_driver_entries_are_the_fallback_and_missing_dirs_mean_no_gpu(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    for bus_id in ("0000:07:00.0", "0000:0f:00.0"):
        (gpus / bus_id).mkdir(parents=True)
    empty_dev = tmp_path / "dev"
    empty_dev.mkdir()
    assert local_gpu_count({}, dev_dir=str(empty_dev), proc_gpus_dir=str(gpus)) == 2
    assert local_gpu_count({}, dev_dir=str(tmp_path / "x"), proc_gpus_dir=str(tmp_path / "y")) == 0


def test_local_accelerators_is_a_defaultdict_that_omits_zero_gpus() -> None:
    assert local_accelerators({"CUDA_VISIBLE_DEVICES": "0,1"}) == {"GPU": 2}
    none = local_accelerators({"CUDA_VISIBLE_DEVICES": ""})
    assert none == {} and none["GPU"] == 0


# -- SimpleClusterResolver -----------------------------------------------------------------------


def test_simple_master_is_the_given_master_prefixed_with_rpc_layer() -> None:
    assert simple(WORKERS).master() == ""
    assert simple(WORKERS, master="m:1", rpc_layer="grpc").master() == "grpc://m:1"
    assert simple(WORKERS, master="m:1").master(rpc_layer="http") == "http://m:1"


def test_simple_master_of_a_named_task_comes_from_the_spec() -> None:
    resolver = simple(WORKERS, master="m:1", rpc_layer="grpc")
    assert resolver.master("worker", 1) == "grpc://w1:1"
    assert resolver.master("worker") == "grpc://m:1"  # both needed for a lookup
    with pytest.raises(ValueError, match="No task with index 5"):
        resolver.master("worker", 5)


def test_simple_master_empty_rpc_layer_argument_falls_back_to_its_own() -> None:
    assert simple(WORKERS, master="m:1", rpc_layer="grpc").master(rpc_layer="") == "grpc://m:1"


@pytest.mark.parametrize(
    "args",
    [({"worker": ["a"]},), (ClusterSpec({}), 5), (ClusterSpec({}), None)],
    ids=["dict_spec", "int_master", "none_master"],
)
def test_simple_rejects_a_non_spec_or_non_string_master(args) -> None:
    with pytest.raises(TypeError):
        SimpleClusterResolver(*args)


def test_simple_returns_its_spec_and_attributes_without_coercion() -> None:
    spec = ClusterSpec(WORKERS)
    resolver = SimpleClusterResolver(spec, task_type="worker", task_id="1", environment="google")
    assert resolver.cluster_spec() is spec
    assert (resolver.task_type, resolver.task_id, resolver.environment) == ("worker", "1", "google")
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "ps", 0, "grpc"
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("ps", 0, "grpc")
    assert simple({}).environment == ""


def test_simple_num_accelerators_is_the_given_mapping_or_empty() -> None:
    given_mapping = {"GPU": 4}
    assert simple({}, num_accelerators=given_mapping).num_accelerators("ps", 3) is given_mapping
    assert simple({}).num_accelerators() == {}


# -- UnionClusterResolver ------------------------------------------------------------------------


def test_union_merges_disjoint_jobs() -> None:
    union = UnionClusterResolver(simple(WORKERS), simple(PS))
    assert union.cluster_spec() == ClusterSpec({**WORKERS, **PS})


def test_union_concatenates_list_jobs_without_a_conflict_check() -> None:
    union = UnionClusterResolver(simple(WORKERS), simple({"worker": ["w0:1"]}))
    assert union.cluster_spec().as_dict() == {"worker": ["w0:1", "w1:1", "w0:1"]}


def test_union_merges_a_sparse_job_with_a_list_job_by_index() -> None:
    union = UnionClusterResolver(simple({"worker": {3: "w3:1"}}), simple(WORKERS))
    assert union.cluster_spec().as_dict() == {"worker": {0: "w0:1", 1: "w1:1", 3: "w3:1"}}


def test_union_duplicate_index_in_a_sparse_merge_raises_key_error() -> None:
    union = UnionClusterResolver(simple(WORKERS), simple({"worker": {1: "other:1"}}))
    with pytest.raises(KeyError, match="worker"):
        union.cluster_spec()


def test_union_treats_a_dense_sparse_job_as_a_list() -> None:
    # as_dict() turns {0: .., 1: ..} into a list, so it is concatenated, not index-merged.
    union = UnionClusterResolver(simple({"worker": {1: "b", 0: "a"}}), simple({"worker": ["c"]}))
    assert union.cluster_spec().as_dict() == {"worker": ["a", "b", "c"]}


def test_union_without_resolvers_raises_value_error() -> None:
    with pytest.raises(ValueError, match="At least one"):
        UnionClusterResolver(task_type="worker")


def test_union_with_a_non_resolver_raises_type_error() -> None:
    with pytest.raises(TypeError):
        UnionClusterResolver(simple(WORKERS), ClusterSpec(PS))  # type: ignore[arg-type]


def test_union_with_an_unknown_keyword_raises_value_error() -> None:
    with pytest.raises(ValueError, match="Unexpected kwargs"):
        UnionClusterResolver(simple(WORKERS), environment="google")


def test_union_takes_identity_environment_and_accelerators_from_the_first() -> None:
    first = simple(
        WORKERS,
        task_type="worker",
        task_id=1,
        rpc_layer="grpc",
        environment="google",
        num_accelerators={"GPU": 4},
    )
    union = UnionClusterResolver(
        first, simple(PS, task_type="ps", task_id=0, num_accelerators={"GPU": 1})
    )
    assert (union.task_type, union.task_id, union.rpc_layer) == ("worker", 1, "grpc")
    assert union.environment == "google"
    assert union.num_accelerators() == {"GPU": 4}


def test_union_overrides_apply_only_when_truthy() -> None:
    first = simple(WORKERS, task_type="worker", task_id=1, rpc_layer="grpc")
    union = UnionClusterResolver(first, simple(PS), task_type="ps", task_id=0, rpc_layer="")
    # TF tests the overrides with `or`: task_id=0 and rpc_layer="" fall through to the first.
    assert (union.task_type, union.task_id, union.rpc_layer) == ("ps", 1, "grpc")
    union.task_id = 2
    assert union.task_id == 2


def test_union_master_asks_the_first_resolver_passing_only_rpc_layer() -> None:
    first = simple(WORKERS, master="m:1", task_type="worker", task_id=1)
    union = UnionClusterResolver(first, simple(PS, master="n:1"), rpc_layer="grpc")
    assert union.master() == "m:1"  # the union's own rpc_layer is not applied here
    assert union.master(rpc_layer="http") == "http://m:1"


def test_union_master_of_a_named_task_uses_the_merged_spec() -> None:
    union = UnionClusterResolver(simple(WORKERS, rpc_layer="grpc"), simple(PS))
    assert union.master("ps", 0) == "p0:1"  # only the union's rpc_layer applies
    assert (
        UnionClusterResolver(simple(WORKERS), simple(PS), rpc_layer="grpc").master("ps", 0)
        == "grpc://p0:1"
    )
    with pytest.raises(ValueError):
        union.master("ps", 3)


def test_union_reads_a_tf_config_resolver_at_call_time(monkeypatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    union = UnionClusterResolver(TFConfigClusterResolver(), simple(PS))
    assert union.cluster_spec().as_dict() == PS
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": WORKERS, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"}
        ),
    )
    assert union.cluster_spec().as_dict() == {**WORKERS, **PS}
    assert (union.task_type, union.task_id, union.rpc_layer) == ("worker", 1, "grpc")
    assert union.master() == "grpc://w1:1"


def test_union_of_unions_merges_recursively() -> None:
    inner = UnionClusterResolver(simple(WORKERS, rpc_layer="grpc"), simple(PS))
    outer = UnionClusterResolver(inner, simple({"chief": ["c:1"]}))
    assert outer.cluster_spec().as_dict() == {**WORKERS, **PS, "chief": ["c:1"]}
    assert outer.rpc_layer == "grpc"


_lists = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=5)


@given(st.lists(_lists, min_size=1, max_size=4))
@settings(max_examples=100, deadline=None)
def test_union_of_list_jobs_concatenates_in_resolver_order(jobs) -> None:
    union = UnionClusterResolver(*(simple({"worker": tasks}) for tasks in jobs))
    assert union.cluster_spec().as_dict() == {"worker": [a for tasks in jobs for a in tasks]}
