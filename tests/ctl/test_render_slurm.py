"""`clusterctl render --format slurm` as text (no Slurm needed): the script's shape, what it
refuses, the exit code the run gets from its tasks' records, and the placement check of a Slurm
task (tests/slurm runs the scripts on a real Slurm)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.ctl import policy
from cluster.ctl.render.slurm import SlurmRenderError, rank_order, render_slurm
from cluster.ctl.slurm_outcome import decide, main, read_exits
from cluster.ctl.spec import load_cluster_file
from cluster.errors import TaskConfigError
from cluster.task_source import complete_tf_config
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

QUICKSTART = REPO / "examples" / "quickstart" / "cluster.yaml"
PS = REPO / "examples" / "ps" / "cluster.yaml"


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.ctl.cli", "render", *argv],
                          capture_output=True, text=True, timeout=30, cwd=REPO)


def test_collective_file_is_one_srun_command_with_every_sbatch_line():
    proc = _cli(str(QUICKSTART), "--format", "slurm", "--nodes", "2", "--partition", "gpu",
                "--time", "1:00:00")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert sbatch == ["#SBATCH --job-name=quickstart", "#SBATCH --nodes=2",
                      "#SBATCH --ntasks=3", "#SBATCH --partition=gpu", "#SBATCH --time=1:00:00",
                      "#SBATCH --signal=TERM@10",  # timeouts.grace before the time limit
                      "#SBATCH --output=quickstart-%j.out"]
    assert "set -euo pipefail" in script
    assert "export CLUSTER_SLURM_JOBS=chief:1,worker:2\n" in script
    assert "\nunset TF_CONFIG " in script  # the submitter's would win over the Slurm step
    assert "--multi-prog" not in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert srun.startswith("srun --kill-on-bad-exit=1 --label --distribution=block --ntasks=3 ")
    assert "-m worker " + str(QUICKSTART.parent / "train.py") + " --epochs 10" in srun
    assert "export OMP_NUM_THREADS=1\n" in script
    assert "CLUSTER_CONNECT_TIMEOUT=60 CLUSTER_HEARTBEAT_TIMEOUT=3" in script
    assert f"cd {QUICKSTART.parent}\n" in script
    assert "awk -v tasks='chief:0 worker:0 worker:1'" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, timeout=30).returncode == 0


def test_the_token_is_made_in_the_job_and_never_written():
    script = render_slurm(load_cluster_file(QUICKSTART))
    token_lines = [line for line in script.splitlines() if "CLUSTER_TOKEN" in line]
    assert token_lines == ['CLUSTER_TOKEN="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d \' '
                           '\\n\')"', "export CLUSTER_TOKEN"]


def test_port_base_moves_with_the_job_id_unless_the_file_fixes_it():
    spec = load_cluster_file(QUICKSTART)
    script = render_slurm(spec)
    assert ('export CLUSTER_SLURM_PORT_BASE="${CLUSTER_SLURM_PORT_BASE:-$(( 10000 + '
            'SLURM_JOB_ID % 7333 * 3 ))}"') in script  # blocks of 3 ports in 10000-31999
    fixed = render_slurm(dataclasses.replace(spec, port_base=2222))
    assert 'CLUSTER_SLURM_PORT_BASE:-2222}"' in fixed


def test_parameter_servers_get_multi_prog_in_tf_rank_order():
    spec = load_cluster_file(PS)
    assert [f"{j}:{i}" for j, i in rank_order(spec)] == [
        "chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    script = render_slurm(spec, nodes=2)
    conf = script.split("<<'EOF'\n")[1].split("\nEOF\n")[0].splitlines()
    train = PS.parent / "train.py"
    assert conf == [
        f"""0 bash -c 'eval "$CLUSTER_CHIEF_WRAPPER"' chief '-m' 'worker' '{train}' '--epochs' """
        "'20'",
        """1-2 bash -c 'eval "$CLUSTER_TASK_WRAPPER"' ps '-m' 'ps'""",
        """3-4 bash -c 'eval "$CLUSTER_TASK_WRAPPER"' worker '-m' 'worker'""",
    ]
    assert "--wait=10 --multi-prog" in script  # servers outlive the chief by the grace at most
    assert subprocess.run(["bash", "-n"], input=script, text=True, timeout=30).returncode == 0


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "4"], "--nodes 4: expected 1 to 3"),
    (["--nodes", "0"], "--nodes 0: expected 1 to 3"),
    (["--partition", "a b"], "--partition 'a b': expected one word"),
])
def test_bad_options_exit_2_naming_them(argv, message):
    proc = _cli(str(QUICKSTART), "--format", "slurm", *argv)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_slurm_options_do_not_apply_to_tf_config():
    proc = _cli(str(QUICKSTART), "--nodes", "2")
    assert proc.returncode == 2
    assert "--nodes does not apply to --format tf-config (only to slurm)" in proc.stderr


def test_arguments_multi_prog_cannot_carry_are_refused(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(f"entrypoint: {PS.parent / 'train.py'}\nmode: coordinator\n"
                    "args: [\"--name\", \"it's\"]\ncluster: {chief: 1, worker: 1}\n")
    with pytest.raises(SlurmRenderError, match="cannot be passed through srun --multi-prog"):
        render_slurm(load_cluster_file(path))


def test_a_stall_timeout_the_file_gives_is_exported_with_the_others(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(f"entrypoint: {QUICKSTART.parent / 'train.py'}\ncluster: {{worker: 2}}\n"
                    "timeouts: {heartbeat: 5, stall: 90}\n")
    script = render_slurm(load_cluster_file(path))
    assert ("export CLUSTER_CONNECT_TIMEOUT=60 CLUSTER_HEARTBEAT_TIMEOUT=5 "
            "CLUSTER_STALL_TIMEOUT=90 PYTHONUNBUFFERED=1\n") in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, timeout=30).returncode == 0


def _exit(task: str, code: int, order: int, stopped: bool = False) -> policy.TaskExit:
    return policy.TaskExit(task, code, order, stopped)


@pytest.mark.parametrize("mode, exits, srun_exit, expected", [
    # every task exited 0
    ("collective", [_exit("chief:0", 0, 0), _exit("worker:0", 0, 1)], 0, 0),
    # srun's highest code is 201 or 143; the root cause raised (permanent 1)
    ("collective", [_exit("worker:1", 1, 0), _exit("worker:0", 143, 1, True),
                    _exit("chief:0", 201, 2, True)], 201, 1),
    # a task killed by a signal it did not get from Slurm (OOM): retryable, its own code
    ("collective", [_exit("worker:1", 137, 0), _exit("chief:0", 201, 1)], 201, 137),
    # no record readable (run directory not shared): srun's code, never 0
    ("collective", [], 143, 143),
    # coordinator: the chief succeeded, srun killed the servers (137): success
    ("coordinator", [_exit("chief:0", 0, 0), _exit("ps:0", 0, 1, True)], 137, 0),
    # coordinator: the chief failed; its stopped servers are not the cause
    ("coordinator", [_exit("chief:0", 1, 0), _exit("ps:0", 0, 1, True),
                     _exit("worker:0", 0, 2, True)], 1, 1),
    # coordinator: a parameter server died first: it is the root cause
    ("coordinator", [_exit("ps:1", 137, 0), _exit("chief:0", 1, 1)], 137, 137),
])
def test_the_run_exit_code_is_the_root_cause(mode, exits, srun_exit, expected):
    assert decide(exits, mode, srun_exit)[0] == expected


def test_outcome_reads_the_wrappers_records_and_names_the_root_cause(tmp_path: Path, capsys):
    (tmp_path / "0.exit").write_text("201 1700000002.5 1 node1\n")
    (tmp_path / "1.exit").write_text("143 1700000002.1 1 node1\n")
    (tmp_path / "2.exit").write_text("1 1700000001.0 0 node2\n")
    (tmp_path / "2.error.json").write_text('{"task": "worker:1", "error_type": "ValueError", '
                                           '"message": "boom", "exit_code": 1}')
    tasks = ["chief:0", "worker:0", "worker:1"]
    assert [(e.task, e.code, e.order, e.stopped) for e in read_exits(tmp_path, tasks)] == [
        ("worker:1", 1, 0, False), ("worker:0", 143, 1, True), ("chief:0", 201, 2, True)]
    code = main(["--mode", "collective", "--tasks", ",".join(tasks), "--srun-exit", "201",
                 str(tmp_path)])
    assert code == 1
    assert capsys.readouterr().err == ("[slurm] the run failed: worker:1 on node2 exited 1 "
                                       "(uncaught exception): ValueError: boom\n")


def test_a_root_cause_killed_on_its_way_out_fails_with_the_code_it_recorded(tmp_path: Path,
                                                                            capsys):
    # worker:1 recorded its ValueError (exit 1), then hung at exit until Slurm killed the step.
    (tmp_path / "0.exit").write_text("201 1700000001.5 0 node1\n")
    (tmp_path / "1.exit").write_text("201 1700000001.6 0 node1\n")
    (tmp_path / "2.exit").write_text("137 1700000009.0 1 node2\n")
    (tmp_path / "2.error.json").write_text('{"task": "worker:1", "error_type": "ValueError", '
                                           '"message": "boom", "exit_code": 1}')
    tasks = ["chief:0", "worker:0", "worker:1"]
    assert [(e.task, e.code, e.declared) for e in read_exits(tmp_path, tasks)] == [
        ("chief:0", 201, None), ("worker:0", 201, None), ("worker:1", 137, 1)]
    code = main(["--mode", "collective", "--tasks", ",".join(tasks), "--srun-exit", "201",
                 str(tmp_path)])
    assert code == 1  # permanent: srun's 201 and the 137 would both say "retry"
    assert capsys.readouterr().err == (
        "[slurm] the run failed: worker:1 on node2 failed 1 (uncaught exception), then was "
        "killed 137 (SIGKILL) on its way out: ValueError: boom\n")


def test_a_rank_slurm_placed_elsewhere_is_refused_naming_the_fix(monkeypatch):
    step = {"SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "node[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NUM_TASKS": "3"}
    for key, value in step.items():
        monkeypatch.setenv(key, value)
    # block order: rank 1 is node1's second task; srun -m cyclic put it on node2 as its first
    with pytest.raises(TaskConfigError, match="--distribution=block"):
        complete_tf_config({**step, "SLURMD_NODENAME": "node2", "SLURM_LOCALID": "0"})
    found = complete_tf_config({**step, "SLURMD_NODENAME": "node1", "SLURM_LOCALID": "1"})
    assert found is not None and found.task == "worker:1"
