"""clusterctl launch of an elastic run with real processes: a chief or worker that dies is
restarted alone while the others keep running (their pids do not change), and the run fails,
naming who is gone, when fewer than ``min`` are left. The tasks are plain scripts
(tests/ctl/scripts/elastic_task.py): the supervisor is what is tested, not the runtime's
regrouping."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import kill_and_wait, processes_with
from tests.ctl._cli_run import env_with, run_cli

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

SCRIPT = Path(__file__).resolve().parent / "scripts" / "elastic_task.py"


def elastic_run(tmp_path: Path, marker: str, *, jobs: str, elastic: str, victims: str,
                extra_args: tuple[str, ...] = (), extra: str = "",
                ) -> tuple[launcher.LaunchResult, str, Path]:
    """Launch ``elastic_task.py`` as ``jobs`` with ``elastic: {elastic}``; returns the result,
    the console and the scripts' output directory."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "name: elastic-test\n"
        f"entrypoint: {SCRIPT}\n"
        f"args: {json.dumps([str(out_dir), '--victims', victims, *extra_args])}\n"
        f"cluster: {jobs}\n"
        f"elastic: {elastic}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        "timeouts: {startup: 30, grace: 3, run: 60}\n" + extra)
    console = io.StringIO()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=console,
                             color="never")
    return result, console.getvalue(), out_dir


def starts(out_dir: Path, task: str) -> list[tuple[int, str]]:
    """``(pid, CLUSTER_ELASTIC)`` of each start of ``task``, in order."""
    path = out_dir / f"pids-{task.replace(':', '-')}"
    if not path.exists():
        return []
    return [(int(pid), bounds) for pid, bounds in
            (line.split(" ") for line in path.read_text().splitlines())]


def membership(run_dir: Path) -> list[tuple[str, str, int]]:
    """``(task, event, running)`` of each line of the run's membership record."""
    lines = (run_dir / "membership.jsonl").read_text().splitlines()
    return [(e["task"], e["event"], e["running"]) for e in map(json.loads, lines)]


def test_a_killed_worker_is_restarted_alone_and_the_survivors_keep_their_processes(
        tmp_path, marker) -> None:
    result, out, out_dir = elastic_run(tmp_path, marker, jobs="{chief: 1, worker: 3}",
                                       elastic="{min: 2, max: 4}", victims="worker:1",
                                       extra="timeline: true\n")
    assert result.exit_code == 0, out
    assert result.attempts == 1  # the cluster itself never restarted
    for task in ("chief:0", "worker:0", "worker:2"):  # one process each, all run long
        assert len(starts(out_dir, task)) == 1, (task, out)
    first, again = starts(out_dir, "worker:1")
    assert first[0] != again[0]
    assert {bounds for task in ("chief:0", "worker:0", "worker:1", "worker:2")
            for _, bounds in starts(out_dir, task)} == {"2:4"}  # CLUSTER_ELASTIC, each start
    assert ("worker:1 exited (killed by SIGKILL); restarting it alone in 1 s (restart 1 of 3; "
            "elastic 2:4, 3 running)") in out
    assert out.count("restarting it alone") == 1
    assert "stopping" not in out  # nobody was torn down
    by_task = {t.task: t for t in result.tasks}
    assert by_task["worker:1"].restarts == 1 and by_task["worker:1"].exit_code == 0
    assert all(by_task[t].restarts == 0 and by_task[t].exit_code == 0
               for t in ("chief:0", "worker:0", "worker:2"))
    assert membership(result.run_dir) == [("worker:1", "restarting", 3),
                                          ("worker:1", "started", 4)]
    # The timeline shows both on clusterctl's own track.
    trace = json.loads((result.run_dir / "timeline.json").read_text())["traceEvents"]
    (track,) = [e["pid"] for e in trace if e["name"] == "process_name"
                and e["args"]["name"] == "clusterctl"]
    assert [e["name"] for e in trace if e["pid"] == track and e["ph"] == "i"] == [
        "worker:1 restarting", "worker:1 started"]


def test_a_killed_chief_is_restarted_alone_while_the_coordination_service_lives_on(
        tmp_path, marker) -> None:
    # Under mutual TLS: the service serves with a certificate of this host, as the tasks do.
    result, out, out_dir = elastic_run(tmp_path, marker, jobs="{chief: 1, worker: 2}",
                                       elastic="{min: 2, max: 3}", victims="chief:0",
                                       extra="tls: auto\n")
    assert result.exit_code == 0, out
    assert len(starts(out_dir, "chief:0")) == 2
    assert len(starts(out_dir, "worker:0")) == len(starts(out_dir, "worker:1")) == 1
    assert "chief:0 exited (killed by SIGKILL); restarting it alone" in out
    log = (result.run_dir / "coordination-service.log").read_text()
    assert "serving the coordination service of 3 task(s)" in log


def test_a_run_whose_coordination_service_dies_fails_naming_it(tmp_path, marker) -> None:
    out_dir = tmp_path / "out"

    def kill_the_service() -> None:  # once every task has started
        deadline = time.monotonic() + 60
        while len(list(out_dir.glob("pids-*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        tasks = set(processes_with(marker, '"task":'))
        (service,) = set(processes_with(marker, "CLUSTER_COORDINATION_SERVICE=")) - tasks
        assert kill_and_wait(service, 5)

    killer = threading.Thread(target=kill_the_service)
    killer.start()
    try:
        result, out, _ = elastic_run(tmp_path, marker, jobs="{chief: 1, worker: 2}",
                                     elastic="{min: 2, max: 3}", victims="nobody")
    finally:
        killer.join(60)
    assert result.exit_code == launcher.EXIT_RUN_FAILED, out
    note = ("the coordination service exited 137 (SIGKILL) (killed by SIGKILL; "
            "coordination-service.log)")
    assert f"{note}: the tasks cannot coordinate without it" in out
    assert result.root_cause == note
    assert all(t.stopped for t in result.tasks)


def test_kills_that_leave_fewer_than_min_fail_the_run_naming_who_is_gone(tmp_path,
                                                                         marker) -> None:
    # worker:1 and worker:2 die together: after the first 3 run (= min), after the second 2.
    result, out, out_dir = elastic_run(tmp_path, marker, jobs="{chief: 1, worker: 3}",
                                       elastic="{min: 3, max: 4}",
                                       victims="worker:1,worker:2")
    assert result.exit_code == launcher.EXIT_RUN_FAILED, out
    first, second = sorted(("worker:1", "worker:2"),
                           key=lambda t: out.index(f"{t} exited (killed by SIGKILL)"))
    assert f"{first} exited (killed by SIGKILL); restarting it alone" in out
    gone = ", ".join(f"{t} (exit 137 (SIGKILL))" for t in ("worker:1", "worker:2"))
    note = f"elastic 3:4: 2 chief/worker tasks running, below min 3; gone: {gone}"
    assert f"{second} exited (killed by SIGKILL); {note}: the run fails" in out
    assert result.root_cause == f"{second} exited 137 (SIGKILL): killed by SIGKILL; {note}"
    by_task = {t.task: t for t in result.tasks}
    assert by_task["chief:0"].stopped and by_task["worker:0"].stopped  # everything stopped
    assert by_task[first].restarts == 0  # its restart was due, never made
    assert len(starts(out_dir, first)) == 1
    assert membership(result.run_dir) == [(first, "restarting", 3), (second, "below-min", 2)]


def test_a_task_whose_restarts_are_used_up_is_left_down_while_min_run(tmp_path,
                                                                      marker) -> None:
    # worker:1 dies on every start; once its one restart is used up the run goes on without
    # it (the others wait for that, then exit 0) and succeeds.
    result, out, out_dir = elastic_run(
        tmp_path, marker, jobs="{chief: 1, worker: 2}", elastic="{min: 2, max: 3}",
        victims="worker:1", extra_args=("--always",),
        extra="restart: {max_worker_restarts: 1}\n")
    assert len(starts(out_dir, "worker:1")) == 2
    assert ("worker:1 exited (killed by SIGKILL); not restarting it: "
            "restart.max_worker_restarts = 1 used up; the run goes on without it "
            "(elastic 2:3, 2 running)") in out
    assert [e for _, e, _ in membership(result.run_dir)] == ["restarting", "started",
                                                             "given-up"]
    assert result.exit_code == 0, out
    assert result.root_cause == ""
    by_task = {t.task: t for t in result.tasks}
    assert (by_task["worker:1"].exit_code, by_task["worker:1"].restarts) == (137, 1)
    assert len(starts(out_dir, "chief:0")) == len(starts(out_dir, "worker:0")) == 1


def test_cli_elastic_one_line_launch_and_status(tmp_path, marker) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    run = run_cli(["launch", "-n", "3", "--elastic", "2:3", str(SCRIPT), "--run-dir",
                   str(tmp_path / "run"), "--", str(out_dir), "--victims", "worker:0"],
                  cwd=tmp_path, env=env_with(marker), timeout=90)
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(starts(out_dir, "worker:0")) == 2
    assert len(starts(out_dir, "chief:0")) == len(starts(out_dir, "worker:1")) == 1
    status = run_cli(["status", str(tmp_path / "run")], cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "membership (elastic 2:3):" in status.stdout
    assert "worker:0 restarting: exit 137 (SIGKILL), killed by SIGKILL; 2 running" \
        in status.stdout
