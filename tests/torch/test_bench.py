"""``bench/torch_ddp.py`` on a tiny configuration: both systems train the example's small CNN
on 2 processes and report a step time split into compute and communication. Speed is the
benchmark's business, never asserted here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests._requires import require

require("torch")

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "torch_ddp.py"

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_torch_ddp", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_tiny_run_of_each_system() -> None:
    bench = _load_bench()
    config = {"model": "small", "batch": 4, "steps": 2, "warmup": 1, "repeats": 2}
    for system in ("ours shm", "DDP gloo"):
        per_rank = bench.run(system, 2, config)
        assert len(per_rank) == 2
        assert all(len(r["step"]) == 2 and len(r["compute"]) == 2 for r in per_rank)
        row = bench.summarize(per_rank, config["steps"])
        assert row["steps_per_s"] > 0 and row["compute_ms"] > 0
        assert row["comm_ms"] >= 0
