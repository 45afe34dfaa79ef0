"""One task's process and the launcher's error when a task cannot be executed."""

from __future__ import annotations

import io
import select
import sys
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl._task_process import TaskProcess, TaskStartError
from cluster.ctl.spec import parse_cluster_file

MISSING = "/nonexistent/python"


def test_a_process_that_cannot_be_executed_is_a_task_start_error(tmp_path: Path) -> None:
    task = TaskProcess("worker", 1, tmp_path)
    with pytest.raises(TaskStartError, match="cannot start worker:1: ") as info:
        task.start([MISSING], cwd=tmp_path, env={}, header="=== header ===")
    assert isinstance(info.value.__cause__, FileNotFoundError)
    task.close()
    assert (tmp_path / "worker-1.log").read_text() == "=== header ===\n"


def test_output_lines_go_to_the_log_and_the_last_line_is_the_cause(tmp_path: Path) -> None:
    task = TaskProcess("worker", 0, tmp_path)
    task.start([sys.executable, "-c", "print('a'); print('last', end='')"], cwd=tmp_path,
               env={}, header="=== h ===")
    lines: list[str] = []
    ended = False
    while not ended:
        assert select.select([task.out_fd], [], [], 10)[0], "no output within 10 s"
        chunk, ended = task.read()
        lines += chunk
    task.close_output()
    assert task.reap() == 0
    task.close()
    assert lines == ["a", "last"]
    assert task.cause() == "last"
    assert (tmp_path / "worker-0.log").read_text() == "=== h ===\na\nlast\n"


def test_a_native_log_line_written_last_is_logged_but_is_no_cause(tmp_path: Path) -> None:
    grpc_line = ("E0000 00:00:1732790000.123456   12345 ev_epoll1_linux.cc:123] "
                 "epoll_wait: Socket closed")
    task = TaskProcess("worker", 0, tmp_path)
    task.start([sys.executable, "-c", f"import sys; print('the bug', flush=True); "
                f"print({grpc_line!r}, file=sys.stderr); sys.exit(3)"],
               cwd=tmp_path, env={}, header="=== h ===")
    ended = False
    while not ended:
        assert select.select([task.out_fd], [], [], 10)[0], "no output within 10 s"
        ended = task.read()[1]
    task.close_output()
    assert task.reap() == 3
    task.close()
    assert task.cause() == "the bug"
    assert (tmp_path / "worker-0.log").read_text() == f"=== h ===\nthe bug\n{grpc_line}\n"


def test_launch_names_the_task_it_cannot_start(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "cluster.yaml"
    path.write_text("entrypoint: train.py\ncluster: {worker: 1}\n")
    monkeypatch.setattr(sys, "executable", MISSING)
    with pytest.raises(launcher.LaunchError, match="cannot start worker:0: ") as info:
        launcher.launch(parse_cluster_file(path.read_text(), path), out=io.StringIO(),
                        color="never", run_dir=tmp_path / "run")
    assert isinstance(info.value.__cause__, FileNotFoundError)
