"""Resume equality through ``clusterctl launch`` with real processes:
a task SIGKILLed mid-run, clusterctl restarts, the run resumes from the newest checkpoint and
ends with parameters bit for bit those of an uninterrupted run, at most one save interval redone.

- MultiWorkerMirroredStrategy (2 workers): worker 1 kills itself at step 25, the whole cluster
  restarts and resumes from ckpt-20 (model, optimizer, iterator position, step counter).
- ParameterServerStrategy(synchronous=True) (``mode: coordinator``, chief + 2 workers + 2 ps):
  a ps killed at step 25 restarts the whole cluster, which resumes from ckpt-20; a worker killed
  at step 25 is restarted alone and the run goes on without a restore.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.fspath(Path(__file__).parent))
import _launching  # noqa: E402
import _resume_ps_train  # noqa: E402 - the chief's script, imported for the reference
import _resume_train  # noqa: E402 - the script clusterctl runs, imported for the reference

from cluster.testing import console_lines

pytestmark = [pytest.mark.multiprocess]

HERE = Path(__file__).parent
STEPS, SAVE_EVERY, KILL_AT = 60, 10, 25
# Saved at 20, killed at the start of 25: steps 20..24 run twice, every other step once.
REDONE = range(20, KILL_AT)


def _expected_counts() -> dict[int, int]:
    return {k: 2 if k in REDONE else 1 for k in range(STEPS)}


def _check_counts(task: str, lines: list[str]) -> None:
    """Steps 20..24 twice and every other step once; except that the victim's peer may not
    have completed step 24 on the first attempt: the victim finishes its part of that step's
    all-reduce and is killed, and its peer, still waiting on the last of the victim's bytes,
    gets a peer failure instead (the step is then run once, after the restart)."""
    counts = _launching.step_counts(lines)
    expected = _expected_counts()
    if task != "worker:1" and counts.get(KILL_AT - 1) == 1:
        expected[KILL_AT - 1] = 1
    assert counts == expected, (task, lines)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_mwms_worker_killed_resumes_from_the_last_checkpoint_bit_for_bit(
        tmp_path, marker, optimizer) -> None:
    out_dir = tmp_path / "out"
    path = _launching.write_cluster_file(
        tmp_path, marker, HERE / "_resume_train.py",
        ["--dir", tmp_path / "ckpt", "--out", out_dir, "--steps", STEPS,
         "--save-every", SAVE_EVERY, "--optimizer", optimizer, "--kill-at", KILL_AT],
        jobs="{worker: 2}", extra="restart: {max_restarts: 1, policy: exit-code}\n")
    result, text = _launching.launch(path)
    assert result.exit_code == 0, text
    assert result.attempts == 2, text
    assert "worker:1 exited 137 (SIGKILL)" in text, text
    for task in ("worker:0", "worker:1"):
        lines = console_lines(text, task)
        assert [line for line in lines if line.startswith("resumed at")] == [
            "resumed at 0", "resumed at 20"], (task, lines)
        _check_counts(task, lines)
    reference = _resume_train.reference(STEPS, 2, optimizer)
    for task in ("worker-0", "worker-1"):
        np.testing.assert_array_equal(np.load(out_dir / f"{task}.npy"), reference)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint", "ckpt-40", "ckpt-50",
                                                     "ckpt-60"]


def _launch_ps(tmp_path: Path, marker: str, optimizer: str, kill: str,
               max_restarts: int) -> tuple[object, str, Path]:
    out = tmp_path / "final.npy"
    path = _launching.write_cluster_file(
        tmp_path, marker, HERE / "_resume_ps_train.py",
        ["--dir", tmp_path / "ckpt", "--out", out, "--steps", STEPS,
         "--save-every", SAVE_EVERY, "--optimizer", optimizer, "--kill", kill,
         "--kill-at", KILL_AT, "--flag", tmp_path / "killed-once"],
        jobs="{chief: 1, worker: 2, ps: 2}",
        extra=("mode: coordinator\n"
               f"restart: {{max_restarts: {max_restarts}, policy: exit-code}}\n"))
    result, text = _launching.launch(path)
    return result, text, out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_ps_killed_restarts_the_cluster_which_resumes_bit_for_bit(
        tmp_path, marker, optimizer) -> None:
    result, text, out = _launch_ps(tmp_path, marker, optimizer, "ps", max_restarts=1)
    assert result.exit_code == 0, text
    assert result.attempts == 2, text
    assert "ps:0 exited 137 (SIGKILL)" in text and "restarting the cluster" in text, text
    chief = console_lines(text, "chief:0")
    assert any(line.startswith("killed ps:0") for line in chief), chief
    assert [line for line in chief if line.startswith("resumed at")] == [
        "resumed at 0", "resumed at 20"], chief
    assert _launching.step_counts(chief) == _expected_counts(), chief
    np.testing.assert_array_equal(np.load(out), _resume_ps_train.reference(STEPS, optimizer))


@pytest.mark.timeout(300)
def test_ps_worker_killed_is_restarted_alone_and_the_run_stays_bit_exact(tmp_path,
                                                                         marker) -> None:
    result, text, out = _launch_ps(tmp_path, marker, "adam", "worker", max_restarts=0)
    assert result.exit_code == 0, text
    assert result.attempts == 1, text
    assert (tmp_path / "killed-once").exists()
    assert "exited 137 (SIGKILL): killed by SIGKILL; restarting it" in text, text
    assert sum(t.restarts for t in result.tasks) == 1, result.tasks
    chief = console_lines(text, "chief:0")
    assert [line for line in chief if line.startswith("resumed at")] == ["resumed at 0"], chief
    assert _launching.step_counts(chief) == {k: 1 for k in range(STEPS)}, chief
    np.testing.assert_array_equal(np.load(out), _resume_ps_train.reference(STEPS, "adam"))
