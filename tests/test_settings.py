"""TaskSettings: every CLUSTER_* variable parsed once, with errors that name it; the
documentation's environment page (docs/guide/environment.md) lists every one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import settings as task_settings
from cluster.collectives.options import Algorithm, CollectivePath
from cluster.errors import TaskConfigError
from cluster.settings import ENV_VARS, TaskSettings

REPO = Path(__file__).resolve().parent.parent


def test_no_variables_give_the_defaults() -> None:
    assert TaskSettings.from_env({}) == TaskSettings()


def test_every_variable_is_read() -> None:
    s = TaskSettings.from_env({
        "CLUSTER_CONNECT_TIMEOUT": "2.5", "CLUSTER_HEARTBEAT_INTERVAL": "0.5",
        "CLUSTER_HEARTBEAT_TIMEOUT": "3", "CLUSTER_FUNCTION_TIMEOUT": "10",
        "CLUSTER_DATA_PLANE": "GRPC", "CLUSTER_COLLECTIVE_PATH": "network",
        "CLUSTER_COLLECTIVE_ALGORITHM": "ring", "CLUSTER_TOKEN": "s3cret",
        "CLUSTER_ALLOW_INSECURE": "1", "CLUSTER_LAUNCHER_PID": "42",
        "CLUSTER_ERROR_FILE": "/tmp/e.json", "CLUSTER_RESTART_COUNT": "3",
    })
    assert (s.connect_timeout, s.heartbeat_interval, s.heartbeat_timeout,
            s.function_timeout) == (2.5, 0.5, 3.0, 10.0)
    assert s.data_plane == "grpc"
    assert s.collectives.path is CollectivePath.NETWORK
    assert s.collectives.algorithm is Algorithm.RING
    assert (s.token, s.allow_insecure, s.launcher_pid, s.error_file, s.restart_count) == (
        "s3cret", True, 42, "/tmp/e.json", 3)


@pytest.mark.parametrize(("var", "value"), [
    ("CLUSTER_CONNECT_TIMEOUT", "soon"), ("CLUSTER_HEARTBEAT_TIMEOUT", "-1"),
    ("CLUSTER_HEARTBEAT_INTERVAL", "nan"), ("CLUSTER_FUNCTION_TIMEOUT", "0"),
    ("CLUSTER_DATA_PLANE", "udp"), ("CLUSTER_COLLECTIVE_PATH", "carrier-pigeon"),
    ("CLUSTER_COLLECTIVE_ALGORITHM", "butterfly"), ("CLUSTER_ALLOW_INSECURE", "yes"),
])
def test_a_bad_value_names_the_variable_and_the_value(var: str, value: str) -> None:
    with pytest.raises(TaskConfigError, match=rf"{var}.*{re.escape(value)}"):
        TaskSettings.from_env({var: value})


def test_devices_switch_reads_cpu_or_gpu_and_keeps_cuda_visible_devices() -> None:
    assert TaskSettings.from_env({}).devices == "cpu"
    s = TaskSettings.from_env({"CLUSTER_DEVICES": " GPU ", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert (s.devices, s.cuda_visible_devices) == ("gpu", "2,3")


def test_a_bad_devices_switch_names_the_variable_and_the_accepted_values() -> None:
    with pytest.raises(TaskConfigError, match=r"CLUSTER_DEVICES='tpu' is not one of: cpu, gpu"):
        TaskSettings.from_env({"CLUSTER_DEVICES": "tpu"})
    with pytest.raises(ValueError, match="devices must be one of cpu, gpu"):
        TaskSettings(devices="tpu")


def test_the_token_never_shows_in_repr() -> None:
    assert "s3cret" not in repr(TaskSettings.from_env({"CLUSTER_TOKEN": "s3cret"}))


def test_the_docs_list_every_variable_and_the_code_reads_no_other() -> None:
    page = (REPO / "docs" / "guide" / "environment.md").read_text()
    listed = {var for var, _, _ in ENV_VARS}
    for var in listed:
        assert f"| `{var}` |" in page, f"docs/guide/environment.md's table lacks {var}"
    used = set()
    for package in ("cluster", "worker", "ps"):
        for path in (REPO / package).rglob("*.py"):
            used |= set(re.findall(r'"(CLUSTER_[A-Z_]+)"', path.read_text()))
    assert used <= listed, f"variables missing from cluster.settings.ENV_VARS: {used - listed}"


@pytest.mark.parametrize("var", ["CLUSTER_HEARTBEAT_TIMEOUT", "CLUSTER_CONNECT_TIMEOUT",
                                 "CLUSTER_HEARTBEAT_INTERVAL", "CLUSTER_FUNCTION_TIMEOUT"])
@pytest.mark.parametrize("value", ["inf", "Infinity", "nan"])
def test_seconds_must_be_finite(var: str, value: str) -> None:
    # An infinite heartbeat timeout would switch failure detection off: refused, named.
    with pytest.raises(TaskConfigError, match=f"{var}: expected a finite number of seconds"):
        TaskSettings.from_env({var: value})
    with pytest.raises(ValueError, match="finite"):
        TaskSettings(**{var.removeprefix("CLUSTER_").lower(): float(value)})


# -- the process's settings: cluster.settings.current() / install() ----------------------------

@pytest.fixture
def fresh_settings():
    """Nothing installed during the test; what was installed before comes back after it."""
    previous = task_settings.install(None)
    yield
    task_settings.install(previous)


@pytest.mark.timeout(30)
def test_current_reads_the_environment_once_when_no_entry_point_installed(
        fresh_settings, monkeypatch) -> None:
    monkeypatch.setenv("CLUSTER_DATA_PLANE", "grpc")
    first = task_settings.current()
    assert first.data_plane == "grpc"
    monkeypatch.setenv("CLUSTER_DATA_PLANE", "tcp")  # read once: later changes are not seen
    assert task_settings.current() is first


@pytest.mark.timeout(30)
def test_installed_settings_win_over_the_environment(fresh_settings, monkeypatch) -> None:
    monkeypatch.setenv("CLUSTER_DATA_PLANE", "grpc")
    mine = TaskSettings(connect_timeout=5.0)
    assert task_settings.install(mine) is None
    assert task_settings.current() is mine
    assert task_settings.install(None) is mine
    assert task_settings.current().data_plane == "grpc"  # forgotten: the environment again


@pytest.mark.timeout(30)
def test_install_takes_only_task_settings(fresh_settings) -> None:
    with pytest.raises(TypeError, match="install takes a TaskSettings"):
        task_settings.install({"connect_timeout": 5.0})  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_a_bad_variable_raises_and_installs_nothing(fresh_settings, monkeypatch) -> None:
    monkeypatch.setenv("CLUSTER_DATA_PLANE", "carrier-pigeon")
    with pytest.raises(TaskConfigError, match="CLUSTER_DATA_PLANE"):
        task_settings.current()
    monkeypatch.setenv("CLUSTER_DATA_PLANE", "grpc")
    assert task_settings.current().data_plane == "grpc"


@pytest.mark.timeout(60)
def test_a_plain_script_gets_the_environments_settings() -> None:
    """``python train.py`` with no entry point: the library still sees ``CLUSTER_*``."""
    script = ("from cluster import settings\n"
              "s = settings.current()\n"
              "assert settings.current() is s\n"
              "print(s.data_plane, s.grace_period)\n")
    env = {**os.environ, "CLUSTER_DATA_PLANE": "grpc", "CLUSTER_GRACE_PERIOD": "4"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=50, check=True)
    assert out.stdout.split() == ["grpc", "4.0"]


@pytest.mark.timeout(60)
def test_the_entry_points_start_up_installs_the_settings_it_read(fresh_settings,
                                                                  monkeypatch) -> None:
    """``lifecycle.start_runtime`` (``python -m worker`` / ``ps``) installs what it read, even
    when the task then cannot start."""
    from cluster import lifecycle

    environ = {"CLUSTER_DATA_PLANE": "grpc", "TF_CONFIG": "{not json"}
    code = lifecycle.start_runtime("worker", environ)
    assert isinstance(code, int) and code != 0
    assert task_settings.current().data_plane == "grpc"


@pytest.mark.parametrize(("text", "bounds"), [("2:4", (2, 4)), (" 1:1 ", (1, 1))])
def test_cluster_elastic_reads_min_and_max(text, bounds) -> None:
    assert TaskSettings.from_env({"CLUSTER_ELASTIC": text}).elastic == bounds
    assert TaskSettings.from_env({}).elastic is None


@pytest.mark.parametrize("text", ["4", "0:2", "3:2", "a:b", "2:"])
def test_a_bad_cluster_elastic_names_the_variable_and_the_form(text) -> None:
    with pytest.raises(TaskConfigError, match=r"CLUSTER_ELASTIC=.*MIN:MAX with 1 <= MIN <= MAX"):
        TaskSettings.from_env({"CLUSTER_ELASTIC": text})
