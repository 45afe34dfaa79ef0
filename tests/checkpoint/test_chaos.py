"""Chaos through ``clusterctl launch``: a MultiWorkerMirroredStrategy run (chief + 2 workers,
Adam, a checkpoint every few steps, ``max_to_keep`` 2) while the test SIGKILLs a random task
(seeded; the seed is printed and in every failure message) several times. clusterctl restarts
the cluster each time, each attempt resumes from the newest checkpoint, and the run ends with
parameters bit for bit those of an uninterrupted run.

A kill is made only once the current attempt has saved a checkpoint past the step it resumed at
(then after a random 1-4 s, so kills land mid-step and mid-save), so every attempt makes
progress whatever the machine's load; the test asserts that progress from the ``resumed at``
lines, that no step is skipped and that at most one save interval is redone per kill.
"""

from __future__ import annotations

import io
import itertools
import os
import random
import re
import secrets
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from cluster.testing import kill_and_wait, task_pid

sys.path.insert(0, os.fspath(Path(__file__).parent))
import _launching  # noqa: E402
import _resume_train  # noqa: E402 - the script clusterctl runs, imported for the reference

pytestmark = [pytest.mark.multiprocess]

HERE = Path(__file__).parent
TASKS = ("chief:0", "worker:0", "worker:1")
STEPS, SAVE_EVERY, PACE = 1200, 20, 0.02
MAX_KILLS, MIN_KILLS = 6, 4
WAIT = 90.0  # seconds, generous: one attempt's start-up and first save on a loaded machine


class _ChaosConsole(io.StringIO):
    """The launcher's console, parsed as it is written: the attempt number, the step the
    chief resumed at in it and the newest checkpoint it saved, under a condition."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()
        self.attempt = 0
        self.resumed: int | None = None
        self.saved: int | None = None
        self.done = False
        self._partial = ""

    def write(self, s: str) -> int:
        with self.changed:
            written = super().write(s)
            self._partial += s
            *lines, self._partial = self._partial.split("\n")
            for line in lines:
                self._parse(line)
            self.changed.notify_all()
        return written

    def _parse(self, line: str) -> None:
        if m := re.match(r"\[clusterctl\] run \S+ attempt (\d+):", line):
            self.attempt, self.resumed, self.saved = int(m.group(1)), None, None
        elif line.startswith("[chief:0]"):
            body = line[len("[chief:0]"):].strip()
            if m := re.fullmatch(r"resumed at (\d+)", body):
                self.resumed = int(m.group(1))
            elif m := re.fullmatch(r"saved ckpt-(\d+)", body):
                self.saved = int(m.group(1))
            elif body == "done":
                self.done = True


def _killer(console: _ChaosConsole, marker: str, rng: random.Random, stop: threading.Event,
            kills: list[tuple[int, str, int]], errors: list[BaseException]) -> None:
    """One kill per attempt, each once the attempt saved past where it resumed."""
    try:
        for attempt in range(1, MAX_KILLS + 1):
            def progressed(a=attempt) -> bool:
                return stop.is_set() or console.done or (
                    console.attempt == a and console.resumed is not None
                    and console.saved is not None and console.saved > console.resumed)

            with console.changed:
                if not console.changed.wait_for(progressed, WAIT):
                    raise AssertionError(f"attempt {attempt} made no progress in {WAIT} s")
                saved = console.saved
            if stop.is_set() or console.done or saved > STEPS - 3 * SAVE_EVERY:
                return  # too close to the end: the run finishes
            if stop.wait(rng.uniform(1.0, 4.0)):  # a random moment: mid-step, mid-save
                return
            victim = rng.choice(TASKS)
            job, index = victim.split(":")
            pid = task_pid(marker, job, int(index))
            assert pid is not None, f"attempt {attempt}: {victim} not found"
            assert kill_and_wait(pid, 30), f"attempt {attempt}: {victim} ({pid}) did not die"
            kills.append((attempt, victim, saved))
    except BaseException as e:  # reported by the test, not lost in the thread
        errors.append(e)


def _attempts(text: str) -> list[dict[str, list[str]]]:
    """Each attempt's console lines, per task."""
    attempts: list[dict[str, list[str]]] = []
    for line in text.splitlines():
        if re.match(r"\[clusterctl\] run \S+ attempt \d+:", line):
            attempts.append({task: [] for task in TASKS})
        elif attempts and (m := re.match(r"\[(\w+:\d+)\]\s*(.*)$", line)) and m.group(1) in TASKS:
            attempts[-1][m.group(1)].append(m.group(2).strip())
    return attempts


@pytest.mark.timeout(300)
def test_random_sigkills_restarts_resume_and_end_bit_for_bit(tmp_path, marker) -> None:
    seed = int(os.environ.get("CHAOS_SEED", secrets.randbits(32)))
    print(f"chaos seed {seed} (rerun with CHAOS_SEED={seed})")
    rng = random.Random(seed)
    out_dir = tmp_path / "out"
    path = _launching.write_cluster_file(
        tmp_path, marker, HERE / "_resume_train.py",
        ["--dir", tmp_path / "ckpt", "--out", out_dir, "--steps", STEPS,
         "--save-every", SAVE_EVERY, "--optimizer", "adam", "--keep", 2, "--pace", PACE],
        jobs="{chief: 1, worker: 2}", run=240,
        extra=f"restart: {{max_restarts: {MAX_KILLS + 6}, policy: exit-code}}\n")
    console = _ChaosConsole()
    stop = threading.Event()
    kills: list[tuple[int, str, int]] = []
    errors: list[BaseException] = []
    killer = threading.Thread(target=_killer, args=(console, marker, rng, stop, kills, errors))
    killer.start()
    try:
        result, text = _launching.launch(path, console)
    finally:
        stop.set()
        with console.changed:
            console.changed.notify_all()
        killer.join(60)
    why = f"seed {seed}, kills {kills}\n{text}"
    assert not errors, (errors, why)
    assert result.exit_code == 0, why
    assert len(kills) >= MIN_KILLS, why
    assert result.attempts == len(kills) + 1, why  # every kill restarted the cluster, once

    attempts = _attempts(text)
    resumed = []
    for task in TASKS:
        ends = []  # (resumed at, last step printed) per attempt
        for lines in attempts:
            at = [int(line.split()[-1]) for line in lines[task] if line.startswith("resumed at")]
            steps = [int(line[5:]) for line in lines[task] if re.fullmatch(r"step \d+", line)]
            assert len(at) == 1, (task, lines[task], why)
            # Contiguous from where it resumed: no step skipped within an attempt.
            assert steps == list(range(at[0], at[0] + len(steps))), (task, why)
            ends.append((at[0], steps[-1] if steps else at[0] - 1))
        for (_, last), (next_at, _) in itertools.pairwise(ends):
            # Nothing lost (resumes at most one past the last step done), at most one save
            # interval redone.
            assert last + 1 - SAVE_EVERY <= next_at <= last + 1, (task, ends, why)
        assert ends[-1][1] == STEPS - 1, (task, ends, why)
        resumed.append([at for at, _ in ends])
    assert resumed[0] == resumed[1] == resumed[2], (resumed, why)
    # Progress between kills: every attempt resumed past where the one before it did.
    assert resumed[0][0] == 0 and all(a < b for a, b in itertools.pairwise(resumed[0])), why

    print(f"kills (attempt, task, newest checkpoint): {kills}; resumed at {resumed[0]}")
    reference = _resume_train.reference(STEPS, len(TASKS), "adam")
    for task in ("chief-0", "worker-0", "worker-1"):
        np.testing.assert_array_equal(np.load(out_dir / f"{task}.npy"), reference, err_msg=why)
    assert len([e for e in os.listdir(tmp_path / "ckpt") if e.startswith("ckpt-")]) == 2
