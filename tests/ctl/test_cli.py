"""clusterctl validate / render / launch on bad files: exit 2, file + line + key + hint, nothing
started. No processes are started by these tests."""

from __future__ import annotations

import dataclasses
import json
import textwrap
import types
from pathlib import Path

import pytest

from cluster.ctl import cli
from cluster.ctl.cli import color_choice, main
from cluster.ctl.spec import RestartPolicy, Timeouts, parse_cluster_file
from cluster.errors import ClusterFileError

pytestmark = pytest.mark.timeout(30)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(text))
    return path


GOOD = textwrap.dedent("""\
    name: demo
    entrypoint: train.py
    args: ["--epochs", 3]
    cluster:
      chief: 1
      worker: 2
      ps: 0
    """)

BAD = [
    # (file text, line, expected text, hint)
    ("entrypoint: train.py\ncluster:\n  worker: 2\n   ps: 1\n", 4, "invalid YAML",
     "indentation"),
    ("entrypoint: train.py\ncluster: {worker: 2}\nmax_restart: 3\n", 3,
     "max_restart: unknown key 'max_restart'", 'did you mean "restart"?'),
    ("entrypoint: train.py\ncluster: {worker: 2}\nrestart:\n  max_restart: 3\n", 4,
     "restart.max_restart: unknown key", 'did you mean "max_restarts"?'),
    ("entrypoint: train.py\ncluster:\n  worker: -2\n", 3, "cluster.worker: negative task count -2",
     "0 or more"),
    ("entrypoint: train.py\ncluster:\n  workers: 2\n", 3, "cluster.workers: unknown job 'workers'",
     'did you mean "worker"?'),
    ("entrypoint: train.py\ncluster:\n  trainer: 2\n", 3, "cluster.trainer: unknown job",
     "jobs are chief, worker, ps, evaluator"),
    ("cluster: {worker: 2}\n", 1, "entrypoint: missing", "entrypoint: train.py"),
    ("entrypoint: nope.py\ncluster: {worker: 2}\n", 1, "entrypoint: file not found", "relative"),
    ("entrypoint: train.py\ncluster: {worker: [\"localhost\"]}\n", 2, "cluster.worker[0]",
     "host:port"),
    ("entrypoint: train.py\ncluster: {worker: 1}\ntimeouts: {grace: -1}\n", 3,
     "timeouts.grace: must be >= 0", ""),
    ("entrypoint: train.py\ncluster: {worker: 1}\nenv: {CLUSTER_TOKEN: x}\n", 3,
     "env.CLUSTER_TOKEN: is set by clusterctl", "remove it"),
    ("entrypoint: train.py\ncluster: {ps: 1}\n", 2, "no chief and no worker", "worker: 1"),
    ("entrypoint: train.py\ncluster: {worker: 1}\ncluster: {worker: 2}\n", 3,
     "duplicate key 'cluster'", ""),
    # mode: collective (default) | coordinator
    ("mode: coordinater\nentrypoint: train.py\ncluster: {chief: 1, worker: 1}\n", 1,
     "mode: unknown mode 'coordinater' (allowed: collective, coordinator)",
     'did you mean "coordinator"?'),
    ("entrypoint: train.py\nmode: ring\ncluster: {chief: 1, worker: 1}\n", 2,
     "mode: unknown mode 'ring' (allowed: collective, coordinator)", "parameter-server"),
    ("entrypoint: train.py\nmode: 3\ncluster: {chief: 1, worker: 1}\n", 2,
     "mode: expected one of collective, coordinator, got int 3", "coordinator ("),
    ("entrypoint: train.py\nmode: coordinator\ncluster: {worker: 2, ps: 1}\n", 2,
     "mode: coordinator needs a chief", "add `chief: 1`"),
    ("entrypoint: train.py\nmode: coordinator\ncluster: {chief: 1, worker: 0, ps: 2}\n", 2,
     "mode: coordinator needs at least one worker", "worker: 2"),
    ("entrypoint: train.py\ncluster: {worker: 1}\nrestart: {max_worker_restarts: 2}\n", 3,
     "restart.max_worker_restarts: only applies to `mode: coordinator`",
     "add `mode: coordinator` or remove this key"),
    ("entrypoint: train.py\nmode: coordinator\ncluster: {chief: 1, worker: 1}\n"
     "restart:\n  max_worker_restarts: -1\n", 5, "restart.max_worker_restarts: must be >= 0", ""),
    ("entrypoint: train.py\nmode: coordinator\ncluster: {chief: 1, worker: 1}\n"
     "restart:\n  max_workers_restarts: 1\n", 5, "restart.max_workers_restarts: unknown key",
     'did you mean "max_worker_restarts"?'),
]


@pytest.mark.parametrize(("text", "line", "expected", "hint"), BAD)
@pytest.mark.parametrize("command", ["validate", "launch", "render"])
def test_bad_file_exits_2_naming_file_line_key_and_starts_nothing(tmp_path, capsys, text, line,
                                                                  expected, hint,
                                                                  command) -> None:
    path = write(tmp_path, text + f"log_dir: {tmp_path / 'runs'}\n")
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: " in err
    assert expected in err
    hints = [text for text in err.splitlines() if text.strip().startswith("hint:")]
    assert not hint or any(hint in text for text in hints), err
    assert "nothing started" in err
    assert not (tmp_path / "runs").exists()


def test_every_problem_is_reported_in_line_order(tmp_path) -> None:
    path = write(tmp_path, "entrypoint: nope.py\ncluster:\n  wrker: 1\n  worker: -1\n"
                 "timeouts: {startup: 0}\n")
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(path.read_text(), path)
    assert [(p.line, p.key) for p in info.value.problems] == [
        (1, "entrypoint"), (3, "cluster.wrker"), (4, "cluster.worker"), (5, "timeouts.startup")]


def test_unreadable_file(tmp_path, capsys) -> None:
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the file" in capsys.readouterr().err


def test_valid_file_parses_into_frozen_dataclasses(tmp_path) -> None:
    path = write(tmp_path, GOOD + "env: {A: 1}\nrestart: {max_restarts: 2, policy: on-failure}\n"
                 "timeouts: {startup: 5, run: 60}\n")
    spec = parse_cluster_file(path.read_text(), path)
    assert spec.name == "demo"
    assert spec.entrypoint == (tmp_path / "train.py").resolve()
    assert spec.args == ("--epochs", "3")
    assert spec.env == {"A": "1"}
    assert spec.tasks() == [("chief", 0), ("worker", 0), ("worker", 1)]
    assert spec.restart == RestartPolicy(2, "on-failure")
    assert spec.timeouts == Timeouts(startup=5.0, run=60.0)
    assert spec.log_dir == tmp_path / "runs"
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


def test_stall_is_the_tasks_default_unless_the_file_or_its_env_gives_it(tmp_path) -> None:
    def parsed(extra: str):
        path = write(tmp_path, GOOD + extra)
        return parse_cluster_file(path.read_text(), path)

    assert parsed("").timeouts.stall is None
    assert "CLUSTER_STALL_TIMEOUT" not in parsed("").timeouts.task_env()
    spec = parsed("timeouts: {heartbeat: 5, stall: 120}\n")
    assert spec.timeouts == Timeouts(heartbeat=5.0, stall=120.0)
    assert spec.timeouts.task_env() == {"CLUSTER_CONNECT_TIMEOUT": "60",
                                        "CLUSTER_HEARTBEAT_TIMEOUT": "5",
                                        "CLUSTER_STALL_TIMEOUT": "120"}
    assert parsed("timeouts: {stall: null}\n").timeouts.stall is None
    # Without timeouts.stall, env: may still set it (the variable then reaches the tasks as is)
    assert parsed("env: {CLUSTER_STALL_TIMEOUT: '90'}\n").env == {"CLUSTER_STALL_TIMEOUT": "90"}


def test_validate_ok(tmp_path, capsys) -> None:
    assert main(["validate", str(write(tmp_path, GOOD))]) == 0
    assert "OK: run 'demo', tasks chief:0, worker:0, worker:1" in capsys.readouterr().out


def test_render_prints_each_tasks_tf_config_like_kubeflow(tmp_path, capsys) -> None:
    path = write(tmp_path, GOOD + "port_base: 3000\n")
    assert main(["render", str(path), "--format", "tf-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["chief:0", "worker:0", "worker:1"]
    assert lines[2].split("\t")[1] == (
        '{"cluster":{"chief":["127.0.0.1:3000"],"worker":["127.0.0.1:3001","127.0.0.1:3002"]},'
        '"task":{"type":"worker","index":1},"environment":"cloud"}')
    assert main(["render", str(path), "--task", "chief:0"]) == 0
    assert json.loads(capsys.readouterr().out)["task"] == {"type": "chief", "index": 0}
    assert main(["render", str(path), "--task", "worker:9"]) == 2


def test_render_keeps_listed_addresses(tmp_path, capsys) -> None:
    path = write(tmp_path, 'entrypoint: train.py\ncluster:\n  worker: ["10.0.0.1:2222", '
                 '"10.0.0.2:2222"]\n  ps: 1\nhost: 10.0.0.9\n')
    assert main(["render", str(path)]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0].split("\t")[1])
    assert first["cluster"] == {"ps": ["10.0.0.9:2222"],
                                "worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}


def test_no_command_prints_usage_and_exits_2(capsys) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: clusterctl" in err and "launch -n 2 train.py" in err


COORDINATOR = textwrap.dedent("""\
    name: ps-training
    mode: coordinator
    entrypoint: train.py
    args: ["--steps", 10]
    cluster:
      chief: 1
      worker: 2
      ps: 1
      evaluator: 1
    """)


def test_coordinator_mode_parses_and_only_chief_and_evaluator_run_the_entrypoint(
        tmp_path) -> None:
    path = write(tmp_path, COORDINATOR)
    spec = parse_cluster_file(path.read_text(), path)
    script = str((tmp_path / "train.py").resolve())
    assert spec.mode == "coordinator"
    assert spec.restart == RestartPolicy(max_worker_restarts=3)  # the default bound
    assert spec.task_argv("chief") == ("-m", "worker", script, "--steps", "10")
    assert spec.task_argv("evaluator") == ("-m", "worker", script, "--steps", "10")
    assert spec.task_argv("worker") == ("-m", "worker")  # serves the coordinator
    assert spec.task_argv("ps") == ("-m", "ps")
    module = path.read_text().replace("entrypoint: train.py", "module: pkg.train")
    path.write_text(module + "restart: {max_worker_restarts: 0, max_restarts: 1}\n")
    spec = parse_cluster_file(path.read_text(), path)
    assert spec.task_argv("chief") == ("-m", "worker", "-m", "pkg.train", "--steps", "10")
    assert spec.task_argv("worker") == ("-m", "worker")
    assert spec.restart == RestartPolicy(max_restarts=1, max_worker_restarts=0)


def test_collective_mode_is_the_default_and_every_trainer_runs_the_entrypoint(tmp_path) -> None:
    for text in (GOOD, GOOD + "mode: collective\n"):
        path = write(tmp_path, text)
        spec = parse_cluster_file(path.read_text(), path)
        assert spec.mode == "collective"
        script = str((tmp_path / "train.py").resolve())
        assert spec.task_argv("worker") == ("-m", "worker", script, "--epochs", "3")


def test_coordinator_mode_without_ps_is_valid(tmp_path, capsys) -> None:
    path = write(tmp_path, "mode: coordinator\nentrypoint: train.py\n"
                 "cluster: {chief: 1, worker: 1}\n")
    assert main(["validate", str(path)]) == 0
    assert "tasks chief:0, worker:0; mode coordinator" in capsys.readouterr().out


def test_cluster_file_refuses_a_bad_mode_when_built_directly(tmp_path) -> None:
    path = write(tmp_path, COORDINATOR)
    spec = parse_cluster_file(path.read_text(), path)
    with pytest.raises(ValueError, match="mode must be one of collective, coordinator"):
        dataclasses.replace(spec, mode="ring")
    with pytest.raises(ValueError, match="needs a chief and at least one worker"):
        dataclasses.replace(spec, jobs=tuple(j for j in spec.jobs if j.name != "chief"))


def test_render_in_coordinator_mode_gives_every_task_its_tf_config(tmp_path, capsys) -> None:
    path = write(tmp_path, COORDINATOR + "port_base: 4000\n")
    assert main(["render", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [
        "chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]


@pytest.mark.parametrize(("flag", "no_color", "expected"), [
    ("auto", False, "auto"),
    ("auto", True, "never"),
    ("always", True, "always"),
    ("never", False, "never"),
])
def test_no_color_turns_auto_colour_off_and_explicit_flags_win(flag, no_color, expected) -> None:
    assert color_choice(flag, no_color) == expected


@pytest.mark.parametrize(("value", "expected"), [(None, "auto"), ("1", "never"), ("", "auto")])
def test_launch_is_told_no_color_read_from_the_environment_by_the_cli(
        tmp_path, monkeypatch, value, expected) -> None:
    path = write(tmp_path, GOOD)
    seen = {}

    def fake_launch(spec, **kwargs):
        seen.update(kwargs)
        return types.SimpleNamespace(exit_code=0)

    monkeypatch.setattr(cli, "launch", fake_launch)
    if value is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", value)
    assert main(["launch", str(path)]) == 0
    assert seen["color"] == expected
