"""Failure output a person reads, with real clusterctl and task processes:

- a task that only stopped because a peer failed prints one console line, its traceback goes to
  its log; the first failure line and the summary's root cause name the task that failed first
  on its own, also when its peers exit before it does;
- Ctrl-C (SIGINT to clusterctl) is reported as an interruption, not as a task's SIGTERM;
- a fixed address that is taken stops the launch (exit 2, nothing started) instead of "choosing
  new ports" and retrying the same port.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from tests.ctl._cli_run import env_with, interrupted_launch, run_cli

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

SCRIPTS = Path(__file__).resolve().parent / "scripts"
# generous: 2 loaded cores must not make a live task look silent
TIMEOUTS = "timeouts: {startup: 60, grace: 3, heartbeat: 5, run: 150}\n"


def _cluster_file(tmp_path: Path, script: str, args: list[str] | None = None) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"name: demo\nentrypoint: {SCRIPTS / script}\nargs: {args or []}\n"
                    f"cluster: {{chief: 1, worker: 2}}\nlog_dir: {tmp_path / 'runs'}\n"
                    + TIMEOUTS)
    return path


def _console(stdout: str, task: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(f"[{task}]")]


def _launcher_lines(stdout: str) -> list[str]:
    """clusterctl's own lines after the start lines."""
    lines = [line.removeprefix("[clusterctl]").strip() for line in stdout.splitlines()
             if line.startswith("[clusterctl]")]
    return [line for line in lines if not line.startswith(("run demo attempt", "started "))]


@pytest.mark.parametrize("linger", [False, True], ids=["culprit-exits-first",
                                                       "peers-exit-first"])
def test_secondary_tasks_print_one_line_and_the_culprit_is_named_first(
        tmp_path, marker, linger) -> None:
    path = _cluster_file(tmp_path, "fail_one.py", ["--linger"] if linger else [])
    proc = run_cli(["launch", str(path), "--color", "never"], cwd=tmp_path,
                   env=env_with(marker), timeout=200)
    out = proc.stdout
    assert proc.returncode == 1, out[-4000:] + proc.stderr[-2000:]
    assert "ValueError: the bug in worker 1" in "\n".join(_console(out, "worker:1"))
    for peer in ("chief:0", "worker:0"):
        shown = "\n".join(_console(out, peer))
        assert "Traceback" not in shown and "CollectiveAbortedError" not in shown, out[-4000:]
    stopped = [line for line in _launcher_lines(out) if " stopped: " in line]
    if linger:  # the peers saw the abort and exited on their own: secondary failures
        assert stopped, out[-4000:]
    # When the culprit exits first, clusterctl may SIGTERM a peer before it sees the abort
    # (a race the product does not decide): then that peer is "stopped by clusterctl" instead.
    for peer in ("chief:0", "worker:0"):
        assert (any(line.startswith(f"{peer} stopped: ") for line in stopped)
                or re.search(rf"^\[clusterctl\]\s+{peer}\s+exit 143 .*\(stopped by clusterctl\)$",
                             out, re.M)), out[-4000:]
    for line in stopped:
        assert re.fullmatch(r"(chief:0|worker:0) stopped: worker:1 failed \(traceback in "
                            r"(chief|worker)-0\.log\)", line), line
    assert len({line.split()[0] for line in stopped}) == len(stopped)  # one line per task
    first = _launcher_lines(out)[0]
    assert first.startswith("worker:1 "), out[-4000:]
    assert "ValueError: the bug in worker 1" in first
    root = re.search(r"^\[clusterctl\] root cause: (.*)$", out, re.M)
    # A lingering culprit outlasts the grace: killed, but named with the failure it recorded.
    said = ("worker:1 failed 1 (uncaught exception), then was killed 137 (SIGKILL) on its way "
            "out: " if linger else "worker:1 exited ")
    assert root and root.group(1).startswith(said), out[-3000:]
    assert root.group(1).endswith("ValueError: the bug in worker 1")
    assert re.search(r"^\[clusterctl\]\s+worker:1\s+exit \d+ .*\(root cause\)$", out, re.M), out
    run_dir = next((tmp_path / "runs").iterdir())
    for peer in ("chief-0", "worker-0"):  # the traceback a secondary kept off the console
        if (run_dir / f"{peer}.error.json").exists():
            assert "CollectiveAbortedError" in (run_dir / f"{peer}.log").read_text()


def test_ctrl_c_is_reported_as_an_interruption(tmp_path, marker) -> None:
    text = interrupted_launch(SCRIPTS / "idle.py", cwd=tmp_path, env=env_with(marker))
    assert "root cause: interrupted: clusterctl received SIGINT (Ctrl-C) and stopped every " \
           "task" in text, text[-3000:]
    assert "interrupted (SIGINT)" in text
    assert not re.search(r"root cause: (chief|worker):", text)
    assert "(root cause)" not in text


@pytest.fixture
def taken_port():
    """A port some other process (this test) listens on, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("how", ["listed", "port_base"])
def test_a_taken_fixed_address_stops_the_launch_without_retrying(tmp_path, taken_port,
                                                                   how) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    cluster = (f'cluster: {{worker: ["127.0.0.1:{taken_port}"]}}\n' if how == "listed"
               else f"cluster: {{worker: 1}}\nport_base: {taken_port}\n")
    (tmp_path / "cluster.yaml").write_text("entrypoint: train.py\n" + cluster)
    proc = run_cli(["launch", "cluster.yaml"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr
    assert f"the fixed address of worker:0 127.0.0.1:{taken_port} is taken" in proc.stderr
    assert "nothing started" in proc.stderr
    assert "choosing new ports" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_only_ports_clusterctl_chose_are_chosen_again(tmp_path) -> None:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "cluster.yaml"
    text = 'entrypoint: train.py\ncluster: {chief: ["127.0.0.1:2222"], worker: 2}\n'
    spec = parse_cluster_file(text, path)
    assert not launcher._port_chosen(spec, "chief:0")  # listed in the file
    assert launcher._port_chosen(spec, "worker:1")  # a count: clusterctl chose it
    spec = parse_cluster_file(text + "port_base: 4000\n", path)
    assert not launcher._port_chosen(spec, "worker:1")  # fixed by port_base
