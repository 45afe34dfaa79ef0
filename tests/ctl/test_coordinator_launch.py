"""clusterctl launch in ``mode: coordinator`` with real processes: only the chief runs the
entrypoint, workers serve, a killed worker is restarted alone, a killed ps is the root cause."""

from __future__ import annotations

import io
import os
import textwrap
import threading
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import ConsoleWatch, console_lines, kill_and_wait, task_pid

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

# The chief's entrypoint. With --fifo it waits (on the FIFO, against a deadline) until the test
# has killed VICTIM, then checks that VICTIM serves again (--expect up) or stays down.
CHIEF = textwrap.dedent('''\
    import argparse, json, os, select, sys
    import cluster.runtime
    from cluster.errors import PeersNotReadyError
    from cluster.deadline import Deadline

    parser = argparse.ArgumentParser()
    parser.add_argument("--fifo")
    parser.add_argument("--victim")
    parser.add_argument("--expect", choices=("up", "down"))
    args = parser.parse_args()
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    print(f"ENTRYPOINT ran as {task['type']}:{task['index']}", flush=True)
    if task["type"] != "chief":
        sys.exit(5)
    rt = cluster.runtime.current()
    rt.wait_for_peers(Deadline.after(10))
    peers = dict(rt.peers())
    if args.fifo:
        fifo = os.open(args.fifo, os.O_RDONLY | os.O_NONBLOCK)
    print("chief: every peer serves: " + ", ".join(sorted(peers)), flush=True)
    if not args.fifo:
        sys.exit(0)
    if not select.select([fifo], [], [], 12)[0]:
        sys.exit(3)
    victim = [(args.victim, peers[args.victim])]
    if args.expect == "up":
        rt.wait_for_peers(Deadline.after(10), tasks=victim)
        print(f"chief: {args.victim} serves again", flush=True)
        sys.exit(0)
    try:
        rt.wait_for_peers(Deadline.after(2), tasks=victim)
    except PeersNotReadyError:
        print(f"chief: {args.victim} stays down", flush=True)
        sys.exit(7 if args.victim.startswith("ps") else 0)
    sys.exit(4)
    ''')


def cluster_file(tmp_path: Path, marker: str, args: list[str], *, jobs: str,
                 extra: str = "") -> Path:
    (tmp_path / "chief.py").write_text(CHIEF)
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "name: ps-test\n"
        "mode: coordinator\n"
        "entrypoint: chief.py\n"
        f"args: {args!r}\n"
        f"cluster: {jobs}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        "timeouts: {startup: 30, grace: 3, run: 90}\n" + extra)
    return path




def launch_and_kill(tmp_path: Path, marker: str, victim: str, expect: str, *, jobs: str,
                    extra: str = "") -> tuple[launcher.LaunchResult, str]:
    """Launch; once the chief saw every peer serving, SIGKILL ``victim``, wait until it is gone,
    and tell the chief through the FIFO. Returns the result, the console output."""
    fifo = tmp_path / "killed"
    os.mkfifo(fifo)
    path = cluster_file(tmp_path, marker, ["--fifo", str(fifo), "--victim", victim,
                                           "--expect", expect], jobs=jobs, extra=extra)
    out = ConsoleWatch("chief: every peer serves")
    errors: list[BaseException] = []

    def kill_victim() -> None:
        try:
            if not out.event.wait(60):
                return
            job, index = victim.split(":")
            pid = task_pid(marker, job, int(index))
            assert kill_and_wait(pid, 5), f"{victim} did not die"
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"killed\n")
            os.close(fd)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    killer = threading.Thread(target=kill_victim)
    killer.start()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out, color="never")
    out.event.set()
    killer.join(10)
    assert not errors, errors
    return result, out.getvalue()


def test_only_the_chief_runs_the_entrypoint_and_its_exit_ends_the_run(tmp_path, marker) -> None:
    path = cluster_file(tmp_path, marker, [], jobs="{chief: 1, worker: 2, ps: 1}")
    out = io.StringIO()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out, color="never")
    text = out.getvalue()
    assert result.exit_code == 0, text
    assert "ENTRYPOINT ran as chief:0" in console_lines(text, "chief:0")
    assert "chief: every peer serves: ps:0, worker:0, worker:1" in console_lines(text, "chief:0")
    for task in ("worker:0", "worker:1", "ps:0"):
        log = (result.run_dir / f"{task.replace(':', '-')}.log").read_text()
        assert "ENTRYPOINT" not in log and not any("ENTRYPOINT" in line
                                                   for line in console_lines(text, task))
    assert "shutting down" in (result.run_dir / "worker-0.log").read_text()
    # Stopping the servers is how the run ends, not a failure.
    assert "stopping worker:0, worker:1, ps:0 (the chief exited 0: the run succeeded)" in text
    codes = {t.task: (t.exit_code, t.stopped) for t in result.tasks}
    assert codes == {"chief:0": (0, False), "worker:0": (0, True), "worker:1": (0, True),
                     "ps:0": (0, True)}
    assert result.root_cause == ""
    assert "run ps-test succeeded" in text


def test_a_killed_worker_is_restarted_alone_and_the_run_succeeds(tmp_path, marker) -> None:
    result, out = launch_and_kill(tmp_path, marker, "worker:1", "up",
                                           jobs="{chief: 1, worker: 2}")
    assert result.exit_code == 0, out
    assert result.attempts == 1  # the cluster itself did not restart
    assert ("worker:1 exited 137 (SIGKILL): killed by SIGKILL; restarting it in 1 s "
            "(restart 1 of 3)") in out
    assert "starting worker:1 again (restart 1 of 3)" in out
    assert "chief: worker:1 serves again" in console_lines(out, "chief:0")
    by_task = {t.task: t for t in result.tasks}
    assert (by_task["worker:1"].exit_code, by_task["worker:1"].stopped) == (0, True)
    assert by_task["worker:1"].restarts == 1 and by_task["worker:0"].restarts == 0
    assert "worker:1  exit 0 (succeeded) (stopped by clusterctl) (restarted 1 time)" in out
    log = (result.run_dir / "worker-1.log").read_text()
    assert "=== attempt 1: worker:1 ===" in log
    assert "=== attempt 1: worker:1 (restart 1 of 3) ===" in log


def test_a_worker_whose_restarts_are_used_up_stays_down_and_the_run_goes_on(tmp_path,
                                                                            marker) -> None:
    result, out = launch_and_kill(tmp_path, marker, "worker:0", "down",
                                           jobs="{chief: 1, worker: 2}",
                                           extra="restart: {max_worker_restarts: 0}\n")
    assert result.exit_code == 0, out
    assert ("worker:0 exited 137 (SIGKILL): killed by SIGKILL; not restarting it: "
            "restart.max_worker_restarts = 0 used up; the run goes on without it "
            "(workers left: worker:1)") in out
    assert "chief: worker:0 stays down" in console_lines(out, "chief:0")
    by_task = {t.task: t for t in result.tasks}
    assert (by_task["worker:0"].exit_code, by_task["worker:0"].stopped) == (137, False)
    assert result.root_cause == ""


def test_a_killed_ps_is_not_restarted_and_is_the_root_cause_of_the_chiefs_failure(
        tmp_path, marker) -> None:
    result, out = launch_and_kill(tmp_path, marker, "ps:0", "down",
                                           jobs="{chief: 1, worker: 1, ps: 1}",
                                           extra="restart: {max_restarts: 0}\n")
    assert result.exit_code == 7, out  # the chief's own exit code
    assert "ps:0 exited 137 (SIGKILL): killed by SIGKILL; parameter servers are not " \
           "restarted" in out
    assert "restarting it" not in out
    assert "chief: ps:0 stays down" in console_lines(out, "chief:0")
    assert result.root_cause == "ps:0 exited 137 (SIGKILL): killed by SIGKILL"
    by_task = {t.task: t for t in result.tasks}
    assert by_task["chief:0"].exit_code == 7
    assert (by_task["worker:0"].exit_code, by_task["worker:0"].stopped) == (0, True)
