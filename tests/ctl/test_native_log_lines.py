"""gRPC's C core logs straight to fd 2 (absl format): with real clusterctl and task processes,
none of those lines reaches the console while a task fails, but every one is in the task's log,
and the failure is still named from the task's own output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.ctl._cli_run import env_with, interrupted_launch, run_cli

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

SCRIPTS = Path(__file__).resolve().parent / "scripts"
# The C core's own log, switched on so that every task writes lines of it deterministically
# ("Log level INFO is not suitable for production", "gRPC Tracers: server_channel") besides
# whatever the failure makes it write.
GRPC_LOGGING = {"GRPC_VERBOSITY": "info", "GRPC_TRACE": "server_channel"}
# Written independently of cluster.ctl._output: absl's prefix with a C/C++ source file.
NATIVE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+\.(cc|h|c):\d+\]")


def _console_native(text: str) -> list[str]:
    return [line for line in text.splitlines() if NATIVE.search(line)]


def _logged_native(run_dir: Path) -> dict[str, list[str]]:
    return {p.name: [line for line in p.read_text().splitlines() if NATIVE.search(line)]
            for p in sorted(run_dir.glob("*.log"))}


def test_a_failing_run_keeps_grpc_core_lines_off_the_console_and_in_the_logs(tmp_path,
                                                                              marker) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"name: demo\nentrypoint: {SCRIPTS / 'fail_one.py'}\n"
                    f"cluster: {{chief: 1, worker: 2}}\nlog_dir: {tmp_path / 'runs'}\n"
                    "timeouts: {startup: 60, grace: 3, heartbeat: 5, run: 150}\n")
    proc = run_cli(["launch", str(path), "--color", "never"], cwd=tmp_path,
                   env=env_with(marker, **GRPC_LOGGING), timeout=200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert _console_native(out) == [], out[-4000:]
    assert "ValueError: the bug in worker 1" in out  # the task's own failure still shows
    root = re.search(r"^\[clusterctl\] root cause: (.*)$", proc.stdout, re.M)
    assert root and root.group(1).endswith("ValueError: the bug in worker 1"), out[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    logged = _logged_native(run_dir)
    assert sorted(logged) == ["chief-0.log", "worker-0.log", "worker-1.log"]
    for name, lines in logged.items():
        assert any(line.endswith("gRPC Tracers: server_channel") for line in lines), name


def test_ctrl_c_keeps_grpc_core_lines_off_the_console(tmp_path, marker) -> None:
    text = interrupted_launch(SCRIPTS / "idle.py", cwd=tmp_path,
                              env=env_with(marker, **GRPC_LOGGING))
    assert _console_native(text) == [], text[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    assert all(_logged_native(run_dir).values()), _logged_native(run_dir)
