"""cluster.task_source: how a task process learns which task it is (TF_CONFIG, Kubernetes'
Indexed Jobs, Slurm), as pure rules and through real `python -m worker` processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster import exitcodes
from cluster.ctl.ports import pick_free_ports
from cluster.errors import TaskConfigError
from cluster.task_source import complete_tf_config, parse_slurm_jobs
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

CLUSTER = {"chief": ["a:2222"], "worker": ["b:2222", "c:2222"]}
CLUSTER_ONLY = json.dumps({"cluster": CLUSTER, "environment": "cloud"})
SLURM_STEP = {"SLURM_PROCID": "2", "SLURM_STEP_NODELIST": "node[1-2]",
              "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NUM_TASKS": "3",
              "SLURM_JOB_ID": "17", "SLURM_STEP_ID": "0"}


def test_a_complete_tf_config_is_left_alone() -> None:
    text = json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 1}})
    assert complete_tf_config({"TF_CONFIG": text}) is None
    assert complete_tf_config({}) is None


def test_kubernetes_pod_takes_its_index_from_job_completion_index() -> None:
    found = complete_tf_config({"TF_CONFIG": CLUSTER_ONLY, "CLUSTER_TASK_TYPE": "worker",
                                "JOB_COMPLETION_INDEX": "1"})
    assert found is not None and found.task == "worker:1"
    doc = json.loads(found.tf_config)
    assert doc == {"cluster": CLUSTER, "environment": "cloud",
                   "task": {"type": "worker", "index": 1}}
    assert "JOB_COMPLETION_INDEX" in found.source


def test_cluster_task_index_wins_over_job_completion_index() -> None:
    found = complete_tf_config({"TF_CONFIG": CLUSTER_ONLY, "CLUSTER_TASK_TYPE": "worker",
                                "CLUSTER_TASK_INDEX": "0", "JOB_COMPLETION_INDEX": "1"})
    assert found is not None and found.task == "worker:0"


@pytest.mark.parametrize(("env", "message"), [
    ({"CLUSTER_TASK_TYPE": "worker"}, "neither CLUSTER_TASK_INDEX nor JOB_COMPLETION_INDEX"),
    ({"CLUSTER_TASK_TYPE": "worker", "JOB_COMPLETION_INDEX": "x"}, "JOB_COMPLETION_INDEX='x'"),
    ({"CLUSTER_TASK_TYPE": "worker", "CLUSTER_TASK_INDEX": "-1"}, "CLUSTER_TASK_INDEX='-1'"),
])
def test_a_task_type_without_a_usable_index_is_refused(env, message) -> None:
    with pytest.raises(TaskConfigError, match=message):
        complete_tf_config({"TF_CONFIG": CLUSTER_ONLY, **env})


def test_no_task_type_leaves_the_error_to_the_runtime() -> None:
    assert complete_tf_config({"TF_CONFIG": CLUSTER_ONLY}) is None
    assert complete_tf_config({"TF_CONFIG": "{not json"}) is None


def test_slurm_builds_the_cluster_in_tf_rank_order(monkeypatch) -> None:
    env = {**SLURM_STEP, "CLUSTER_SLURM_JOBS": "chief:1,worker:2", "CUDA_VISIBLE_DEVICES": ""}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = complete_tf_config(env)
    assert found is not None
    doc = json.loads(found.tf_config)
    # TF: jobs sorted by name take ranks in turn; node1 holds ranks 0-1, node2 rank 2.
    assert doc["cluster"] == {"chief": ["node1:8888"], "worker": ["node1:8889", "node2:8888"]}
    assert doc["task"] == {"type": "worker", "index": 1}
    assert found.source == "Slurm (job 17, step 0)"


def test_slurm_without_jobs_makes_every_task_a_worker(monkeypatch) -> None:
    env = {**SLURM_STEP, "SLURM_PROCID": "0", "CLUSTER_SLURM_PORT_BASE": "7000",
           "CUDA_VISIBLE_DEVICES": ""}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    doc = json.loads(complete_tf_config(env).tf_config)
    assert doc["cluster"] == {"worker": ["node1:7000", "node1:7001", "node2:7000"]}
    assert doc["task"] == {"type": "worker", "index": 0}


def test_slurm_jobs_that_do_not_add_up_name_the_variable(monkeypatch) -> None:
    env = {**SLURM_STEP, "CLUSTER_SLURM_JOBS": "chief:1,worker:3", "CUDA_VISIBLE_DEVICES": ""}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(TaskConfigError, match="Requested 4 tasks.*CLUSTER_SLURM_JOBS"):
        complete_tf_config(env)


def test_tf_config_wins_over_slurm_and_says_so() -> None:
    text = json.dumps({"cluster": CLUSTER, "task": {"type": "chief", "index": 0}})
    found = complete_tf_config({"TF_CONFIG": text, **SLURM_STEP})
    assert found is not None and found.tf_config == text
    assert "TF_CONFIG wins" in found.note


@pytest.mark.parametrize(("text", "message"), [
    ("chief", "not JOB:COUNT"), ("worker:2,worker:1", "given twice"), (" , ", "names no job"),
    ("worker:x", "not JOB:COUNT"),
])
def test_bad_slurm_jobs_are_refused(text, message) -> None:
    with pytest.raises(TaskConfigError, match=message):
        parse_slurm_jobs(text)


def test_slurm_jobs_keep_their_order() -> None:
    assert list(parse_slurm_jobs("worker:2, chief:1,ps:1")) == ["worker", "chief", "ps"]


# -- through real processes -------------------------------------------------------------------

SHOW = "import json, os; print('task=' + json.dumps(json.loads(os.environ['TF_CONFIG'])['task']))"


@pytest.fixture
def show_script(tmp_path: Path) -> Path:
    path = tmp_path / "show.py"
    path.write_text(SHOW + "\n")
    return path


@pytest.mark.multiprocess
def test_worker_process_completes_tf_config_from_the_pod_index(task_processes, marker,
                                                               show_script) -> None:
    port = pick_free_ports("127.0.0.1", 1)[0]
    cluster_only = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]}})
    code, out = task_processes.python(
        "-m", "worker", str(show_script), tf_config=cluster_only, cwd=REPO,
        env={"CLUSTER_TEST_MARKER": marker, "CLUSTER_TASK_TYPE": "worker",
             "JOB_COMPLETION_INDEX": "0", "CLUSTER_CONNECT_TIMEOUT": "20"}).finish()
    assert code == 0, out
    assert 'task={"type": "worker", "index": 0}' in out


@pytest.mark.multiprocess
def test_worker_process_under_a_slurm_step_needs_no_tf_config(task_processes, marker,
                                                             show_script) -> None:
    port = pick_free_ports("127.0.0.1", 1)[0]
    env = {"CLUSTER_TEST_MARKER": marker, "SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "localhost",
           "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_STEP_NUM_TASKS": "1",
           "CLUSTER_SLURM_PORT_BASE": str(port), "CLUSTER_CONNECT_TIMEOUT": "20", "TF_CONFIG": ""}
    code, out = task_processes.python("-m", "worker", str(show_script), cwd=REPO,
                                      env=env).finish()
    assert code == 0, out
    assert 'task={"type": "worker", "index": 0}' in out


@pytest.mark.multiprocess
def test_worker_process_with_a_bad_index_exits_2(task_processes, marker, show_script) -> None:
    code, out = task_processes.python(
        "-m", "worker", str(show_script), tf_config=CLUSTER_ONLY, cwd=REPO,
        env={"CLUSTER_TEST_MARKER": marker, "CLUSTER_TASK_TYPE": "worker",
             "JOB_COMPLETION_INDEX": "one"}).finish()
    assert code == exitcodes.EXIT_USAGE, out
    assert "JOB_COMPLETION_INDEX='one'" in out
