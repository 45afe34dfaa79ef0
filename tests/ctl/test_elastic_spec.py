"""Elastic runs on the command line and in the cluster file: ``elastic: {min, max}`` and
``--elastic MIN:MAX`` validated at the edge (exit 2, file/line/key or the flag, and the fix;
nothing started), the flag over the file's key, and the per-task decision of
:func:`cluster.ctl.policy.on_elastic_exit` as a table. No processes are started here."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cluster.ctl import oneline
from cluster.ctl._elastic import ENV_ELASTIC, Elastic, with_elastic
from cluster.ctl.cli import main
from cluster.ctl.policy import TaskAction, on_elastic_exit
from cluster.ctl.spec import RESERVED_ENV, RestartPolicy, parse_cluster_file
from cluster.errors import ClusterFileError

pytestmark = pytest.mark.timeout(30)

BASE = "entrypoint: train.py\ncluster: {chief: 1, worker: 3}\n"


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(text) + f"log_dir: {tmp_path / 'runs'}\n")
    return path


def test_validate_says_the_run_is_elastic(tmp_path, capsys) -> None:
    path = write(tmp_path, BASE + "elastic: {min: 2, max: 4}\n")
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("; mode collective; elastic 2:4")


def test_the_file_key_gives_the_bounds(tmp_path) -> None:
    path = write(tmp_path, BASE + "elastic: {min: 2, max: 4}\nrestart: {max_worker_restarts: 5}\n")
    spec = parse_cluster_file(path.read_text(), path)
    assert spec.elastic == Elastic(2, 4) and str(spec.elastic) == "2:4"
    assert spec.restart == RestartPolicy(max_worker_restarts=5)  # allowed with elastic
    assert ENV_ELASTIC == "CLUSTER_ELASTIC" and ENV_ELASTIC in RESERVED_ENV
    assert parse_cluster_file((tmp_path / "cluster.yaml").read_text().replace(
        "elastic: {min: 2, max: 4}\nrestart: {max_worker_restarts: 5}\n", ""), path).elastic \
        is None


BAD_FILES = [
    # (text after BASE or a whole file, line, expected, hint)
    (BASE + "elastic: {min: 0, max: 4}\n", 3, "elastic.min: must be >= 1, got 0",
     "a number of chief and worker tasks"),
    (BASE + "elastic: {min: 3, max: 2}\n", 3, "elastic: min 3 is above max 2",
     "min: 2, max: 3"),
    (BASE + "elastic:\n  min: 2\n  max: 5\n", 5,
     "elastic.max: max 5 is above the 4 chief and worker tasks of this cluster",
     "use max <= 4, or start 1 more task under `cluster:`"),
    (BASE + "elastic: {min: 2}\n", 3, "elastic.max: missing", "elastic: {min: 2, max: 4}"),
    (BASE + "elastic: 2:4\n", 3, "elastic: expected a mapping", "elastic: {min: 2, max: 4}"),
    (BASE + "elastic: {min: 2, max: 4, step: 1}\n", 3, "elastic.step: unknown key", ""),
    (BASE + "elastic: {min: two, max: 4}\n", 3, "elastic.min: expected an integer", ""),
    ("entrypoint: train.py\nmode: coordinator\ncluster: {chief: 1, worker: 2, ps: 1}\n"
     "elastic: {min: 1, max: 3}\n", 4, "elastic: parameter servers are not elastic",
     "run a collective job of chief and workers"),
    ("entrypoint: train.py\ncluster: {chief: 1, worker: 2, ps: 1}\n"
     "elastic: {min: 1, max: 3}\n", 3, "elastic: parameter servers are not elastic", ""),
    ("entrypoint: train.py\nmode: coordinator\ncluster: {chief: 1, worker: 2}\n"
     "elastic: {min: 1, max: 3}\n", 4, "elastic: elastic runs need `mode: collective`", ""),
]


@pytest.mark.parametrize(("text", "line", "expected", "hint"), BAD_FILES)
@pytest.mark.parametrize("command", ["validate", "launch", "render"])
def test_a_bad_elastic_key_exits_2_naming_file_line_key_and_fix(tmp_path, capsys, text, line,
                                                                expected, hint,
                                                                command) -> None:
    path = write(tmp_path, text)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: {expected}" in err, err
    hints = [t for t in err.splitlines() if t.strip().startswith("hint:")]
    assert not hint or any(hint in t for t in hints), err
    assert "nothing started" in err
    assert not (tmp_path / "runs").exists()


BAD_FLAGS = [
    # (-n, --ps, --elastic, expected, hint)
    (4, 0, "2-4", "--elastic: expected MIN:MAX (two whole numbers, e.g. 2:4), got '2-4'",
     "--elastic 2:4"),
    (4, 0, "two:4", "expected MIN:MAX", ""),
    (4, 0, "0:4", "--elastic: min must be >= 1, got 0", "--elastic 1:4"),
    (4, 0, "3:2", "--elastic: min 3 is above max 2", "--elastic 2:3"),
    (4, 0, "2:5", "--elastic: max 5 is above the 4 chief and worker tasks of this cluster",
     "use max <= 4, or start -n 5"),
    (3, 1, "1:3", "--elastic: parameter servers are not elastic", "no --ps"),
]


@pytest.mark.parametrize(("n", "ps", "flag", "expected", "hint"), BAD_FLAGS)
def test_a_bad_elastic_flag_exits_2_with_the_fix(tmp_path, capsys, monkeypatch, n, ps, flag,
                                                 expected, hint) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    argv = ["launch", "-n", str(n), *(["--ps", str(ps)] if ps else []), "--elastic", flag,
            "train.py"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"clusterctl launch -n {n}" in err and f"--elastic {flag} train.py: " in err, err
    assert expected in err
    hints = [t for t in err.splitlines() if t.strip().startswith("hint:")]
    assert not hint or any(hint in t for t in hints), err
    assert "nothing started" in err
    assert not (tmp_path / "runs").exists()


def test_the_flag_overrides_the_files_key_and_is_checked_against_the_file(tmp_path,
                                                                          capsys) -> None:
    path = write(tmp_path, BASE + "elastic: {min: 2, max: 4}\n")
    spec = parse_cluster_file(path.read_text(), path)
    assert with_elastic(spec, "1:3", str(path)).elastic == Elastic(1, 3)
    with pytest.raises(ClusterFileError) as info:
        with_elastic(spec, "1:9", str(path))
    (problem,) = info.value.problems
    assert (problem.file, problem.key) == (str(path), "--elastic")
    assert main(["launch", "--elastic", "1:9", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: --elastic: max 9 is above the 4 chief and worker tasks" in err


def test_the_one_line_launch_becomes_elastic(tmp_path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = with_elastic(oneline.spec_for_script("train.py", 4, cwd=tmp_path), "2:4", "cmd")
    assert spec.elastic == Elastic(2, 4)
    assert spec.tasks() == [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)]


def test_the_variable_is_the_one_the_tasks_read() -> None:
    from cluster import settings

    assert ENV_ELASTIC == settings.ENV_ELASTIC
    assert settings.parse_elastic(str(Elastic(2, 4))) == (2, 4)
    env = {ENV_ELASTIC: str(Elastic(1, 3)), "CLUSTER_COORDINATION_SERVICE": "127.0.0.1:2300"}
    task = settings.TaskSettings.from_env(env)
    assert (task.elastic, task.coordination_service) == ((1, 3), "127.0.0.1:2300")


def test_the_bounds_are_an_invariant_of_the_dataclasses() -> None:
    for low, high in ((0, 2), (3, 2)):
        with pytest.raises(ValueError):
            Elastic(low, high)


# -- the decision, per task ---------------------------------------------------------------------

RESTART = TaskAction.RESTART
GIVE_UP = TaskAction.GIVE_UP
BELOW = TaskAction.BELOW_MIN
NONE = TaskAction.NONE


@pytest.mark.parametrize(("task", "code", "restarts", "policy", "running", "expected"), [
    ("worker:1", 137, 0, "exit-code", 3, RESTART),  # killed: restarted alone
    ("chief:0", 137, 0, "exit-code", 3, RESTART),  # the chief too
    ("worker:1", 143, 2, "exit-code", 3, RESTART),  # the third of max 3
    ("worker:1", 137, 3, "exit-code", 3, GIVE_UP),  # restarts used up, min still run
    ("worker:1", 137, 0, "exit-code", 1, BELOW),  # 1 left of min 2
    ("worker:1", 137, 3, "exit-code", 1, BELOW),  # used up and too few: the run fails
    ("worker:1", 0, 0, "exit-code", 3, NONE),  # finished: not restarted
    ("worker:1", 1, 0, "exit-code", 3, NONE),  # permanent: fails the run, as without elastic
    ("worker:1", 1, 0, "on-failure", 3, RESTART),  # ... unless the policy retries it
    ("worker:1", 137, 0, "never", 3, NONE),  # never: the run fails as without elastic
    ("evaluator:0", 137, 0, "exit-code", 3, NONE),  # not a member of the group
    ("ps:0", 137, 0, "exit-code", 3, NONE),
])
def test_on_elastic_exit_table(task, code, restarts, policy, running, expected) -> None:
    assert on_elastic_exit(task, code, restarts_done=restarts, max_restarts=3, policy=policy,
                           running=running, minimum=2) is expected
