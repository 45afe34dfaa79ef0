"""TFConfigClusterResolver mirrors TensorFlow's (each non-error case checked against TF 2.21)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from resolver.cluster_spec import ClusterSpec
from resolver.errors import ClusterConfigError
from resolver.tfconfig import TFConfigClusterResolver

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER = {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"]}


@pytest.fixture(autouse=True)
def _no_inherited_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)


def set_tf_config(monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    text = value if isinstance(value, str) else json.dumps(value)
    monkeypatch.setenv("TF_CONFIG", text)


# -- absent / empty ------------------------------------------------------------------------------


def test_no_tf_config_gives_an_empty_spec_no_task_and_empty_master() -> None:
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec({})
    assert not resolver.cluster_spec()
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    assert resolver.master() == ""
    assert resolver.master("worker", 0) == ""


def test_empty_object_tf_config_behaves_like_no_tf_config(monkeypatch) -> None:
    set_tf_config(monkeypatch, "{}")
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec().as_dict() == {}
    assert resolver.task_type is None and resolver.task_id is None
    assert resolver.master() == ""


def test_empty_string_tf_config_raises_cluster_config_error(monkeypatch) -> None:
    set_tf_config(monkeypatch, "")
    with pytest.raises(ClusterConfigError, match="^TF_CONFIG: .*empty"):
        TFConfigClusterResolver().cluster_spec()


# -- reading at call time ------------------------------------------------------------------------


def test_tf_config_is_read_when_called_not_when_constructed(monkeypatch) -> None:
    resolver = TFConfigClusterResolver()
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}})
    assert resolver.master() == "w1:2222"
    set_tf_config(
        monkeypatch, {"cluster": {"ps": ["p0:1", "p1:1"]}, "task": {"type": "ps", "index": 0}}
    )
    assert resolver.task_type == "ps"
    assert resolver.cluster_spec().as_dict() == {"ps": ["p0:1", "p1:1"]}
    assert resolver.master() == "p0:1"


def test_importing_and_constructing_never_read_tf_config(monkeypatch) -> None:
    set_tf_config(monkeypatch, "{not json")
    # A fresh interpreter, so the import really happens with the bad TF_CONFIG in place.
    code = (
        "import resolver, resolver.tfconfig as m;"
        "r = m.TFConfigClusterResolver(task_type='worker', task_id=0, rpc_layer='grpc');"
        "print(r.task_type, r.task_id, r.rpc_layer)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["worker", "0", "grpc"]
    with pytest.raises(ClusterConfigError, match="invalid JSON"):
        TFConfigClusterResolver().cluster_spec()


# -- master() ------------------------------------------------------------------------------------


def test_master_is_own_address_prefixed_with_tf_config_rpc_layer(monkeypatch) -> None:
    set_tf_config(
        monkeypatch,
        {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"},
    )
    resolver = TFConfigClusterResolver()
    assert resolver.rpc_layer == "grpc"
    assert resolver.master() == "grpc://w1:2222"


def test_master_rpc_layer_argument_overrides_tf_config(monkeypatch) -> None:
    set_tf_config(
        monkeypatch,
        {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"},
    )
    assert TFConfigClusterResolver().master(rpc_layer="grpc+verbs") == "grpc+verbs://w1:2222"


def test_master_rpc_layer_empty_string_argument_means_no_prefix(monkeypatch) -> None:
    set_tf_config(
        monkeypatch,
        {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"},
    )
    assert TFConfigClusterResolver().master(rpc_layer="") == "w1:2222"


def test_constructor_rpc_layer_empty_string_hides_tf_config_rpc_layer(monkeypatch) -> None:
    set_tf_config(
        monkeypatch,
        {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"},
    )
    resolver = TFConfigClusterResolver(rpc_layer="")
    assert resolver.rpc_layer == ""
    assert resolver.master() == "w1:2222"


def test_master_of_a_named_task_ignores_this_task(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}})
    resolver = TFConfigClusterResolver()
    assert resolver.master("chief", 0) == "c0:2222"
    # Only the task type given: the index is still this task's (1), which chief lacks.
    with pytest.raises(ValueError, match="No task with index 1 in job 'chief'"):
        resolver.master("chief")


def test_master_does_not_coerce_a_string_index_argument(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 0}})
    with pytest.raises(ValueError, match="No task with index '1'"):
        TFConfigClusterResolver().master("worker", "1")


def test_evaluator_outside_the_cluster_resolves_but_master_raises(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "evaluator", "index": 0}})
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec().as_dict() == CLUSTER
    assert (resolver.task_type, resolver.task_id) == ("evaluator", 0)
    with pytest.raises(ValueError, match="No such job in cluster: 'evaluator'"):
        resolver.master()
    with pytest.raises(ValueError, match="evaluator"):
        resolver.num_accelerators()  # TF consults master() first


def test_out_of_range_index_fails_in_master_not_in_cluster_spec(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 7}})
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec().num_tasks("worker") == 2
    assert resolver.task_id == 7
    with pytest.raises(ValueError, match="No task with index 7 in job 'worker'"):
        resolver.master()


def test_master_without_a_task_raises_when_the_cluster_has_several_tasks(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER})
    with pytest.raises(ValueError, match="No such job in cluster: None"):
        TFConfigClusterResolver().master()


def test_master_is_empty_for_a_single_job_with_a_single_task(monkeypatch) -> None:
    set_tf_config(
        monkeypatch,
        {
            "cluster": {"worker": ["w0:1"]},
            "task": {"type": "worker", "index": 0},
            "rpc_layer": "grpc",
        },
    )
    resolver = TFConfigClusterResolver()
    assert resolver.master() == ""
    assert resolver.master("worker", 5) == ""  # not even checked, as in TF


def test_master_of_a_single_sparse_task_is_not_empty(monkeypatch) -> None:
    set_tf_config(
        monkeypatch, {"cluster": {"worker": {"2": "w2:1"}}, "task": {"type": "worker", "index": 2}}
    )
    assert TFConfigClusterResolver().master() == "w2:1"


def test_session_master_is_returned_verbatim_for_any_task(monkeypatch) -> None:
    set_tf_config(
        monkeypatch,
        {
            "cluster": CLUSTER,
            "task": {"type": "worker", "index": 1},
            "session_master": "sm:1",
            "rpc_layer": "grpc",
        },
    )
    assert TFConfigClusterResolver().master() == "sm:1"
    assert TFConfigClusterResolver().master("chief", 0) == "sm:1"


def test_sparse_cluster_from_tf_config_keeps_its_indices(monkeypatch) -> None:
    set_tf_config(
        monkeypatch,
        {
            "cluster": {"worker": {"1": "w1:1", "3": "w3:1"}, "ps": ["p0:1"]},
            "task": {"type": "worker", "index": 3},
        },
    )
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec().as_dict() == {"worker": {1: "w1:1", 3: "w3:1"}, "ps": ["p0:1"]}
    assert resolver.master() == "w3:1"


def test_addresses_and_unknown_keys_are_not_validated(monkeypatch) -> None:
    set_tf_config(
        monkeypatch,
        {
            "cluster": {"worker": ["not an address", ""], "my-job": ["x"]},
            "task": {"type": "worker", "index": 0, "trial": 3},
            "extra": [1, 2],
        },
    )
    resolver = TFConfigClusterResolver()
    assert resolver.master() == "not an address"
    assert resolver.cluster_spec().jobs == ["worker", "my-job"]


# -- task identity -------------------------------------------------------------------------------


def test_task_index_given_as_a_string_is_coerced_to_int(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": "1"}})
    resolver = TFConfigClusterResolver()
    assert resolver.task_id == 1
    assert resolver.master() == "w1:2222"


def test_constructor_overrides_win_and_are_coerced_with_str_and_int(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}})
    resolver = TFConfigClusterResolver(task_type="chief", task_id="0")
    assert (resolver.task_type, resolver.task_id) == ("chief", 0)
    assert resolver.master() == "c0:2222"
    assert TFConfigClusterResolver(task_type=5).task_type == "5"


def test_a_task_id_override_that_int_rejects_raises_when_read() -> None:
    resolver = TFConfigClusterResolver(task_id="first")
    with pytest.raises(ValueError):
        _ = resolver.task_id


def test_setters_override_and_none_falls_back_to_tf_config(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}})
    resolver = TFConfigClusterResolver()
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "chief", "0", "grpc"
    assert (resolver.task_type, resolver.task_id) == ("chief", 0)
    assert resolver.master() == "grpc://c0:2222"
    resolver.task_type, resolver.task_id = None, None
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)


def test_environment_is_the_constructor_argument_not_tf_config(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "environment": "cloud"})
    assert TFConfigClusterResolver().environment is None
    assert TFConfigClusterResolver(environment="google").environment == "google"


def test_num_accelerators_counts_local_gpus_for_this_task_only(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    resolver = TFConfigClusterResolver()
    assert resolver.num_accelerators() == {"GPU": 2}
    assert resolver.num_accelerators("worker", 1) == {"GPU": 2}
    assert resolver.num_accelerators("chief", 0) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert resolver.num_accelerators() == {}
    assert resolver.num_accelerators()["GPU"] == 0  # a defaultdict(int), as in TF


# -- malformed TF_CONFIG -------------------------------------------------------------------------

_MALFORMED = {
    "invalid_json": ("{not json", "TF_CONFIG: invalid JSON"),
    "whitespace_only": ("   ", "TF_CONFIG: is set but empty"),
    "top_level_array": ("[]", "TF_CONFIG: expected a JSON object at the top level, got an array"),
    "top_level_null": ("null", "TF_CONFIG: expected a JSON object at the top level, got null"),
    "top_level_string": ('"cluster"', "TF_CONFIG: expected a JSON object at the top level"),
    "cluster_null": ({"cluster": None}, "TF_CONFIG: cluster: expected an object"),
    "cluster_array": ({"cluster": ["w0:1"]}, "TF_CONFIG: cluster: expected an object"),
    "job_string": (
        {"cluster": {"worker": "w0:1"}},
        'TF_CONFIG: cluster.worker: expected an array of "host:port" strings',
    ),
    "job_number": ({"cluster": {"worker": 2}}, "TF_CONFIG: cluster.worker: expected an array"),
    "job_null": ({"cluster": {"worker": None}}, "TF_CONFIG: cluster.worker: expected an array"),
    "address_null": (
        {"cluster": {"worker": [None]}},
        'TF_CONFIG: cluster.worker[0]: expected a "host:port" string, got null',
    ),
    "address_object": (
        {"cluster": {"my-job": ["a:1", {}]}},
        'TF_CONFIG: cluster["my-job"][1]: expected a "host:port" string, got {}',
    ),
    "sparse_address_number": (
        {"cluster": {"ps": {"3": 7}}},
        'TF_CONFIG: cluster.ps["3"]: expected a "host:port" string, got 7',
    ),
    "sparse_key_not_int": (
        {"cluster": {"ps": {"x": "p:1"}}},
        'TF_CONFIG: cluster.ps["x"]: task index keys must be integers, got "x"',
    ),
    "sparse_key_float": (
        {"cluster": {"ps": {"1.5": "p:1"}}},
        'TF_CONFIG: cluster.ps["1.5"]: task index keys must be integers',
    ),
    "sparse_key_out_of_int32": (
        {"cluster": {"ps": {"4294967296": "p:1"}}},
        'TF_CONFIG: cluster.ps["4294967296"]: task index 4294967296 is out of the int32 range',
    ),
}


@pytest.mark.parametrize("value, message", _MALFORMED.values(), ids=_MALFORMED.keys())
def test_malformed_tf_config_raises_cluster_config_error_naming_the_field(
    monkeypatch, value, message
) -> None:
    set_tf_config(monkeypatch, value)
    with pytest.raises(ClusterConfigError) as raised:
        TFConfigClusterResolver().cluster_spec()
    assert str(raised.value).startswith(message)


def test_non_string_address_message_names_the_exact_list_position(monkeypatch) -> None:
    set_tf_config(monkeypatch, {"cluster": {"worker": ["a:1", "b:1", 42]}})
    with pytest.raises(ClusterConfigError) as raised:
        TFConfigClusterResolver().master()
    assert (
        str(raised.value) == 'TF_CONFIG: cluster.worker[2]: expected a "host:port" string, got 42'
    )
    assert isinstance(raised.value, ValueError)  # code written for TF catches ValueError


_BAD_TASK = {
    "task_string": ({"task": "worker"}, "TF_CONFIG: task: expected an object"),
    "task_array": ({"task": ["worker", 0]}, "TF_CONFIG: task: expected an object"),
    "type_null": (
        {"task": {"type": None, "index": 0}},
        "TF_CONFIG: task.type: expected a string (or a number), got null",
    ),
    "type_bool": (
        {"task": {"type": True, "index": 0}},
        "TF_CONFIG: task.type: expected a string (or a number), got a boolean true",
    ),
    "type_array": (
        {"task": {"type": ["worker"], "index": 0}},
        'TF_CONFIG: task.type: expected a string (or a number), got an array ["worker"]',
    ),
}


@pytest.mark.parametrize(("value", "job"), [(123456, "123456"), (1.5, "1.5")])
def test_numeric_task_type_is_cast_to_string_like_tf(monkeypatch, value, job) -> None:
    # TF's testTaskTypeCastToString: TF reads str(task["type"]).
    set_tf_config(
        monkeypatch, {"cluster": {job: ["a:1", "b:1"]}, "task": {"type": value, "index": 1}}
    )
    resolver = TFConfigClusterResolver()
    assert resolver.task_type == job
    assert resolver.master() == "b:1"


@pytest.mark.parametrize("value, message", _BAD_TASK.values(), ids=_BAD_TASK.keys())
def test_malformed_task_type_raises_cluster_config_error(monkeypatch, value, message) -> None:
    set_tf_config(monkeypatch, value)
    with pytest.raises(ClusterConfigError) as raised:
        _ = TFConfigClusterResolver().task_type
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    "index", [None, "first", 1.5, True, [0]], ids=["null", "word", "float", "bool", "array"]
)
def test_task_index_that_is_not_an_integer_raises_cluster_config_error(monkeypatch, index) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": index}})
    with pytest.raises(ClusterConfigError, match="^TF_CONFIG: task.index: expected an integer"):
        _ = TFConfigClusterResolver().task_id


@pytest.mark.parametrize("key", ["rpc_layer", "session_master"])
def test_non_string_rpc_layer_or_session_master_raises_cluster_config_error(
    monkeypatch, key
) -> None:
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 0}, key: 5})
    with pytest.raises(
        ClusterConfigError, match=f"^TF_CONFIG: {key}: expected a string, got a number 5"
    ):
        TFConfigClusterResolver().master()


def test_null_rpc_layer_means_none(monkeypatch) -> None:
    set_tf_config(
        monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 0}, "rpc_layer": None}
    )
    assert TFConfigClusterResolver().master() == "w0:2222"


def test_a_bad_field_fails_only_the_calls_that_read_it(monkeypatch) -> None:
    # TF reads TF_CONFIG one key at a time; so do we.
    set_tf_config(monkeypatch, {"cluster": {"worker": 5}, "task": {"type": "worker", "index": "x"}})
    resolver = TFConfigClusterResolver()
    assert resolver.task_type == "worker"
    with pytest.raises(ClusterConfigError, match="cluster.worker"):
        resolver.cluster_spec()
    with pytest.raises(ClusterConfigError, match="task.index"):
        _ = resolver.task_id
    set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": "x"}})
    assert resolver.master("chief", 0) == "c0:2222"


# -- scale ---------------------------------------------------------------------------------------


def test_10000_worker_tf_config_resolves_well_under_a_second(monkeypatch) -> None:
    workers = [f"worker-{i}.train.svc:2222" for i in range(10_000)]
    set_tf_config(
        monkeypatch,
        {
            "cluster": {"chief": ["chief-0:2222"], "worker": workers},
            "task": {"type": "worker", "index": 9_999},
            "rpc_layer": "grpc",
        },
    )
    started = time.perf_counter()
    resolver = TFConfigClusterResolver()
    as_dict = resolver.cluster_spec().as_dict()
    master = resolver.master()
    other = resolver.master("worker", 5_000)
    elapsed = time.perf_counter() - started
    assert as_dict["worker"] == workers
    assert master == "grpc://worker-9999.train.svc:2222"
    assert other == "grpc://worker-5000.train.svc:2222"
    assert elapsed < 1.0
