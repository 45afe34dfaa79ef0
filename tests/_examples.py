"""The documented example runs, each started at most once per test session and shared by every
test that checks it (``tests/docs/test_examples_claims.py`` checks the figures the pages claim,
the tests of each example check the rest of the same run).

A run is named in :data:`RUNS` and started the way the docs say: ``clusterctl``'s launcher with
the example's shipped cluster file (plus the run's ``args``), or ``python examples/EX/train.py``
alone. Its outcome (exit code, output, time, run directory) is kept, failed or not, so a broken
example fails every test that reads it without being started again. Registered as a plugin by
``tests/conftest.py``.

Timeouts: the first test to ask for a run waits for the whole of it, so tests that read a run
declare ``@pytest.mark.timeout(timeout_for(NAME))`` (the run's own limit plus a margin).
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import load_cluster_file
from cluster.testing import processes_with
from tests._requires import require

__all__ = ["RUNS", "ExampleRuns", "Outcome", "Run", "example_runs", "timeout_for"]

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    """One documented way of running an example: ``clusterctl launch`` of its shipped cluster
    file (plus ``args``), or ``python examples/EXAMPLE/train.py`` alone.

    ``save_args`` are appended too, after ``{run_dir}`` in them is replaced by the run's
    directory: flags that only write files the tests read (final parameters); they change
    nothing the example computes or prints."""

    example: str
    launch: bool = True
    args: tuple[str, ...] = ()
    save_args: tuple[str, ...] = ()
    needs: str | None = None  # a module that must be importable (torch, jax)
    timeout: float = 240.0


RUNS = {
    "quickstart-launch": Run("quickstart", save_args=("--save", "{run_dir}/params.npz")),
    "torch-launch": Run("torch", needs="torch", timeout=300.0),
    "torch-alone": Run("torch", launch=False, needs="torch"),
    "jax-launch": Run("jax", needs="jax", timeout=300.0),
    "jax-alone": Run("jax", launch=False, needs="jax"),
    "ps-async-launch": Run("ps"),
    "ps-sync-launch": Run("ps", args=("--sync",)),
}


def timeout_for(name: str, extra: float = 0.0) -> float:
    """A pytest timeout for a test that reads run ``name`` (and may be the one that starts it),
    plus ``extra`` seconds of its own work."""
    return RUNS[name].timeout + 60.0 + extra


@dataclass(frozen=True)
class Outcome:
    """What one run did. ``exit_code`` is None when it did not finish (timed out, or the
    launcher raised: ``text`` then ends with why)."""

    name: str
    exit_code: int | None
    attempts: int  # launcher attempts (1 for a run alone)
    text: str  # everything it printed (the launcher's console with every task's lines)
    elapsed: float | None  # clusterctl's elapsed seconds (launch runs only)
    wall: float  # seconds from start to end, as this process measured them
    run_dir: Path | None  # the launcher's run directory (summary.json, logs, saved files)
    leaked: tuple[int, ...]  # processes of the run still alive after it (killed since)

    @property
    def ok(self) -> bool:
        """Finished in one attempt with exit code 0 and left no process behind."""
        return self.exit_code == 0 and self.attempts == 1 and not self.leaked


class ExampleRuns:
    """``runs(name)``: the :class:`Outcome` of run ``name``, started on the first request and
    cached for the session. Skips, with the install command, where the run needs torch or JAX
    and it is missing."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._marker = f"cluster-test-{uuid.uuid4().hex}"  # in every process of every run
        self._done: dict[str, Outcome] = {}

    def __call__(self, name: str) -> Outcome:
        run = RUNS[name]
        if run.needs:
            require(run.needs)
        if name not in self._done:
            self._done[name] = self._start(name, run)
        return self._done[name]

    def _start(self, name: str, run: Run) -> Outcome:
        example = REPO / "examples" / run.example
        run_dir = self._base / name
        args = run.args + tuple(a.format(run_dir=run_dir) for a in run.save_args)
        started = time.monotonic()
        exit_code: int | None = None
        attempts, elapsed, text = 1, None, ""
        try:
            if run.launch:
                spec = load_cluster_file(example / "cluster.yaml")
                spec = dataclasses.replace(
                    spec, args=spec.args + args,
                    env={**spec.env, "CLUSTER_TEST_MARKER": self._marker},
                    timeouts=dataclasses.replace(spec.timeouts, run=run.timeout - 30))
                out = io.StringIO()
                try:
                    result = launcher.launch(spec, out=out, color="never", run_dir=run_dir)
                finally:
                    text = out.getvalue()
                exit_code, attempts, elapsed = result.exit_code, result.attempts, result.elapsed
            else:
                env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
                proc = subprocess.run([sys.executable, str(example / "train.py"), *args],
                                      cwd=REPO, env={**env, "CLUSTER_TEST_MARKER": self._marker},
                                      capture_output=True, text=True, timeout=run.timeout)
                exit_code, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:  # subprocess.run killed and reaped it
            text = (_decode(e.stdout) + _decode(e.stderr)
                    + f"\n{name}: timed out after {e.timeout} s")
        except Exception:  # kept in the outcome: every test that reads the run fails with it
            text += f"\n{name}: could not run:\n{traceback.format_exc()}"
        leaked = tuple(self.kill_leftovers())
        return Outcome(name, exit_code, attempts, text, elapsed, time.monotonic() - started,
                       run_dir if run.launch else None, leaked)

    def kill_leftovers(self) -> list[int]:
        """Kill every process left with the test run's example marker; return their ids."""
        leaked = processes_with(self._marker)
        for pid in leaked:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return leaked


def _decode(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


@pytest.fixture(scope="session")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleRuns]:
    """The session's :class:`ExampleRuns`; at the end, any process of theirs still alive is
    killed (each outcome already says whether its run left one)."""
    runs = ExampleRuns(tmp_path_factory.mktemp("examples"))
    yield runs
    runs.kill_leftovers()
