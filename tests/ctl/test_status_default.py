"""``clusterctl status`` without RUN_DIR: the newest run under ``./runs`` (like ``git status``
shows the repository it runs in), else the newest run launched on this machine."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from cluster.ctl import cli, status
from cluster.ctl._telemetry import latest_run_pointer

pytestmark = pytest.mark.timeout(30)


def _run(parent: Path, name: str, mtime: float) -> Path:
    """A finished run directory as clusterctl leaves it (summary and one task log)."""
    path = parent / name
    path.mkdir(parents=True)
    (path / "chief-0.log").write_text("done\n")
    (path / "summary.json").write_text(json.dumps({
        "name": name, "exit_code": 0, "elapsed": 1.0, "interrupted": None,
        "tasks": [{"task": "chief:0", "exit_code": 0, "stopped": False}]}))
    os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def pointer(tmp_path, monkeypatch) -> Path:
    """The machine's newest-run pointer, in a state directory of this test's own."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = latest_run_pointer()
    path.parent.mkdir(parents=True)
    return path


def _shown(cwd: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = status.main(None, out, err, cwd=cwd)
    return code, out.getvalue(), err.getvalue()


def test_the_newest_run_under_dot_runs_wins_over_a_newer_one_elsewhere(tmp_path, pointer):
    here = tmp_path / "project"
    _run(here / "runs", "old-here", 1_000)
    newest_here = _run(here / "runs", "new-here", 2_000)
    elsewhere = _run(tmp_path / "other" / "runs", "elsewhere", 3_000)
    pointer.write_text(f"{elsewhere}\n")
    assert status.default_run_dir(here, pointer) == newest_here
    code, out, _ = _shown(here)
    assert code == 0
    assert out.startswith("run new-here: succeeded") and str(newest_here) in out, out


def test_the_pointer_picks_among_the_runs_here_when_it_names_one(tmp_path, pointer):
    here = tmp_path / "project"
    launched_last = _run(here / "runs", "launched-last", 1_000)  # a summary rewritten later
    _run(here / "runs", "touched-last", 2_000)
    pointer.write_text(f"{launched_last}\n")
    assert status.default_run_dir(here, pointer) == launched_last


@pytest.mark.parametrize("runs_here", ["missing", "empty", "no-run-inside"])
def test_without_a_run_here_the_newest_run_launched_is_shown(tmp_path, pointer, runs_here):
    here = tmp_path / "project"
    here.mkdir()
    if runs_here != "missing":
        (here / "runs").mkdir()
    if runs_here == "no-run-inside":
        (here / "runs" / "notes").mkdir()
    elsewhere = _run(tmp_path / "other" / "runs", "elsewhere", 3_000)
    pointer.write_text(f"{elsewhere}\n")
    assert status.default_run_dir(here, pointer) == elsewhere
    code, out, _ = _shown(here)
    assert code == 0 and out.startswith("run elsewhere: succeeded"), out


def test_no_run_anywhere_exits_2_saying_what_to_pass(tmp_path, pointer):
    here = tmp_path / "project"
    here.mkdir()
    assert status.default_run_dir(here, pointer) is None
    code, out, err = _shown(here)
    assert (code, out) == (2, "")
    assert "no run to show" in err and "./runs holds none" in err and "pass RUN_DIR" in err


def test_the_command_line_looks_in_the_current_directory(tmp_path, pointer, monkeypatch,
                                                        capsys):
    here = tmp_path / "project"
    local = _run(here / "runs", "here", 1_000)
    pointer.write_text(f"{_run(tmp_path / 'other' / 'runs', 'elsewhere', 3_000)}\n")
    monkeypatch.chdir(here)
    assert cli.main(["status"]) == 0
    assert str(local) in capsys.readouterr().out
