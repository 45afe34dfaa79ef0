"""Elastic training end to end: ``clusterctl launch -n 4 --elastic MIN:4`` runs the contract's
program (scripts/elastic_train.py); tasks SIGKILL themselves mid-run; the survivors keep their
processes and train on, clusterctl restarts the dead task alone, it rejoins, and every task ends
with the weights of the same training done in one process (float64, 1e-12), every step applied
once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.ctl._cli_run import env_with, run_cli

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).resolve().parent / "scripts" / "elastic_train.py"
TORCH_SCRIPT = SCRIPT.parent / "elastic_torch.py"
STEPS = 60
TASKS = ("chief:0", "worker:0", "worker:1", "worker:2")


def _launch(tmp_path: Path, marker: str, bounds: str | None, kill: str, hold: str = "", *,
            script: Path = SCRIPT, **env: str):
    """``clusterctl launch -n 4 [--elastic BOUNDS] SCRIPT`` (``None``: not elastic)."""
    env = env_with(marker, ELASTIC_DIR=str(tmp_path), ELASTIC_KILL=kill, ELASTIC_HOLD=hold,
                   ELASTIC_STEPS=str(STEPS), CLUSTER_CONNECT_TIMEOUT="60", **env)
    elastic = ["--elastic", bounds] if bounds is not None else []
    return run_cli(["launch", "-n", "4", *elastic, str(script)],
                   cwd=REPO, env=env, timeout=200)


def _finals(output: str) -> dict[str, dict]:
    return {m.group(1): json.loads(m.group(2))
            for m in re.finditer(r"FINAL (\S+) (\{.*\})", output)}


def _pids(tmp_path: Path, task: str) -> list[int]:
    return [int(line) for line in (tmp_path / f"pids-{task}").read_text().split()]


def _check_exact(finals: dict[str, dict], steps: int = STEPS) -> None:
    assert set(finals) == set(TASKS), sorted(finals)
    reference = np.array(finals["chief:0"]["reference"])
    for task, final in finals.items():
        np.testing.assert_allclose(final["w"], reference, rtol=0, atol=1e-12, err_msg=task)
        assert final["applied"] == list(range(steps)), task  # every step once, in order


@pytest.mark.parametrize("killed", [
    ("worker:1",),               # a worker
    ("chief:0",),                # the chief (the coordination service runs apart)
    ("worker:0", "worker:2"),    # two workers, one after the other
])
def test_killed_tasks_leave_and_rejoin_and_training_stays_exact(tmp_path, marker,
                                                                killed) -> None:
    kill = ",".join(f"{task}@{10 + 8 * i}" for i, task in enumerate(killed))
    run = _launch(tmp_path, marker, "2:4", kill, hold="40@4")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    finals = _finals(out)
    _check_exact(finals)
    for task in TASKS:
        starts = _pids(tmp_path, task)
        if task in killed:
            assert len(starts) == 2, (task, starts)  # restarted once, alone
            assert finals[task]["pid"] == starts[1]
        else:
            assert starts == [finals[task]["pid"]], (task, starts)  # never restarted
    # the group trained with fewer replicas meanwhile, and with all four again after the hold
    assert 4 - len(killed) in finals[TASKS[1] if "chief:0" in killed else "chief:0"]["sizes"]
    assert all(4 in f["sizes"] for f in finals.values())


def test_below_the_minimum_the_job_fails_naming_who_is_gone(tmp_path, marker) -> None:
    run = _launch(tmp_path, marker, "4:4", "worker:2@10")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-6000:]
    assert re.search(r"below min 4; gone: worker:2", out), out[-6000:]
    assert "FINAL" not in out  # nobody trained on without it


@pytest.mark.parametrize("bounds", ["2:4", None])
def test_a_worker_holding_the_gil_for_20_s_stays_in_the_group(tmp_path, marker, bounds) -> None:
    # Its heartbeats stop for 20 s (against the 3 s heartbeat timeout) but its host answers:
    # stalled, not lost, so nobody regroups, restarts or fails, elastic or not.
    run = _launch(tmp_path, marker, bounds, "", ELASTIC_GIL="worker:1@5@20")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    finals = _finals(out)
    _check_exact(finals)
    assert all(f["sizes"] == [4] for f in finals.values()), finals
    assert all(len(_pids(tmp_path, t)) == 1 for t in TASKS)
    # The coordination service said so: in its own log under --elastic (it runs apart), else
    # in the chief's output (the chief hosts it).
    run_dir = Path(re.search(r"logs in (\S+)", out).group(1))
    said = (run_dir / "coordination-service.log").read_text() if bounds else out
    assert re.search(r"worker:1 .*is stalled", said), said[-3000:]


def test_cluster_torch_training_leaves_and_rejoins_exactly(tmp_path, marker) -> None:
    pytest.importorskip("torch", reason="the torch extra is not installed (uv sync --extra torch)")
    run = _launch(tmp_path, marker, "2:4", "worker:1@10", hold="30@4", script=TORCH_SCRIPT)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    finals = _finals(out)
    _check_exact(finals)
    assert len(_pids(tmp_path, "worker:1")) == 2
    assert all(_pids(tmp_path, t) == [finals[t]["pid"]] for t in TASKS if t != "worker:1")
    assert 3 in finals["chief:0"]["sizes"] and 4 in finals["chief:0"]["sizes"]

