"""Limits at scale: an absurd task count is refused before any port is chosen, ``limits.max_tasks``
raises the bound, the port picker holds 256 sockets at once within the descriptor limit, and
``launch`` starts tasks concurrently. The descriptor tests run in a child interpreter (they
change its RLIMIT_NOFILE, never the test runner's); the start tests run trivial processes in
place of tasks."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cluster.ctl import cli, launcher, ports
from cluster.ctl._task_process import TaskProcess, TaskStartError
from cluster.ctl.cli import main
from cluster.ctl.spec import MAX_TASKS, ClusterFile, JobSpec, Limits, parse_cluster_file
from cluster.errors import ClusterFileError

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(text) + f"log_dir: {tmp_path / 'runs'}\n")
    return path


def _no_ports(*args, **kwargs):
    raise AssertionError("a port was chosen for a file that should have been refused")


@pytest.mark.parametrize("command", ["validate", "launch", "render"])
def test_absurd_count_is_refused_before_any_port_is_chosen(tmp_path, capsys, monkeypatch,
                                                           command) -> None:
    monkeypatch.setattr(ports, "ensure_fd_limit", _no_ports)  # pick_free_ports' first step
    monkeypatch.setattr(cli, "launch", _no_ports)
    path = write(tmp_path, """\
        entrypoint: train.py
        cluster:
          chief: 1
          worker: 100000
        """)
    began = time.monotonic()
    assert main([command, str(path)]) == 2
    assert time.monotonic() - began < 10  # no sockets bound one by one (was ~20,000)
    err = capsys.readouterr().err
    assert f"{path}:4: cluster.worker: 100001 tasks (chief: 1, worker: 100000) exceed " \
           f"limits.max_tasks = {MAX_TASKS}" in err
    assert "hint: if this is no typo, add `limits: {max_tasks: 100001}`" in err
    assert "nothing started" in err
    assert not (tmp_path / "runs").exists()


def test_listed_addresses_count_towards_the_limit(tmp_path) -> None:
    path = write(tmp_path, """\
        entrypoint: train.py
        cluster:
          worker: ["127.0.0.1:2222", "127.0.0.1:2223"]
          ps: 2
        limits: {max_tasks: 3}
        """)
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(path.read_text(), path)
    [problem] = info.value.problems
    assert (problem.line, problem.key) == (3, "cluster.worker")
    assert "4 tasks (worker: 2, ps: 2) exceed limits.max_tasks = 3" in problem.message


def test_max_tasks_raises_the_bound(tmp_path) -> None:
    path = write(tmp_path, """\
        entrypoint: train.py
        cluster: {worker: 2000}
        limits:
          max_tasks: 2000
        """)
    spec = parse_cluster_file(path.read_text(), path)
    assert spec.limits == Limits(max_tasks=2000)
    assert spec.count("worker") == 2000


def test_the_default_allows_exactly_max_tasks(tmp_path) -> None:
    text = f"entrypoint: train.py\ncluster: {{chief: 1, worker: {MAX_TASKS - 1}}}\n"
    path = write(tmp_path, text)
    assert len(parse_cluster_file(path.read_text(), path).tasks()) == MAX_TASKS


@pytest.mark.parametrize(("limits", "line", "expected", "hint"), [
    ("limits: {max_tasks: 0}", 3, "limits.max_tasks: must be >= 1, got 0", ""),
    ("limits: {max_tasks: 1.5}", 3, "limits.max_tasks: expected an integer", ""),
    ("limits: {max_task: 10}", 3, "limits.max_task: unknown key 'max_task'",
     'did you mean "max_tasks"?'),
    ("limits: 10", 3, "limits: expected a mapping of limits", ""),
    ("port_base: 65000", 3, "port_base: 600 consecutive ports from 65000 go past 65535",
     "use port_base <= 64936"),
])
def test_bad_limits_and_port_ranges(tmp_path, capsys, limits, line, expected, hint) -> None:
    path = write(tmp_path, f"entrypoint: train.py\ncluster: {{worker: 600}}\n{limits}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: {expected}" in err
    assert not hint or f"hint: {hint}" in err


def test_cluster_file_built_directly_checks_the_limit(tmp_path) -> None:
    with pytest.raises(ValueError, match="5 tasks exceed limits.max_tasks = 4"):
        ClusterFile(path=tmp_path / "c.yaml", name="c", jobs=(JobSpec("worker", 5),),
                    module="train", limits=Limits(max_tasks=4))


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)


def test_256_distinct_ports_with_a_soft_limit_too_low_for_them() -> None:
    proc = _child("""\
        import resource, socket
        from cluster.ctl.ports import pick_free_ports
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
        chosen = pick_free_ports("127.0.0.1", 256)
        assert len(chosen) == 256 and len(set(chosen)) == 256, chosen
        held = []
        for port in chosen:  # every one was free: bind them all again
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            held.append(s)
        print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0], "hard", hard)
        """)
    assert proc.returncode == 0, proc.stderr
    soft, hard = proc.stdout.split()[1::2]
    assert int(soft) > 256 and soft == hard


def test_a_hard_limit_too_low_is_a_clear_error_before_binding() -> None:
    proc = _child("""\
        import resource
        from cluster.ctl.ports import pick_free_ports
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
        try:
            pick_free_ports("127.0.0.1", 256)
        except OSError as e:
            print("refused:", e)
        """)
    assert proc.returncode == 0, proc.stderr
    assert "refused: [Errno 24] choosing 256 ports needs about" in proc.stdout
    assert "the hard limit (RLIMIT_NOFILE) is 100: raise it" in proc.stdout


# -- concurrent start --------------------------------------------------------------------------


def _spec(tmp_path: Path, workers: int):
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "cluster.yaml"
    path.write_text(f"entrypoint: train.py\ncluster: {{worker: {workers}}}\n"
                    "timeouts: {grace: 5}\n")
    return parse_cluster_file(path.read_text(), path)


def test_launch_starts_tasks_concurrently(tmp_path, monkeypatch) -> None:
    """16 starts must be under way at once: each waits on a barrier of 16 before its process
    exists, which sequential starts could never pass (no timing involved)."""
    barrier = threading.Barrier(16, timeout=30)
    start = TaskProcess.start

    def waiting_start(self, argv, *, cwd, env, header):
        barrier.wait()
        start(self, [sys.executable, "-c", "pass"], cwd=cwd, env=env, header=header)

    monkeypatch.setattr(TaskProcess, "start", waiting_start)
    out = io.StringIO()
    result = launcher.launch(_spec(tmp_path, 16), out=out, color="never",
                             run_dir=tmp_path / "run")
    assert result.exit_code == 0, out.getvalue()
    assert "started 16 tasks in " in out.getvalue()


def test_a_task_that_cannot_start_stops_the_ones_started_beside_it(tmp_path, monkeypatch,
                                                                   marker) -> None:
    start = TaskProcess.start

    def one_fails(self, argv, *, cwd, env, header):
        if self.name == "worker:5":
            raise TaskStartError(self.name, FileNotFoundError(2, "no such file", "python"))
        start(self, [sys.executable, "-c", "import time; time.sleep(60)"], cwd=cwd,
              env={**env, "CLUSTER_TEST_MARKER": marker}, header=header)

    monkeypatch.setattr(TaskProcess, "start", one_fails)
    with pytest.raises(launcher.LaunchError, match="cannot start worker:5: "):
        launcher.launch(_spec(tmp_path, 12), out=io.StringIO(), color="never",
                        run_dir=tmp_path / "run")
    # the marker fixture fails the test if any of the 11 sleepers is left
