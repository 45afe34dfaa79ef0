"""Smoke test of ``bench/checkpoint.py`` on a tiny model: every row round-trips its tensors
exactly (the bench raises otherwise) and the table has one row per format. Speed is the
benchmark's business, never asserted here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "checkpoint.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_checkpoint", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_model_reaches_size_with_whole_layers():
    bench = _load_bench()
    model = bench.make_model(300_000, d_model=32)
    total = sum(a.nbytes for a in model.values())
    assert total >= 300_000
    assert all(a.dtype == np.float32 for a in model.values())
    layers = {k.split(".")[0] for k in model if k.startswith("h")}
    assert {f"h{i}.mlp.fc.w" for i in range(len(layers))} <= set(model)
    assert model["h0.mlp.fc.w"].shape == (32, 128)


@pytest.mark.timeout(120)
def test_bench_round_trips_every_format_at_every_size(tmp_path, capsys):
    bench = _load_bench()
    formats = ["cluster.checkpoint", "safetensors", "raw disk", "dd"]
    assert bench.main(["--sizes", "200K,300K", "--d-model", "32", "--runs", "2", "--keep-cache",
                       "--dir", str(tmp_path), "--formats", ",".join(formats)]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| ") and "---" not in line]
    assert rows[0][:3] == ["model", "format", "save s"]
    sizes = [r[0] for r in rows[1:]]
    assert [r[1] for r in rows[1:]] == formats * 2
    assert len(set(sizes[:4])) == 1 and len(set(sizes[4:])) == 1 and sizes[0] != sizes[4]
    assert all("(cached)" in r[5] for r in rows[1:])
    assert all(r[4] == "1.00" and r[7] == "1.00" for r in rows[1:] if r[1] == "dd")
    assert list(tmp_path.iterdir()) == []  # the bench removed what it wrote


def test_bench_detects_a_wrong_restore(tmp_path, monkeypatch):
    bench = _load_bench()
    monkeypatch.setattr(bench.RawSafetensors, "load",
                        lambda self, path: {"embed": np.zeros(1, np.float32)})
    with pytest.raises(RuntimeError, match="safetensors restored different tensors"):
        bench.main(["--sizes", "100K", "--d-model", "32", "--runs", "1", "--keep-cache",
                    "--dir", str(tmp_path), "--formats", "safetensors"])
