"""clusterctl launch with real processes: success, fail fast, kill -9, restarts, Ctrl-C."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import (
    ConsoleWatch,
    TaskProcess,
    TaskProcesses,
    console_lines,
    processes_with,
    wait_gone,
)
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]

SCRIPTS = Path(__file__).resolve().parent / "scripts"

TOKEN = "test-token-Zq8fW3kP0vY7"  # made recognisable so the test can look for leaks of it


def cluster_file(tmp_path: Path, marker: str, args: list[str], *, jobs: str,
                 extra: str = "", grace: float = 5, timeouts: str = "") -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"name: test\n"
        f"entrypoint: {SCRIPTS / 'allreduce.py'}\n"
        f"args: {json.dumps(args)}\n"
        f"cluster: {jobs}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        f"timeouts: {{startup: 30, grace: {grace}{timeouts}}}\n" + extra)
    return path


def run(path: Path, monkeypatch) -> tuple[launcher.LaunchResult, str]:
    monkeypatch.setattr(launcher.secrets, "token_urlsafe", lambda n: TOKEN)
    out = io.StringIO()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out, color="never")
    return result, out.getvalue()



def test_successful_run(tmp_path, marker, monkeypatch) -> None:
    path = cluster_file(tmp_path, marker, ["--check-token"], jobs="{chief: 1, worker: 2, ps: 1}")
    result, out = run(path, monkeypatch)
    assert result.exit_code == 0, out
    assert result.attempts == 1
    for task in ("chief:0", "worker:0", "worker:1"):
        printed = console_lines(out, task)
        assert f"{task} all_reduce -> [3.0, 3.0, 3.0, 3.0]" in printed
        assert f"{task} done" in printed
        assert f"{task} token in env: True, in any command line: False" in printed
    codes = {t.task: (t.exit_code, t.stopped) for t in result.tasks}
    assert codes == {"chief:0": (0, False), "worker:0": (0, False), "worker:1": (0, False),
                     "ps:0": (0, True)}
    logs = sorted(p.name for p in result.run_dir.iterdir())
    assert logs == ["chief-0.log", "ps-0.log", "steps", "summary.json", "worker-0.log",
                    "worker-1.log"]  # steps/: the tasks' step records (cluster.timeline)
    assert "worker:1 done" in (result.run_dir / "worker-1.log").read_text()
    assert json.loads((result.run_dir / "summary.json").read_text())["exit_code"] == 0
    written = out + "".join(p.read_text() for p in result.run_dir.rglob("*") if p.is_file())
    assert TOKEN not in written


def test_the_files_timeouts_reach_every_task(tmp_path, marker, monkeypatch) -> None:
    path = cluster_file(tmp_path, marker, ["--print-timeouts"], jobs="{chief: 1, worker: 1}",
                        timeouts=", heartbeat: 4, stall: 45")
    result, out = run(path, monkeypatch)
    assert result.exit_code == 0, out
    for task in ("chief:0", "worker:0"):
        assert f"{task} timeouts: connect=30 heartbeat=4 stall=45" in console_lines(out, task)


def test_failing_worker_stops_everyone_and_names_the_root_cause(tmp_path, marker,
                                                                monkeypatch) -> None:
    # The chief hangs (not in a collective): only fail-fast can end the run quickly.
    path = cluster_file(tmp_path, marker, ["--fail", "worker:1", "--hang", "chief:0"],
                        jobs="{chief: 1, worker: 2}", extra="restart: {max_restarts: 2}\n")
    started = time.monotonic()
    result, out = run(path, monkeypatch)
    elapsed = time.monotonic() - started
    assert result.exit_code == launcher.EXIT_RUN_FAILED
    assert elapsed < 15
    # Exit 1 is permanent: no restart. (A port another process took between clusterctl's
    # choice and the task's bind is chosen again, which is no restart: see the port tests.)
    assert "restarting the cluster" not in out, out
    assert result.attempts == 1 or "choosing new ports and starting again" in out, out
    assert result.root_cause == ("worker:1 exited 1 (uncaught exception): "
                                 "ValueError: boom from worker:1")
    assert "root cause: worker:1 exited 1 (uncaught exception): ValueError: boom" in out
    codes = {t.task: t.exit_code for t in result.tasks}
    assert codes["worker:1"] == 1
    assert codes["chief:0"] in (143, 201)


def test_a_failed_task_killed_while_it_lingers_is_still_a_permanent_failure(
        tmp_path, marker, monkeypatch) -> None:
    # worker:1 records its own failure (exit 1, permanent), then hangs at exit until the grace
    # runs out and clusterctl kills it (137). The others exit 201, having followed it. Its
    # record is its verdict: the run is not restarted, and worker:1 is named with its error.
    path = cluster_file(tmp_path, marker, ["--fail", "worker:1", "--linger", "worker:1"],
                        jobs="{chief: 1, worker: 2}", extra="restart: {max_restarts: 2}\n",
                        grace=2)
    result, out = run(path, monkeypatch)
    assert result.exit_code == launcher.EXIT_RUN_FAILED, out
    assert result.attempts == 1, out
    assert "restarting the cluster" not in out
    codes = {t.task: (t.exit_code, t.stopped) for t in result.tasks}
    assert codes["worker:1"] == (137, True), out
    assert result.root_cause == ("worker:1 failed 1 (uncaught exception), then was killed "
                                 "137 (SIGKILL) on its way out: ValueError: boom from worker:1")


def test_kill_9_of_a_worker_fails_the_run_naming_it(tmp_path, marker, monkeypatch) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    path = cluster_file(tmp_path, marker, ["--hang", "all", "--pidfile-dir", str(pids)],
                        jobs="{chief: 1, worker: 2}")
    out = ConsoleWatch("worker:1 all_reduce ->")  # printed after the script wrote its pid file
    killed_at: list[float] = []

    def kill_victim() -> None:
        if out.event.wait(60):
            killed_at.append(time.monotonic())
            os.kill(int((pids / "worker-1.pid").read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_victim)
    killer.start()
    monkeypatch.setattr(launcher.secrets, "token_urlsafe", lambda n: TOKEN)
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out, color="never")
    out.event.set()
    killer.join(5)
    assert killed_at, out.getvalue()
    assert time.monotonic() - killed_at[0] < 15
    assert result.exit_code == launcher.EXIT_RUN_FAILED
    assert result.root_cause == "worker:1 exited 137 (SIGKILL): killed by SIGKILL"


def test_restart_succeeds_on_the_second_attempt(tmp_path, marker, monkeypatch) -> None:
    path = cluster_file(tmp_path, marker, ["--kill-self-first-attempt", "worker:1"],
                        jobs="{worker: 2}", extra="restart: {max_restarts: 1}\n")
    result, out = run(path, monkeypatch)
    assert result.exit_code == 0, out
    assert result.attempts == 2
    assert "worker:1 exited 137 (SIGKILL): killed by SIGKILL: restarting the cluster" in out
    log = (result.run_dir / "worker-1.log").read_text()
    assert "=== attempt 1: worker:1 ===" in log and "=== attempt 2: worker:1 ===" in log


def start_clusterctl(tasks: TaskProcesses, path: Path) -> TaskProcess:
    """``clusterctl launch PATH`` (without the marker: only its tasks carry it)."""
    return tasks.python("-m", "cluster.ctl.cli", "launch", str(path), "--color", "never",
                        cwd=REPO, name="clusterctl")


def test_ctrl_c_stops_every_task_and_exits_130(tmp_path, marker, task_processes) -> None:
    path = cluster_file(tmp_path, marker, ["--hang", "all"], jobs="{chief: 1, worker: 1, ps: 1}")
    proc = start_clusterctl(task_processes, path)
    proc.read_until("all_reduce ->", timeout=30, count=2)
    assert len(processes_with(marker)) == 3
    proc.kill(signal.SIGINT)
    code, out = proc.finish(timeout=20)
    assert code == 130, out
    assert "stopping chief:0, worker:0, ps:0 (clusterctl received SIGINT)" in out
    assert "run test interrupted (SIGINT)" in out


def test_tasks_stop_by_themselves_when_clusterctl_is_killed(tmp_path, marker,
                                                            task_processes) -> None:
    path = cluster_file(tmp_path, marker, ["--hang", "all"], jobs="{worker: 2, ps: 1}")
    proc = start_clusterctl(task_processes, path)
    proc.read_until("all_reduce ->", timeout=30, count=2)
    tasks = processes_with(marker)
    assert len(tasks) == 3
    proc.kill()  # clusterctl alone, not its process group
    proc.finish(timeout=10)
    assert wait_gone(tasks, 15) == []


def test_a_port_taken_before_its_task_binds_is_chosen_again(tmp_path, marker,
                                                            monkeypatch) -> None:
    path = cluster_file(tmp_path, marker, [], jobs="{worker: 2}")
    real = launcher.assign_addresses
    calls = []
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        taken = f"127.0.0.1:{squatter.getsockname()[1]}"

        def assign(spec):
            calls.append(1)
            addresses = real(spec)
            if len(calls) == 1:  # the first choice loses a race for worker:1's port
                addresses["worker"][1] = taken
            return addresses

        monkeypatch.setattr(launcher, "assign_addresses", assign)
        result, out = run(path, monkeypatch)
    assert result.exit_code == 0, out
    assert result.attempts == 2 and len(calls) == 2
    assert f"worker:1 exited 203 (address in use): AddressInUseError: worker:1: cannot serve on " \
           f"{taken}" in out
    assert "choosing new ports and starting again" in out
