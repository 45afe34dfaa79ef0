"""``clusterctl render`` of an elastic run: ``CLUSTER_ELASTIC=MIN:MAX`` reaches every chief and
worker (containers, the sbatch script, tf-config lines) and nothing else; a failed chief or
worker pod is replaced alone (Indexed Job per-index limits, TFJob restart policies), the objects
pass strict schema validation; the sbatch wrapper restarts a dead rank alone (run for real
under bash, without Slurm)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from cluster.ctl.cli import main
from cluster.ctl.render import RenderOptions, render
from cluster.ctl.render.k8s import PERMANENT_EXIT_CODES
from cluster.ctl.spec import load_cluster_file

pytestmark = pytest.mark.timeout(60)

VERSIONS = ("1.29", kubernetes_validate.latest_version())
ELASTIC = textwrap.dedent("""\
    name: elastic-run
    entrypoint: train.py
    cluster: {chief: 1, worker: 3, evaluator: 1}
    elastic: {min: 2, max: 4}
    """)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def rendered(tmp_path: Path, fmt: str, text: str = ELASTIC) -> str:
    return render(load_cluster_file(write(tmp_path, text)), fmt, RenderOptions())


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


def k8s_jobs(tmp_path: Path, text: str = ELASTIC) -> dict[str, dict]:
    docs = list(yaml.safe_load_all(rendered(tmp_path, "k8s", text)))
    for version in VERSIONS:
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)
    return {d["metadata"]["labels"]["cluster-runtime.dev/job"]: d for d in docs
            if d["kind"] == "Job"}


def test_k8s_chief_and_worker_pods_get_the_bounds_and_are_replaced_alone(tmp_path) -> None:
    jobs = k8s_jobs(tmp_path)
    for job, doc in jobs.items():
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        assert env_of(container).get("CLUSTER_ELASTIC") == (
            None if job == "evaluator" else "2:4"), job
    for job, max_failed in (("chief", 1), ("worker", 2)):  # 4 tasks - min 2, per Job
        spec = jobs[job]["spec"]
        assert spec["completionMode"] == "Indexed"  # index i is task i: same host name again
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        assert spec["podReplacementPolicy"] == "Failed"  # never two pods for one task
        assert spec["backoffLimitPerIndex"] == 3  # restart.max_worker_restarts per task
        assert spec["maxFailedIndexes"] == max_failed
        rules = spec["podFailurePolicy"]["rules"]
        assert rules[0] == {"action": "FailJob", "onExitCodes": {
            "containerName": "task", "operator": "In", "values": PERMANENT_EXIT_CODES}}
        assert rules[1]["action"] == "Ignore"  # an evicted or preempted pod costs nothing
    evaluator = jobs["evaluator"]["spec"]  # not in the group: fails fast as without elastic
    assert (evaluator["backoffLimitPerIndex"], evaluator["maxFailedIndexes"]) == (0, 0)


@pytest.mark.parametrize(("restart", "per_index", "fail_job"), [
    ("restart: {policy: on-failure, max_worker_restarts: 1, max_restarts: 1}\n", 3, False),
    ("restart: {policy: never}\n", 0, True),  # never: nothing is replaced, as without elastic
])
def test_k8s_replacements_follow_the_restart_block(tmp_path, restart, per_index,
                                                   fail_job) -> None:
    spec = k8s_jobs(tmp_path, ELASTIC + restart)["worker"]["spec"]
    assert spec["backoffLimitPerIndex"] == per_index
    assert any(r["action"] == "FailJob" for r in spec["podFailurePolicy"]["rules"]) == fail_job
    assert spec["maxFailedIndexes"] == (0 if "never" in restart else 2)


def test_a_run_without_elastic_renders_no_bounds(tmp_path) -> None:
    text = ELASTIC.replace("elastic: {min: 2, max: 4}\n", "")
    for fmt in ("k8s", "tfjob", "slurm", "tf-config"):
        assert "CLUSTER_ELASTIC" not in rendered(tmp_path, fmt, text), fmt
    (doc,) = yaml.safe_load_all(rendered(tmp_path, "tfjob", text))
    assert {r["restartPolicy"] for r in doc["spec"]["tfReplicaSpecs"].values()} == {"ExitCode"}


@pytest.mark.parametrize(("policy", "expected"), [
    ("exit-code", "ExitCode"), ("on-failure", "OnFailure"), ("never", "Never")])
def test_tfjob_chief_and_worker_replicas_follow_the_restart_policy(tmp_path, policy,
                                                                   expected) -> None:
    (doc,) = yaml.safe_load_all(rendered(tmp_path, "tfjob",
                                         ELASTIC + f"restart: {{policy: {policy}}}\n"))
    replicas = doc["spec"]["tfReplicaSpecs"]
    for rtype, replica in replicas.items():
        for version in VERSIONS:
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "PodTemplate",
                 "metadata": {"name": f"elastic-run-{rtype.lower()}"},
                 "template": replica["template"]}, version, strict=True)
        (container,) = replica["template"]["spec"]["containers"]
        member = rtype in ("Chief", "Worker")
        assert replica["restartPolicy"] == (expected if member else "ExitCode"), rtype
        assert env_of(container).get("CLUSTER_ELASTIC") == ("2:4" if member else None)


def test_tf_config_lines_carry_the_variable_for_chief_and_workers(tmp_path) -> None:
    lines = [line.split("\t") for line in rendered(tmp_path, "tf-config").splitlines()]
    extra = {fields[0]: fields[2:] for fields in lines}
    assert extra == {"chief:0": ["CLUSTER_ELASTIC=2:4"], "worker:0": ["CLUSTER_ELASTIC=2:4"],
                     "worker:1": ["CLUSTER_ELASTIC=2:4"], "worker:2": ["CLUSTER_ELASTIC=2:4"],
                     "evaluator:0": []}


def slurm_exports(script: str) -> dict[str, str]:
    """The variables the sbatch script exports (values as the shell would read them)."""
    out = {}
    for line in script.splitlines():
        if line.startswith("export "):
            for word in shlex.split(line)[1:]:
                name, _, value = word.partition("=")
                out[name] = value
    return out


def test_the_sbatch_script_exports_the_bounds_for_the_groups_ranks(tmp_path) -> None:
    exports = slurm_exports(rendered(tmp_path, "slurm"))
    assert exports["CLUSTER_ELASTIC"] == "2:4"
    # TF's rank order: chief 0, evaluator 1, worker 2-4; the evaluator is not in the group.
    assert exports["CLUSTER_ELASTIC_RANKS"] == "0 2 3 4"
    assert exports["CLUSTER_TASK_RESTARTS"] == "3"


TASK = textwrap.dedent("""\
    import os, signal, sys
    from pathlib import Path
    out = Path(sys.argv[1])
    with open(out / "starts", "a") as f:
        f.write(f"{os.getpid()} {os.environ.get('CLUSTER_ELASTIC', '-')}\\n")
    if not (out / "killed").exists():
        (out / "killed").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    """)


@pytest.mark.parametrize(("rank", "starts", "code", "bounds"), [
    (2, 2, "0", "2:4"),  # a worker: killed, started again alone, then exits 0
    (1, 1, "137", "-"),  # the evaluator: not in the group, not restarted, no bounds
])
def test_the_sbatch_wrapper_restarts_a_dead_rank_alone(tmp_path, rank, starts, code,
                                                       bounds) -> None:
    exports = slurm_exports(rendered(tmp_path, "slurm"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "task.py").write_text(TASK)
    env = {**os.environ, **{k: exports[k] for k in (
        "CLUSTER_TASK_WRAPPER", "CLUSTER_ELASTIC", "CLUSTER_ELASTIC_RANKS",
        "CLUSTER_TASK_RESTARTS")},
           "CLUSTER_RUN_DIR": str(run_dir), "SLURM_PROCID": str(rank),
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", "-c", 'eval "$CLUSTER_TASK_WRAPPER"', "task",
                           str(tmp_path / "task.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=30)
    assert str(done.returncode) == code, done.stderr
    lines = (tmp_path / "starts").read_text().splitlines()
    assert len(lines) == starts and {line.split()[1] for line in lines} == {bounds}
    assert (run_dir / f"{rank}.exit").read_text().split()[0] == code
    if starts == 2:
        assert f"[slurm] rank {rank} exited 137: restarting it alone (restart 1 of 3)" \
            in done.stderr


def test_render_elastic_flag_overrides_the_file(tmp_path, capsys) -> None:
    path = write(tmp_path, ELASTIC)
    assert main(["render", str(path), "--format", "tf-config", "--elastic", "1:3"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("\tCLUSTER_ELASTIC=1:3")
    assert main(["render", str(path), "--format", "k8s", "--elastic", "1:5"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: --elastic: max 5 is above the 4 chief and worker tasks" in err
