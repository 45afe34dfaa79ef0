"""PreemptionCheckpointHandler: SIGTERM only flags; every task saves at the next ``run`` call
and exits 204; a restart resumes there with zero steps redone (through ``clusterctl launch``)."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

import cluster
from cluster import exitcodes
from cluster.checkpoint import Checkpoint, CheckpointManager, PreemptionCheckpointHandler
from cluster.ctl import launcher, policy
from cluster.ctl.spec import parse_cluster_file
from cluster.optimizers import SGD

sys.path.insert(0, os.fspath(Path(__file__).parent))
import _preempt_train  # noqa: E402 - the script clusterctl runs, imported for the reference

pytestmark = [pytest.mark.timeout(120)]

TRAIN = Path(__file__).with_name("_preempt_train.py")


class Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit(code: int) -> None:
    raise Exited(code)


def _objects():
    w = cluster.Variable(np.arange(4, dtype=np.float32), name="w")
    opt = SGD(0.1, momentum=0.9)
    return w, opt, Checkpoint(model=[w], optimizer=opt)


def test_exit_preempted_is_retryable_and_restarts_the_cluster() -> None:
    code = exitcodes.EXIT_PREEMPTED
    assert code >= 128 and exitcodes.is_retryable(code)
    assert exitcodes.describe(code) == "204 (preempted: checkpoint saved)"
    assert policy.decide(code, restarts_done=0, max_restarts=1) is policy.Decision.RESTART
    assert policy.decide(code, restarts_done=1, max_restarts=1) is policy.Decision.FAIL


def test_sigterm_defers_to_the_next_run_call_which_saves_and_exits(tmp_path) -> None:
    w, opt, ckpt = _objects()
    previous = signal.getsignal(signal.SIGTERM)
    handler = PreemptionCheckpointHandler(None, ckpt, tmp_path, exit_fn=_exit)
    calls = []

    def step(k):
        opt.apply_gradients([(np.full(4, k + 1.0, np.float32), w)])
        calls.append(k)
        if k == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # mid-step: only a flag, the step completes
        return k

    try:
        assert handler.total_run_calls == 0
        for k in range(3):
            assert handler.run(step, k) == k
        assert handler.preemption_received and handler.total_run_calls == 3
        saved = w.numpy().copy()
        with pytest.raises(Exited) as exited:
            handler.run(step, 3)
    finally:
        handler.close()
    assert exited.value.code == exitcodes.EXIT_PREEMPTED
    assert calls == [0, 1, 2]  # the step after the notice did not run
    assert signal.getsignal(signal.SIGTERM) is previous  # the handler was reinstated
    assert os.path.basename(CheckpointManager(ckpt, tmp_path).latest_checkpoint) == "ckpt-3"

    # A restart: fresh objects, the handler restores them and the run counter.
    w2, opt2, ckpt2 = _objects()
    with PreemptionCheckpointHandler(None, ckpt2, tmp_path, exit_fn=_exit) as resumed:
        assert resumed.total_run_calls == 3
        np.testing.assert_array_equal(w2.numpy(), saved)
        assert opt2.iterations == 3
        assert not resumed.preemption_received


def test_a_resume_is_logged_at_info_not_warning(tmp_path, caplog) -> None:
    w, _, ckpt = _objects()
    CheckpointManager(ckpt, tmp_path).save(checkpoint_number=7)
    caplog.set_level(logging.DEBUG, logger="cluster.checkpoint")
    with PreemptionCheckpointHandler(None, _objects()[2], tmp_path, exit_fn=_exit) as resumed:
        assert resumed.total_run_calls == 7
    resumes = [r for r in caplog.records if r.getMessage().startswith("resumed from ")]
    assert [r.levelno for r in resumes] == [logging.INFO], caplog.text
    assert resumes[0].getMessage().endswith("ckpt-7 at run call 7")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_close_redelivers_a_notice_that_was_not_acted_on(tmp_path) -> None:
    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        handler = PreemptionCheckpointHandler(None, _objects()[2], tmp_path, exit_fn=_exit)
        os.kill(os.getpid(), signal.SIGTERM)
        assert handler.preemption_received and got == []
        handler.close()
        assert got == [signal.SIGTERM]
        handler.close()  # idempotent
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_arguments_are_checked(tmp_path) -> None:
    _, _, ckpt = _objects()
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        PreemptionCheckpointHandler(None, ckpt)
    with pytest.raises(ValueError, match="only for a Checkpoint"):
        PreemptionCheckpointHandler(None, CheckpointManager(ckpt, tmp_path), tmp_path)
    with pytest.raises(TypeError, match="got dict"):
        PreemptionCheckpointHandler(None, {})


def _reference(steps: int) -> np.ndarray:
    """The uninterrupted run: the same two replicas in one process."""
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    w, opt, iterator = _preempt_train.build(strategy, steps)
    step = _preempt_train.make_step(w, opt)
    for k in range(steps):
        strategy.run(step, args=(next(iterator), k))
    return w.values[0].numpy()


def _lines(out: str, task: str) -> list[str]:
    prefix = f"[{task}]"
    return [line[len(prefix):].strip() for line in out.splitlines() if line.startswith(prefix)]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_sigterm_on_a_worker_restarts_the_cluster_and_resumes_with_zero_steps_lost(
        tmp_path, marker) -> None:
    steps, signal_at = 12, 5
    out_file = tmp_path / "final.npy"
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "name: preempt-test\n"
        f"entrypoint: {TRAIN}\n"
        f"args: [{str(tmp_path / 'ckpt')!r}, {str(out_file)!r}, '{steps}', '{signal_at}']\n"
        "cluster: {worker: 2}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        "restart: {max_restarts: 1, policy: exit-code}\n"
        "timeouts: {startup: 60, grace: 30, run: 200}\n")
    console = io.StringIO()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=console,
                             color="never")
    text = console.getvalue()
    assert result.exit_code == 0, text
    assert result.attempts == 2, text
    for task in ("worker:0", "worker:1"):
        lines = _lines(text, task)
        runs = [int(m.group(1)) for line in lines if (m := re.fullmatch(r"run (\d+)", line))]
        # Zero steps lost or redone: the signalled step 5 completes, the agreement is at call 6
        # (0..5 before the notice, 6..11 after the restart).
        assert runs == list(range(steps)), (task, lines)
        assert lines.count("resumed at 0") == 1, lines
        assert lines.count(f"resumed at {signal_at + 1}") == 1, lines
        assert any(f"saved {tmp_path / 'ckpt' / f'ckpt-{signal_at + 1}'}" in line
                   and "exiting 204" in line for line in lines), lines
    assert "preemption notice on this task" in text  # worker:1 got the signal
    assert "preemption notice on another task" in text  # worker:0 followed the agreement
    # clusterctl's fail-fast SIGTERM to the task still exiting is absorbed, not a traceback.
    assert "Traceback" not in text, text
    np.testing.assert_array_equal(np.load(out_file), _reference(steps))


def _dataset(n: int) -> list[np.ndarray]:
    return [np.full((2, 3), i, np.float32) for i in range(n)]


def test_a_dataset_iterator_resumes_its_epoch_where_it_stopped(tmp_path) -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    iterator = iter(strategy.experimental_distribute_dataset(_dataset(6)))
    for _ in range(4):
        next(iterator)
    path = Checkpoint(data=iterator).write(tmp_path / "c")
    expected = [[piece.tolist() for piece in batch.values] for batch in iterator]
    assert [e[0][0][0] for e in expected] == [4.0, 5.0]

    resumed = iter(strategy.experimental_distribute_dataset(_dataset(6)))
    Checkpoint(data=resumed).read(path)
    assert resumed.position == 4
    assert [[piece.tolist() for piece in batch.values] for batch in resumed] == expected
    assert resumed.position == 6


def test_an_iterator_that_cannot_seek_is_refused() -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    one_shot = iter(strategy.experimental_distribute_dataset(b for b in _dataset(3)))
    with pytest.raises(TypeError, match="cannot be restored by position"):
        Checkpoint(data=one_shot)
