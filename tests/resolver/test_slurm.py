"""SlurmClusterResolver: behaviour of TF's resolver, plus our differences (its pure list parsers
are tested in test_hostlist.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resolver import slurm
from resolver.base import ClusterResolver
from resolver.cluster_spec import ClusterSpec
from resolver.errors import ClusterConfigError
from resolver.slurm import SlurmClusterResolver

_VARS = (
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "CUDA_VISIBLE_DEVICES",
)


@pytest.fixture
def env(monkeypatch, tmp_path):
    """Clears the Slurm/CUDA variables (restored afterwards, even ones the resolver sets) and
    points GPU discovery at an empty fake /dev; returns a setter for Slurm variables."""
    for name in _VARS:
        # setenv first so monkeypatch records the original and undoes what cluster_spec() sets.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    fake_dev = tmp_path / "dev"
    fake_dev.mkdir()
    monkeypatch.setattr(slurm, "_DEVICE_DIR", str(fake_dev))
    monkeypatch.setattr(slurm, "_PROC_GPUS_DIR", str(tmp_path / "no-proc"))

    def set_step(procid=None, num_tasks=None, nodelist=None, tasks_per_node=None, **extra):
        values = {
            "SLURM_PROCID": procid,
            "SLURM_STEP_NUM_TASKS": num_tasks,
            "SLURM_STEP_NODELIST": nodelist,
            "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
            **extra,
        }
        for name, value in values.items():
            if value is not None:
                monkeypatch.setenv(name, str(value))

    set_step.dev = fake_dev
    return set_step


def _step_2x2(env, procid=0):
    """A step of 4 tasks, two on each of n1 and n2."""
    env(procid=procid, num_tasks=4, nodelist="n[1-2]", tasks_per_node="2(x2)")


# ---- GPU discovery ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "count"), [("0,1,2", 3), ("", 0), ("-1", 0), ("0,1,-1,2", 2), ("GPU-ab12", 1)]
)
def test_gpu_count_reads_cuda_visible_devices_as_cuda_does(env, monkeypatch, visible, count):
    (env.dev / "nvidia0").touch()  # ignored: CUDA_VISIBLE_DEVICES wins when set
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert slurm.get_num_gpus() == count


def test_gpu_count_falls_back_to_dev_nvidia_files(env):
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (env.dev / name).touch()
    assert slurm.get_num_gpus() == 3


# ---- SlurmClusterResolver: cluster and task identity ------------------------------------------


def test_default_jobs_are_one_worker_per_slurm_task(env):
    _step_2x2(env, procid=3)
    resolver = SlurmClusterResolver()
    spec = resolver.cluster_spec()
    assert isinstance(resolver, ClusterResolver)
    assert isinstance(spec, ClusterSpec)
    assert spec.as_dict() == {"worker": ["n1:8888", "n1:8889", "n2:8888", "n2:8889"]}
    assert resolver.get_task_info() == ("worker", 3)
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 3, "grpc")
    assert resolver.environment == ""


def test_task_identity_is_unknown_until_cluster_spec_is_called(env):
    _step_2x2(env, procid=2)
    resolver = SlurmClusterResolver()
    # TF surprise kept: the identity is computed by cluster_spec(), not the constructor.
    assert resolver.get_task_info() == (None, None)
    assert resolver.master() == ""
    resolver.cluster_spec()
    assert resolver.get_task_info() == ("worker", 2)


def test_jobs_take_ranks_in_sorted_job_name_order(env):
    _step_2x2(env, procid=0)
    resolver = SlurmClusterResolver(jobs={"worker": 2, "ps": 1, "chief": 1})
    spec = resolver.cluster_spec()
    # chief < ps < worker, whatever the dict's order (TF sorts).
    assert spec.as_dict() == {
        "chief": ["n1:8888"],
        "ps": ["n1:8889"],
        "worker": ["n2:8888", "n2:8889"],
    }
    assert resolver.get_task_info() == ("chief", 0)
    env(procid=3)
    later = SlurmClusterResolver(jobs={"worker": 2, "ps": 1, "chief": 1})
    later.cluster_spec()
    assert later.get_task_info() == ("worker", 1)


def test_ports_count_up_from_port_base_on_each_node(env):
    env(procid=0, num_tasks=4, nodelist="a,b", tasks_per_node="3,1")
    spec = SlurmClusterResolver(port_base=2222, gpus_per_node=0).cluster_spec()
    assert spec.as_dict() == {"worker": ["a:2222", "a:2223", "a:2224", "b:2222"]}


def test_tasks_are_packed_onto_hostnames_in_sorted_string_order_as_tf_does(env):
    # TF sorts hostnames as strings, so node10 comes before node9 (TF's code wins over its
    # docstring); tasks-per-node counts stay attached to their own host.
    env(procid=0, num_tasks=3, nodelist="node[9-10]", tasks_per_node="2,1")
    spec = SlurmClusterResolver().cluster_spec()
    assert spec.as_dict() == {"worker": ["node10:8888", "node9:8888", "node9:8889"]}


def test_integer_tasks_per_node_applies_to_every_listed_node(env):
    env(procid=1, num_tasks=6, nodelist="h[1-3]")  # SLURM_STEP_TASKS_PER_NODE not needed
    spec = SlurmClusterResolver(tasks_per_node=2).cluster_spec()
    assert spec.as_dict()["worker"] == [
        "h1:8888",
        "h1:8889",
        "h2:8888",
        "h2:8889",
        "h3:8888",
        "h3:8889",
    ]


def test_dict_tasks_per_node_replaces_slurm_node_variables(env):
    env(procid=2)  # no node list, no tasks per node, and jobs given: only SLURM_PROCID is read
    resolver = SlurmClusterResolver(
        jobs={"worker": 3}, tasks_per_node={"x": 1, "y": 2}, gpus_per_node=0
    )
    assert resolver.cluster_spec().as_dict() == {"worker": ["x:8888", "y:8888", "y:8889"]}
    assert resolver.get_task_info() == ("worker", 2)


def test_slurm_variables_are_read_at_construction(env, monkeypatch):
    _step_2x2(env, procid=1)
    resolver = SlurmClusterResolver()
    monkeypatch.setenv("SLURM_STEP_NODELIST", "other[1-2]")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert resolver.cluster_spec().as_dict()["worker"][0] == "n1:8888"
    assert resolver.get_task_info() == ("worker", 1)


def test_rank_outside_the_step_leaves_identity_unset_without_auto_set_gpu(env):
    env(procid=7, num_tasks=4, nodelist="n[1-2]", tasks_per_node="2(x2)")
    resolver = SlurmClusterResolver(auto_set_gpu=False)
    resolver.cluster_spec()
    assert resolver.get_task_info() == (None, None)
    with pytest.raises(ClusterConfigError, match=r"^SLURM_PROCID: rank 7 is not one of"):
        SlurmClusterResolver().cluster_spec()  # TF: IndexError


# ---- SlurmClusterResolver: bad input ----------------------------------------------------------


def test_missing_slurm_procid_raises_tf_runtime_error(env):
    env(num_tasks=4, nodelist="n[1-2]", tasks_per_node="2(x2)")
    with pytest.raises(RuntimeError, match=r"^SLURM_PROCID not found in environment\. Not running"):
        SlurmClusterResolver()


def test_missing_step_variables_raise_tf_runtime_error(env, monkeypatch):
    env(procid=0, nodelist="n[1-2]", tasks_per_node="2(x2)")
    with pytest.raises(RuntimeError, match="^SLURM_STEP_NUM_TASKS not found"):
        SlurmClusterResolver()
    env(num_tasks=4, SLURM_JOB_NODELIST="n[1-2]")  # no fallback to the job's variables
    monkeypatch.delenv("SLURM_STEP_NODELIST")
    with pytest.raises(RuntimeError, match="^SLURM_STEP_NODELIST not found"):
        SlurmClusterResolver()


@pytest.mark.parametrize("procid", ["x", "-1", "1.5", ""])
def test_non_integer_slurm_procid_raises_config_error(env, procid):
    _step_2x2(env)
    env(procid=procid)
    with pytest.raises(ClusterConfigError, match=r"^SLURM_PROCID: .* is not a non-negative int"):
        SlurmClusterResolver()


def test_malformed_slurm_variables_raise_config_error_naming_the_variable(env):
    env(procid=0, num_tasks=4, nodelist="n[1-2]", tasks_per_node="2(x")
    with pytest.raises(ClusterConfigError, match=r"^SLURM_STEP_TASKS_PER_NODE: '2\(x' is not"):
        SlurmClusterResolver()
    env(nodelist="n[1-2", tasks_per_node="2(x2)")
    with pytest.raises(ClusterConfigError, match=r"^SLURM_STEP_NODELIST: 'n\[1-2' is not"):
        SlurmClusterResolver()


def test_node_list_and_tasks_per_node_of_different_lengths_raise(env):
    env(procid=0, num_tasks=4, nodelist="n[1-3]", tasks_per_node="2(x2)")
    with pytest.raises(ClusterConfigError, match="gives task counts for 2 nodes .* names 3"):
        SlurmClusterResolver()


def test_empty_node_list_raises_config_error(env):
    env(procid=0, num_tasks=1, nodelist="", tasks_per_node="1")
    with pytest.raises(ClusterConfigError, match="names no hosts"):
        SlurmClusterResolver()


def test_jobs_needing_more_tasks_than_the_step_has_raise_tf_runtime_error(env):
    _step_2x2(env)
    with pytest.raises(RuntimeError, match=r"^Requested 5 tasks but only 4 were assigned\.$"):
        SlurmClusterResolver(jobs={"worker": 4, "ps": 1})


def test_jobs_needing_fewer_tasks_than_the_step_has_also_raise(env):
    _step_2x2(env)
    # TF compares with != and keeps its wording.
    with pytest.raises(RuntimeError, match=r"^Requested 3 tasks but only 4 were assigned\.$"):
        SlurmClusterResolver(jobs={"worker": 3})


@pytest.mark.parametrize(
    "kwargs",
    [{"gpus_per_task": -1}, {"gpus_per_node": -2}, {"tasks_per_node": "two"}, {"jobs": {"w": 1.5}}],
)
def test_invalid_arguments_raise_config_error_naming_the_argument(env, kwargs):
    _step_2x2(env)
    name = next(iter(kwargs))
    with pytest.raises(ClusterConfigError, match=f"^{name}"):
        SlurmClusterResolver(**kwargs)


# ---- SlurmClusterResolver: GPUs ---------------------------------------------------------------


def test_auto_set_gpu_gives_each_task_its_slice_of_the_node(env):
    _step_2x2(env, procid=3)  # second task on n2
    resolver = SlurmClusterResolver(gpus_per_node=4)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # only cluster_spec() sets it, as in TF
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert resolver.num_accelerators() == {"GPU": 2}


def test_gpus_per_task_defaults_to_split_by_the_busiest_node(env):
    env(procid=3, num_tasks=4, nodelist="a,b", tasks_per_node="3,1")
    resolver = SlurmClusterResolver(gpus_per_node=7)  # 7 // 3 = 2
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # first (only) task on b
    assert resolver.num_accelerators(task_type="worker", task_id=0) == {"GPU": 2}


def test_explicit_gpus_per_task_is_used_for_the_slice(env):
    _step_2x2(env, procid=1)
    SlurmClusterResolver(gpus_per_node=8, gpus_per_task=3).cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,4,5"


def test_requesting_more_gpus_than_a_node_has_raises_tf_runtime_error(env):
    _step_2x2(env)
    with pytest.raises(RuntimeError, match=r"^Requested more GPUs per node than available\.$"):
        SlurmClusterResolver(gpus_per_node=4, gpus_per_task=3)


def test_gpus_per_node_defaults_to_the_visible_devices(env, monkeypatch):
    _step_2x2(env, procid=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # e.g. set by Slurm's --gres
    resolver = SlurmClusterResolver()
    resolver.cluster_spec()
    # Mapped through the list found at construction (TF would say "2,3": GPUs not ours).
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    resolver.cluster_spec()  # stable on repeated calls, though the variable has narrowed
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_cuda_visible_devices_shorter_than_the_node_falls_back_to_tf_indices(env, monkeypatch):
    _step_2x2(env, procid=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    SlurmClusterResolver(gpus_per_node=8).cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"  # TF's formula: node GPUs 4..7


def test_gpus_per_node_defaults_to_dev_nvidia_files(env):
    for index in range(4):
        (env.dev / f"nvidia{index}").touch()
    _step_2x2(env, procid=2)
    resolver = SlurmClusterResolver()
    resolver.cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_auto_set_gpu_false_leaves_cuda_visible_devices_alone(env):
    _step_2x2(env, procid=3)
    SlurmClusterResolver(gpus_per_node=4, auto_set_gpu=False).cluster_spec()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_zero_gpus_work_with_no_slice_and_no_accelerators(env, monkeypatch):
    _step_2x2(env, procid=1)
    resolver = SlurmClusterResolver()  # fake /dev has no GPUs; TF would divide by zero
    assert resolver.cluster_spec().num_tasks("worker") == 4
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    accelerators = resolver.num_accelerators()
    assert accelerators == {}
    assert accelerators["GPU"] == 0  # defaultdict, like the base resolver's result
    # More tasks than GPUs on a node also means 0 GPUs per task; the variable is left as is.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    SlurmClusterResolver(gpus_per_node=1).cluster_spec()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


# ---- SlurmClusterResolver: master() -----------------------------------------------------------


def test_master_returns_rpc_url_of_own_task_once_resolved(env):
    _step_2x2(env, procid=2)
    resolver = SlurmClusterResolver(gpus_per_node=0)
    resolver.cluster_spec()
    assert resolver.master() == "grpc://n2:8888"
    assert resolver.master(rpc_layer="grpc+verbs") == "grpc+verbs://n2:8888"
    assert resolver.master(rpc_layer="") == "grpc://n2:8888"  # TF: rpc_layer or self.rpc_layer


def test_master_with_explicit_task_resolves_the_cluster_first(env):
    _step_2x2(env, procid=2)
    resolver = SlurmClusterResolver(jobs={"ps": 1, "worker": 3}, gpus_per_node=0, rpc_layer=None)
    assert resolver.master("ps", 0) == "n1:8888"  # no rpc_layer: bare address
    assert resolver.get_task_info() == ("worker", 1)  # set as a side effect, as in TF
    with pytest.raises(ValueError):
        resolver.master("worker", 3)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    counts=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    gpus_per_node=st.integers(0, 8),
    ps=st.integers(0, 2),
)
def test_every_rank_agrees_on_the_cluster_and_gets_disjoint_gpus(env, counts, gpus_per_node, ps):
    total = sum(counts)
    jobs = {"ps": min(ps, total - 1), "worker": total - min(ps, total - 1)}
    nodes = ",".join(f"h{i}" for i in range(len(counts)))
    specs, slices = [], {}
    for rank in range(total):
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        env(procid=rank, nodelist=nodes, tasks_per_node=",".join(map(str, counts)))
        resolver = SlurmClusterResolver(jobs=jobs, gpus_per_node=gpus_per_node)
        spec = resolver.cluster_spec().as_dict()
        specs.append(spec)
        task_type, task_id = resolver.get_task_info()
        address = spec[task_type][task_id] if isinstance(spec[task_type], list) else None
        slices[address] = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert all(spec == specs[0] for spec in specs)
    addresses = [a for tasks in specs[0].values() if isinstance(tasks, list) for a in tasks]
    assert len(addresses) == len(set(addresses)) == total == len(slices)
    gpt = gpus_per_node // max(counts)
    for host in {a.split(":")[0] for a in addresses}:
        on_host = [cvd for a, cvd in slices.items() if a.startswith(host + ":")]
        used = [g for cvd in on_host if cvd for g in cvd.split(",")]
        assert len(used) == len(set(used))
        assert all(0 <= int(g) < gpus_per_node for g in used)
        assert len(used) == gpt * sum(1 for a in addresses if a.startswith(host + ":"))
