"""examples/ps with ``--checkpoint-dir``: a parameter server SIGKILLed after the first checkpoint
makes ``clusterctl launch`` (``restart: {max_restarts: 1}``) restart the whole cluster, and the
chief resumes from the newest checkpoint and completes the run (real processes)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import ConsoleWatch, console_lines, kill_and_wait, task_pid
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

TRAIN = REPO / "examples" / "ps" / "train.py"
EPOCHS = 8  # the kill lands after epoch 1; the rest leaves time for it to land mid-run




def test_a_killed_ps_restarts_the_cluster_and_the_chief_resumes(tmp_path: Path, marker) -> None:
    ckpt = tmp_path / "ckpt"
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "name: ps-resume\n"
        "mode: coordinator\n"
        f"entrypoint: {TRAIN}\n"
        f"args: ['--epochs', '{EPOCHS}', '--checkpoint-dir', {str(ckpt)!r}]\n"
        "cluster: {chief: 1, worker: 2, ps: 2}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        "restart: {max_restarts: 1}\n"
        "timeouts: {startup: 60, grace: 10, run: 100}\n")
    first_save = f"saved {ckpt / 'ckpt-46'}"
    out = ConsoleWatch(first_save)
    errors: list[BaseException] = []

    def kill_ps() -> None:
        try:
            if out.event.wait(60):
                assert kill_and_wait(task_pid(marker, "ps", 1), 10), "ps:1 did not die"
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    killer = threading.Thread(target=kill_ps)
    killer.start()
    try:
        result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out,
                                 color="never")
    finally:
        out.event.set()
        killer.join(20)
    text = out.getvalue()
    assert not errors, errors
    assert result.exit_code == 0, text
    assert result.attempts == 2, text  # the whole cluster restarted once
    # The chief stops because its variables are gone (one line: its traceback is in its log);
    # the ps is the root cause, and SIGKILL (137) is retryable.
    assert "chief:0 stopped: ps:1 failed (traceback in chief-0.log)" in text, text
    assert text.count("ps:1 exited 137 (SIGKILL): killed by SIGKILL") == 2, text  # +restart
    assert "ps:1 exited 137 (SIGKILL): killed by SIGKILL: restarting the cluster " \
        "(restart 1 of 1)" in text, text
    chief = console_lines(text, "chief:0")
    resumed = [m for line in chief if (m := re.fullmatch(
        rf"resumed from {re.escape(str(ckpt))}/ckpt-(\d+) at epoch (\d+) step (\d+)", line))]
    assert len(resumed) == 1, chief  # the second attempt only
    number, epoch, step = (int(g) for g in resumed[0].groups())
    assert number == step == (epoch - 1) * 46 and 2 <= epoch <= EPOCHS, chief
    # Every epoch from the restored one on ran after the restart, up to the last.
    after = chief[chief.index(resumed[0].group(0)):]
    epochs = [int(m.group(1)) for line in after
              if (m := re.match(rf"epoch (\d+)/{EPOCHS} ", line))]
    assert epochs == list(range(epoch, EPOCHS + 1)), chief
    assert f"saved {ckpt / f'ckpt-{EPOCHS * 46}'}" in after, chief
    assert any(re.match(r"test accuracy 0\.\d+ on 360 held-out digits", line)
               for line in after), chief
