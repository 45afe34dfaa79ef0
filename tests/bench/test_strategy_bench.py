"""``bench/strategy.py`` on a tiny configuration: the model shapes have the architectures' sizes,
the targets table has the goals, and one fast run (N=2, 4 KiB, 2 iterations, ResNet-50 steps,
both paths) fills every cell of both tables and checks its results (the task raises on a wrong
sum or update). Speed is the benchmark's business, never asserted here."""

from __future__ import annotations

import importlib.util
import math
import os
import shlex
from pathlib import Path

import pytest

from bench._model_shapes import MODELS, bert_base, parameter_count, resnet50
from bench._strategy_torch import torch_version
from bench.record import load_result

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "strategy.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_strategy", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resnet50_shapes_are_the_architectures():
    shapes = resnet50()
    assert len(shapes) == 161
    assert parameter_count(shapes) == 25_557_032
    names = dict(shapes)
    assert names["conv1.weight"] == (64, 3, 7, 7)
    assert names["layer4.0.downsample.0.weight"] == (2048, 1024, 1, 1)
    assert names["layer3.5.conv2.weight"] == (256, 256, 3, 3)
    assert names["fc.weight"] == (1000, 2048)
    assert len(names) == len(shapes)  # unique names


def test_bert_base_shapes_are_the_architectures():
    shapes = bert_base()
    assert len(shapes) == 199
    assert parameter_count(shapes) == 109_482_240
    names = dict(shapes)
    assert names["embeddings.word_embeddings.weight"] == (30522, 768)
    assert names["encoder.layer.11.intermediate.dense.weight"] == (3072, 768)
    assert names["encoder.layer.11.output.dense.weight"] == (768, 3072)
    assert names["pooler.dense.bias"] == (768,)
    assert len(names) == len(shapes)
    assert set(MODELS) == {"resnet50", "bert-base"}


def test_targets_per_path_and_case():
    bench = _load_bench()
    big = f"all_reduce:{64 << 20}"
    assert [bench.target("shm", n, big) for n in (2, 4)] == [2.5, 2.5]
    assert [bench.target("network", n, big) for n in (2, 4)] == [1.2, 1.0]
    assert bench.target("shm", 2, "all_reduce:4096") is None
    assert bench.target("shm", 4, "apply_gradients:bert-base") == 2.0  # <= 0.5x DDP's time
    assert bench.target("network", 2, "apply_gradients:resnet50") == 1.0


@pytest.mark.timeout(300)
def test_tiny_run_fills_both_tables(tmp_path, capsys, marker, monkeypatch):
    # The marker reaches every task and gloo process: the fixture checks none is left.
    monkeypatch.setenv("CLUSTER_TEST_MARKER", marker)
    bench = _load_bench()
    argv = ["--nprocs", "2", "--sizes", "4K", "--models", "resnet50", "--iters", "2",
            "--warmup", "1", "--model-iters", "1", "--model-warmup", "0",
            "--json", str(tmp_path / "rows.json"), "--timeout", "240"]
    has_torch = torch_version() is not None
    if not has_torch:
        argv.append("--no-torch")
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    tables = out.split("\n\n")
    rows = [line.split("|")[1:-1] for line in out.splitlines()
            if line.startswith("| 2 |")]
    assert [r[1].strip() for r in rows] == ["all_reduce 4 KiB", "apply_gradients resnet50"] * 2
    assert any(t.startswith("shared memory") for t in tables)
    assert any(t.startswith("network") for t in tables)
    for cells in rows:
        assert float(cells[2]) > 0  # ours median (ms)
        if has_torch:
            assert float(cells[3]) >= 0 and cells[4].strip().endswith("x")
        else:
            assert cells[3].strip() == "skipped"
    for cells in rows:  # CPU all ranks used per call, and the cores it kept busy
        ours_cpu, gloo_cpu = (c.strip() for c in cells[14].split("/"))
        ours_busy, gloo_busy = (c.strip() for c in cells[15].split("/"))
        assert float(ours_cpu) > 0 and float(ours_busy) > 0
        if has_torch:
            assert float(gloo_cpu) > 0 and float(gloo_busy) > 0
        else:
            assert gloo_cpu == gloo_busy == "-"
    model_row = rows[1]
    assert model_row[5].strip().startswith(">= 2.0x")  # the target is shown
    if has_torch:
        assert float(model_row[8]) > 0 and float(model_row[9]) > 0  # both backward times
    saved = load_result(tmp_path / "rows.json")  # --json: a result file of the schema
    assert saved.name == "rows" and saved.source.startswith("measured")
    assert saved.command == "uv run python bench/strategy.py " + shlex.join(argv)
    assert saved.machine.cores == os.cpu_count()
    table = saved.tables[0]
    assert [row[:2] for row in table.rows] == [(2, "all_reduce 4 KiB"),
                                               (2, "apply_gradients resnet50")]
    for path in ("shm", "network"):
        assert all(row[table.column(path)] > 0 for row in table.rows)
    assert bench.case_bytes("apply_gradients:resnet50") == 4 * 25_557_032


def test_cpu_is_summed_over_ranks_per_iteration_then_the_median_taken():
    bench = _load_bench()
    per_rank = [{"cpu:x": [1.0, 5.0, 2.0]}, {"cpu:x": [3.0, 0.0, 9.0]}]
    assert bench.cpu_median(per_rank, "x") == 5.0  # sums 4, 5, 11
    assert bench.cpu_median([{"cpu:x": [1.0]}, {}], "x") is None  # a rank did not record it
    assert bench.busy(0.3, 0.15) == "2.00" and bench.busy(None, 0.1) == "-"


def test_a_failing_task_is_reported_with_its_output(monkeypatch, marker):
    monkeypatch.setenv("CLUSTER_TEST_MARKER", marker)
    bench = _load_bench()
    with pytest.raises(bench.BenchError, match=r"ours \(shm\), N=2: worker:0 exited 2"):
        bench.bench_ours(2, "shm", ["--no-such-option"], timeout=60)


def test_ddp_buckets_follow_ddps_rule():
    from bench._strategy_torch import _ddp_buckets

    mib = (1 << 20) // 4  # float32 elements per MiB
    # Reverse order; a bucket closes with the tensor that reaches its cap (1 MiB first, then 25).
    assert _ddp_buckets([10 * mib, 20 * mib, 3 * mib, mib // 2, mib // 2]) == [mib, 33 * mib]
    assert _ddp_buckets([30 * mib, mib, 2 * mib]) == [2 * mib, 31 * mib]
    sizes = [s for _, s in resnet50()]
    counts = [math.prod(s) for s in sizes]
    buckets = _ddp_buckets(counts)
    assert sum(buckets) == sum(counts) and len(buckets) == 5
