"""Live output: a progress bar's ``\\r`` redraws reach the console while the task
still runs, on a terminal (a pty) and in a pipe; ``--tasks`` filters the console but never the
logs; ``--timestamps``; colours kept. Real clusterctl and task processes for the live cases (the
task waits on a FIFO until the test has seen its partial line, so no timing is assumed), a fake
clock for the pipe's quiet-time rule."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

from cluster.ctl._output import PIPE_EVERY, PIPE_QUIET, Console, LineSplitter
from tests.ctl._cli_run import Reader, env_with, run_cli, started

pytestmark = pytest.mark.timeout(180)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
WAIT = 90.0  # seconds for a task on 2 loaded cores to start and draw


def _release(fifo: Path) -> None:
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the task has it open for reading
    os.write(fd, b"go\n")
    os.close(fd)


@pytest.mark.multiprocess
@pytest.mark.parametrize("terminal", [True, False], ids=["pty", "pipe"])
def test_a_progress_bar_shows_before_the_task_ends(tmp_path, marker, terminal) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    read_fd, write_fd = os.openpty() if terminal else os.pipe()
    args = ["launch", "-n", "1", str(SCRIPTS / "progress.py"), "--", str(fifo)]
    with started(args, cwd=tmp_path, env=env_with(marker), stdout=write_fd) as proc:
        os.close(write_fd)
        out = Reader(read_fd)
        try:
            seen = out.until(b"step 2/3 |##", WAIT)
            assert seen, out.data.decode(errors="replace")[-2000:]
            assert proc.poll() is None  # the task still waits for the FIFO: it has not ended
            assert b"released" not in out.data
            _release(fifo)
            out.rest(WAIT)
        finally:
            os.close(read_fd)
        assert proc.wait(timeout=WAIT) == 0, out.data.decode(errors="replace")[-2000:]
    text = out.data.decode()
    assert "released" in text and "step 3/3 |###|" in text
    if terminal:
        # drawn in place: carriage return + erase, the coloured prefix, the bar, no newline
        assert re.search(r"\r\x1b\[K\x1b\[36m\[chief:0\]\s*\x1b\[0m step 2/3 \|##", text), text
    else:
        assert re.search(r"^\[chief:0\]\s+step 2/3 \|## \|$", text, re.M), text
        assert "\x1b[" not in text  # no colour in a pipe
    log = next((tmp_path / "runs").iterdir()) / "chief-0.log"
    assert "step 3/3 |###|" in log.read_text()


@pytest.mark.multiprocess
def test_tasks_filters_the_console_and_timestamps_start_each_line(tmp_path, marker) -> None:
    (tmp_path / "train.py").write_text("import os\nprint('hello from', os.getpid())\n")
    proc = run_cli(["launch", "-n", "3", "train.py", "--tasks", "chief:0,worker:1",
                    "--timestamps", "--run-dir", "run"], cwd=tmp_path, env=env_with(marker))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    shown = re.findall(r"\[(\S+)\]\s+hello from", proc.stdout)
    assert sorted(shown) == ["chief:0", "worker:1"], proc.stdout
    for line in proc.stdout.splitlines():
        assert re.match(r"\d\d:\d\d:\d\d\.\d{3} \[", line), line
    for task in ("chief-0", "worker-0", "worker-1"):  # every task in the logs, stamped
        log = (tmp_path / "run" / f"{task}.log").read_text()
        assert re.search(r"^\d\d:\d\d:\d\d\.\d{3} hello from", log, re.M), log


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pipe_gets_a_partial_line_after_it_stays_quiet_or_every_few_seconds() -> None:
    clock, out = _Clock(), io.StringIO()
    console = Console(out, tasks=["chief:0", "worker:0"], live=False, clock=clock)
    console.task_partial("worker:0", "Loading...")
    assert console.due() == pytest.approx(PIPE_QUIET)
    console.tick()
    assert out.getvalue() == ""
    clock.now += PIPE_QUIET
    console.tick()
    assert out.getvalue() == "[worker:0] Loading...\n"
    assert console.due() is None
    console.task_line("worker:0", "Loading...")  # the same text ended: not written twice
    assert out.getvalue() == "[worker:0] Loading...\n"
    for i in range(int(PIPE_EVERY / 0.1) + 1):  # a bar that redraws every 0.1 s
        console.task_partial("chief:0", f"{i}%")
        clock.now += 0.1
        console.tick()
    assert out.getvalue().count("[chief:0]") == 1  # once in PIPE_EVERY, not per redraw
    console.task_line("chief:0", "100%")
    assert out.getvalue().endswith("[chief:0]  100%\n")


def test_a_terminal_draws_the_live_tasks_partial_line_below_the_others() -> None:
    out = io.StringIO()
    console = Console(out, tasks=["chief:0", "worker:0"], live=True)
    console.task_partial("chief:0", "10%")
    console.task_partial("worker:0", "50%")  # not the live task: shown when its line ends
    console.task_line("worker:0", "epoch 1")
    console.task_partial("chief:0", "20%")
    console.task_line("chief:0", "done")
    assert out.getvalue() == (
        "\r\x1b[K[chief:0]  10%"
        "\r\x1b[K[worker:0] epoch 1\n[chief:0]  10%"
        "\r\x1b[K[chief:0]  20%"
        "\r\x1b[K[chief:0]  done\n")
    narrow = Console(io.StringIO(), tasks=["worker:0"], live=True, show=["worker:0"])
    assert narrow.live_task == "worker:0"  # no chief shown: the first task shown


def test_partial_lines_keep_only_what_a_terminal_shows() -> None:
    s = LineSplitter()
    assert s.feed(b"\r 10%|#") == [] and s.partial() == " 10%|#"
    for i in range(20000):  # an hour of redraws does not grow the buffer
        s.feed(f"\r{i % 100:3d}%|{'#' * (i % 10)}".encode())
    assert len(s._partial) < 100
    assert s.feed(b"\r100%|##########|\n") == ["100%|##########|"] and s.partial() == ""
