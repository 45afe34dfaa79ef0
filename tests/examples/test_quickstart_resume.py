"""The quickstart with ``--checkpoint-dir`` resumes bit for bit: under every local strategy in
this process, and under MultiWorkerMirroredStrategy through ``clusterctl launch`` (1 chief + 2
workers), both when run again on the same directory and when a worker is preempted (SIGTERM)
mid-run and clusterctl restarts the cluster. Every resumed run must end with the parameters an
uninterrupted run ends with, compared with ``==`` (not a tolerance)."""

from __future__ import annotations

import importlib.util
import io
import re
import signal
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import ConsoleWatch, kill_and_wait, processes_with, task_pid
from tests.conftest import REPO

TRAIN = REPO / "examples" / "quickstart" / "train.py"
EPOCHS = 3  # 23 steps each (1437 digits, global batch 64)


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as saved:
        return {k: saved[k] for k in saved.files}


def assert_same_params(got: Path, want: Path) -> None:
    got_params, want_params = load(got), load(want)
    assert sorted(got_params) == sorted(want_params)
    for key in want_params:  # arr_0..arr_3 (w1, b1, w2, b2) and test_accuracy
        np.testing.assert_array_equal(got_params[key], want_params[key], err_msg=key)


# -- in this process: one task, every local strategy ----------------------------------------------

@pytest.fixture(scope="module")
def quickstart():
    spec = importlib.util.spec_from_file_location("quickstart_train_resume", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["default", "one_device", "mirrored", "central_storage"])
def test_a_rerun_on_the_checkpoint_dir_resumes_mid_epoch_bit_for_bit(quickstart, tmp_path,
                                                                     strategy, capsys) -> None:
    common = ["--strategy", strategy, "--epochs", "2"]
    assert quickstart.main([*common, "--save", str(tmp_path / "once.npz")]) == 0
    ckpt = tmp_path / "ckpt"
    # One epoch, saving every 5 steps: the newest checkpoint is step 20 of epoch 1's 23.
    assert quickstart.main([*common[:3], "1", "--checkpoint-dir", str(ckpt),
                            "--checkpoint-every", "5"]) == 0
    assert sorted(p.name for p in ckpt.glob("ckpt-*")) == ["ckpt-10", "ckpt-15", "ckpt-20"]
    capsys.readouterr()
    assert quickstart.main([*common, "--checkpoint-dir", str(ckpt),
                            "--save", str(tmp_path / "resumed.npz")]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {ckpt / 'ckpt-20'} at epoch 1 step 20" in out
    # The resumed epoch reports the metrics of the whole epoch (restored, then continued).
    assert out.count("epoch 1/2  loss") == 1 and f"saved {ckpt / 'ckpt-46'}" in out
    assert_same_params(tmp_path / "resumed.npz", tmp_path / "once.npz")


@pytest.mark.timeout(60)
def test_no_checkpoint_dir_is_needed(quickstart, tmp_path, capsys) -> None:
    assert quickstart.main(["--strategy", "one_device", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "resumed" not in out and "saved" not in out and "test accuracy" in out
    assert list(tmp_path.iterdir()) == []


# -- MultiWorkerMirroredStrategy through clusterctl -----------------------------------------------

def cluster_file(tmp_path: Path, marker: str, name: str, args: list[str],
                 restart: str = "{max_restarts: 0}") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        f"entrypoint: {TRAIN}\n"
        f"args: {args!r}\n"
        "cluster: {chief: 1, worker: 2}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        f"restart: {restart}\n"
        "timeouts: {startup: 60, grace: 30, run: 100}\n")
    return path


def launch(path: Path, out: io.StringIO | None = None) -> tuple[launcher.LaunchResult, str]:
    out = out if out is not None else io.StringIO()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out, color="never")
    return result, out.getvalue()


def chief_lines(text: str) -> list[str]:
    # tqdm's bar shares lines with the chief's prints (carriage returns): split on those too.
    return [part.strip() for line in text.splitlines() if line.startswith("[chief:0]")
            for part in line[len("[chief:0]"):].split("\r")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The parameters of an uninterrupted 3-task run (no checkpoint directory)."""
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    saved = tmp_path / "params.npz"
    marker = f"cluster-test-{uuid.uuid4().hex}"  # module-scoped: its own leak check
    result, text = launch(cluster_file(tmp_path, marker, "qs-once",
                                       ["--epochs", str(EPOCHS), "--save", str(saved)]))
    assert not processes_with(marker), "processes left behind"
    assert result.exit_code == 0, text
    return saved


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_multi_worker_run_resumes_from_the_checkpoint_dir_bit_for_bit(tmp_path, marker,
                                                                      uninterrupted) -> None:
    ckpt, saved = tmp_path / "ckpt", tmp_path / "params.npz"
    result, text = launch(cluster_file(
        tmp_path, marker, "qs-first",
        ["--epochs", "1", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5"]))
    assert result.exit_code == 0, text
    result, text = launch(cluster_file(
        tmp_path, marker, "qs-again",
        ["--epochs", str(EPOCHS), "--checkpoint-dir", str(ckpt), "--save", str(saved)]))
    assert result.exit_code == 0, text
    lines = chief_lines(text)
    assert f"resumed from {ckpt / 'ckpt-20'} at epoch 1 step 20" in lines, text
    assert f"saved {ckpt / f'ckpt-{EPOCHS * 23}'}" in lines, text
    assert_same_params(saved, uninterrupted)



@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_preempted_worker_restarts_the_cluster_which_resumes_bit_for_bit(
        tmp_path, marker, uninterrupted) -> None:
    ckpt, saved = tmp_path / "ckpt", tmp_path / "params.npz"
    path = cluster_file(tmp_path, marker, "qs-preempted",
                        ["--epochs", str(EPOCHS), "--checkpoint-dir", str(ckpt),
                         "--checkpoint-every", "5", "--save", str(saved)],
                        restart="{max_restarts: 1, policy: exit-code}")
    out = ConsoleWatch(f"saved {ckpt / 'ckpt-5'}")
    errors: list[BaseException] = []

    def preempt() -> None:
        try:
            if out.event.wait(60):  # a preemption notice: SIGTERM, to worker:1 only
                assert kill_and_wait(task_pid(marker, "worker", 1), 30, signal.SIGTERM)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    thread = threading.Thread(target=preempt)
    thread.start()
    try:
        result, text = launch(path, out)
    finally:
        out.event.set()
        thread.join(40)
    assert not errors, errors
    assert result.exit_code == 0, text
    assert result.attempts == 2, text
    assert "exited 204 (preempted: checkpoint saved)" in text, text
    # clusterctl gave every task timeouts.grace: the save is reported against it.
    assert re.search(r"\[worker:1\] +preemption notice on this task: saved .* s after the "
                     r"notice \(of a 30 s grace period\); exiting 204", text), text
    assert re.search(r"\[chief:0\] +preemption notice on another task: saved .* s after the "
                     r"agreement \(of a 30 s grace period\)", text), text
    resumed = [m for line in chief_lines(text)
               if (m := re.fullmatch(rf"resumed from {re.escape(str(ckpt))}/ckpt-(\d+) "
                                     r"at epoch (\d) step (\d+)", line))]
    assert len(resumed) == 1, text
    number, epoch, step = (int(g) for g in resumed[0].groups())
    # The notice may land before the run call right after ckpt-5: then the agreed step is 5.
    assert number == step and 5 <= step < EPOCHS * 23 and epoch == step // 23 + 1, text
    assert "Traceback" not in text, text
    assert_same_params(saved, uninterrupted)
