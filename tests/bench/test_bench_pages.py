"""The benchmark result files and the pages made of them: every file in ``bench/results/``
keeps the schema (``bench/record.py``), the committed pages in ``docs/benchmarks/`` are the
ones ``tools/bench_pages.py`` makes of them, and the benches' ``--json`` tables keep it too."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import re
import struct
import sys
from pathlib import Path

import pytest

from bench.record import (
    Column,
    Figure,
    Machine,
    Plot,
    Result,
    ResultError,
    Table,
    cores_per_rank,
    load_result,
    machine_here,
    machine_line,
    result_json,
    write_result,
)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
PAGES = REPO / "docs" / "benchmarks"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and annotations look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages():
    return _load("bench_pages_tool", REPO / "tools" / "bench_pages.py")


def _result(**changes) -> Result:
    base = dict(
        name="demo", title="Demo", summary="What it measures.", command="uv run python x.py",
        machine=Machine(cores=2, cpu="Some CPU", memory_gib=8.0, os="Linux"),
        date="2026-01-02", commit="abcdef1", source="measured",
        tables=(Table(title="T", columns=(Column("N"), Column("size"), Column("ours", "ms", 2),
                                          Column("x gloo", "x", 2)),
                      rows=((2, "4 KiB", 0.5, 2.0), (2, "64 MiB", 20.0, None),
                            (4, "4 KiB", 1.0, 1.5), (4, "64 MiB", 40.0, 0.9))),),
        figures=(Figure("ours 64 MiB N=4", 0.9, "x"),),
        plots=(Plot(title="p", table=0, kind="line", x=("size",), y=("ours",), ylabel="ms",
                    group="N"),))
    base.update(changes)
    return Result(**base)


# -- the committed files -------------------------------------------------------------------


def test_every_result_file_keeps_the_schema(pages):
    files = sorted(RESULTS.glob("*.json"))
    assert len(files) >= 10
    for path in files:
        result = load_result(path)
        assert result.name == path.stem
        assert result.machine.cores >= 1 and result.machine.cpu
        assert result.command.split()[0] in ("uv", "sudo", "nice", "CUDA_VISIBLE_DEVICES=")
        assert path.read_text() == result_json(result), f"{path}: not in its canonical form"
    assert [r.name for r in pages.load_results(RESULTS)][:2] == ["strategy", "strategy-bert"]


def test_committed_pages_are_those_the_result_files_give(pages):
    rendered = pages.render_pages(pages.load_results(RESULTS))
    committed = {p.name: p.read_text() for p in PAGES.glob("*.md")}
    assert set(committed) == set(rendered), "run: uv run python tools/bench_pages.py"
    stale = [name for name, text in rendered.items() if committed[name] != text]
    assert not stale, f"out of date: {stale}; run: uv run python tools/bench_pages.py"
    for name, text in rendered.items():  # every plot a page shows is committed
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            assert (PAGES / image).is_file(), f"{name} shows {image}, which is not committed"


def test_pages_state_the_command_machine_date_and_commit(pages):
    result = load_result(RESULTS / "strategy.json")
    page = pages.page_markdown(result)
    assert f"```bash\n{result.command}\n```" in page
    assert f"**Machine:** {result.machine.cores} cores, {result.machine.cpu}" in page
    assert f"**Date:** {result.date}" in page and f"`{result.commit}`" in page
    index = pages.render_pages([result])["index.md"]
    assert "busbw = algbw * 2(N-1)/N" in index and "(strategy.md)" in index


# -- the schema ----------------------------------------------------------------------------


def test_a_result_is_written_as_the_schema_shows():
    data = json.loads(result_json(_result()))
    assert data["schema"] == 1 and data["machine"]["cores"] == 2
    assert data["tables"][0]["columns"][2] == {"name": "ours", "unit": "ms", "digits": 2}
    assert data["tables"][0]["rows"][1] == [2, "64 MiB", 20.0, None]


def test_a_result_file_round_trips(tmp_path):
    result = _result()
    (tmp_path / "demo.json").write_text(result_json(result))
    assert load_result(tmp_path / "demo.json") == result


@pytest.mark.parametrize(("change", "field"), [
    ({"commit": "main"}, "commit"),
    ({"date": "28.11.2026"}, "date"),
    ({"name": "Has Spaces"}, "name"),
    ({"command": ""}, "command"),
    ({"plots": (Plot(title="p", table=0, kind="bar", x=("N",), y=("nope",), ylabel="ms"),)},
     "no column 'nope'"),
    ({"plots": (Plot(title="p", table=3, kind="bar", x=("N",), y=("ours",), ylabel="ms"),)},
     "plot 'p'.table"),
])
def test_a_broken_field_is_named(change, field):
    with pytest.raises(ResultError, match=re.escape(field)):
        _result(**change)


def test_a_row_of_the_wrong_length_is_named():
    with pytest.raises(ResultError, match=r"table 'T' row 0: 1 cells for 2 columns"):
        Table(title="T", columns=(Column("a"), Column("b")), rows=((1,),))
    with pytest.raises(ResultError, match=r"machine.cores"):
        Machine(cores=0, cpu="c", memory_gib=None, os="o")
    with pytest.raises(ResultError, match=r"figure 'f'.unit"):
        Figure("f", 1.0, "furlongs")


def test_a_broken_file_is_named_with_its_path(tmp_path):
    data = json.loads(result_json(_result()))
    data["tables"][0]["rows"][0] = [2, "4 KiB"]
    (tmp_path / "demo.json").write_text(json.dumps(data))
    with pytest.raises(ResultError, match=r"demo.json: table 'T' row 0: 2 cells for 4"):
        load_result(tmp_path / "demo.json")
    data = json.loads(result_json(_result()))
    del data["machine"]
    (tmp_path / "demo.json").write_text(json.dumps(data))
    with pytest.raises(ResultError, match=r"demo.json: missing key 'machine'"):
        load_result(tmp_path / "demo.json")
    data = json.loads(result_json(_result()))
    data["colour"] = "blue"
    (tmp_path / "demo.json").write_text(json.dumps(data))
    with pytest.raises(ResultError, match=r"unknown keys \['colour'\]"):
        load_result(tmp_path / "demo.json")


def test_write_result_collects_this_machine_the_date_and_the_commit(tmp_path):
    table = _result().tables[0]
    written = write_result(tmp_path / "demo.json", name="demo", title="Demo", summary="s",
                           script="allreduce.py", argv=["--sizes", "4K", "--json", "a b.json"],
                           tables=[table])
    assert load_result(tmp_path / "demo.json") == written
    assert written.command == "uv run python bench/allreduce.py --sizes 4K --json 'a b.json'"
    assert written.machine == machine_here() and written.machine.cores == os.cpu_count()
    assert written.date == datetime.datetime.now(datetime.UTC).date().isoformat()
    assert re.fullmatch(r"[0-9a-f]{12}", written.commit)
    assert written.source.startswith("measured")


# -- the generator -------------------------------------------------------------------------


def test_cells_show_their_units_and_digits(pages):
    text = pages.table_markdown(_result().tables[0])
    assert text.splitlines()[0] == "| N | size | ours (ms) | x gloo |"
    assert "| 2 | 4 KiB | 0.50 | 2.00x |" in text and "| 2 | 64 MiB | 20.00 | - |" in text


def test_generate_writes_pages_and_plots_and_removes_stale_ones(pages, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "demo.json").write_text(result_json(_result()))
    out = tmp_path / "pages"
    out.mkdir()
    (out / "gone.md").write_text("old")
    (out / "gone-0.png").write_bytes(b"old")
    written = pages.generate(results, out)
    assert sorted(p.name for p in out.iterdir()) == ["demo-0.png", "demo.md", "index.md"]
    assert sorted(p.name for p in written) == ["demo-0.png", "demo.md", "index.md"]
    png = (out / "demo-0.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert _png_chunk_types(png) & {b"tIME", b"tEXt", b"iTXt"} == set()  # no dates, no software
    pages.generate(results, out)
    assert (out / "demo-0.png").read_bytes() == png  # same table, same bytes


def test_a_file_named_unlike_its_result_is_refused(pages, tmp_path):
    (tmp_path / "other.json").write_text(result_json(_result()))
    with pytest.raises(ResultError, match="rename one of them"):
        pages.load_results(tmp_path)


def _png_chunk_types(data: bytes) -> set[bytes]:
    types, i = set(), 8
    while i < len(data):
        length, kind = struct.unpack(">I4s", data[i:i + 8])
        types.add(kind)
        i += 12 + length
    return types


# -- the benches' tables -------------------------------------------------------------------


def test_allreduce_rows_become_a_table_of_the_schema():
    bench = _load("bench_allreduce", REPO / "bench" / "allreduce.py")
    rows = [{"n": 2, "bytes": 4096, "gloo_s": 0.002, "gloo_busbw": 0.002, "gloo_cpu": 976.5625,
             "gloo_thread_cpu": 732.421875, "shm_s": 0.001, "shm_busbw": 0.004,
             "shm_cpu": 48.828125, "shm_thread_cpu": 24.4140625, "shm_ratio": 2.0},
            {"n": 2, "bytes": 64 << 20, "gloo_s": None, "gloo_busbw": None, "shm_s": None}]
    table = bench.result_table(rows, ["shm"])
    assert [c.name for c in table.columns] == ["N", "cores/rank", "size", "gloo", "gloo busbw",
                                               "gloo CPU", "gloo thread CPU", "shm",
                                               "shm busbw", "shm CPU", "shm thread CPU",
                                               "shm x gloo"]
    assert table.columns[table.column("shm CPU")].unit == "ns/B"
    assert table.columns[table.column("shm thread CPU")].unit == "ns/B"
    here = round((os.cpu_count() or 1) / 2, 2)
    assert table.rows == ((2, here, "4 KiB", 2.0, 0.0, 976.5625, 732.4219, 1.0, 0.0, 48.8281,
                           24.4141, 2.0),
                          (2, here, "64 MiB", None, None, None, None, None, None, None, None,
                           None))
    assert bench.per_byte(0.004, 4096) == pytest.approx(976.5625)
    assert bench.per_byte(None, 4096) is None
    assert bench.result_figures(rows[:1], ["shm"]) == [Figure("shm 4 KiB N=2", 2.0, "x")]
    _result(tables=(table,), plots=tuple(bench.result_plots(["shm"])))  # the plot fits


def test_the_benches_name_the_machine_and_its_cores_per_rank():
    here = machine_here()
    line = machine_line([2, 4])
    assert line.startswith(f"machine: {here.cores} cores, {here.cpu}")
    assert line.endswith(f"cores per rank: {cores_per_rank(2):g} at N=2, "
                         f"{cores_per_rank(4):g} at N=4")
    assert [cores_per_rank(n, cores=2) for n in (1, 2, 4)] == [2.0, 1.0, 0.5]
    assert [cores_per_rank(n, cores=16) for n in (2, 3, 8)] == [8.0, 5.33, 2.0]
    torch_ddp = _load("bench_torch_ddp", REPO / "bench" / "torch_ddp.py")
    row = {"n": 4, "model": "1M", "step_ms": 10.0, "compute_ms": 8.0, "comm_ms": 2.0,
           "cpu_step_ms": 9.0, "cpu_compute_ms": 7.0, "system": "DDP gloo", "steps_per_s": 6.0}
    table = torch_ddp.result_table([row])
    assert table.rows[0][table.column("cores/rank")] == cores_per_rank(4)


def test_strategy_rows_become_one_row_per_case_with_both_paths():
    bench = _load("bench_strategy", REPO / "bench" / "strategy.py")
    case = f"all_reduce:{64 << 20}"
    common = {"n": 2, "case": case, "bytes": 64 << 20, "gloo_s": 0.05, "buckets_s": None,
              "gloo_cpu_s": 0.075, "x_with_step": None, "x_buckets": None}
    rows = [{**common, "path": "shm", "ours_s": 0.02, "ours_cpu_s": 0.038, "x_gloo": 2.5},
            {**common, "path": "network", "ours_s": 0.04, "ours_cpu_s": None,
             "x_gloo": 1.25}]
    table = bench.result_table(rows)
    assert len(table.rows) == 1
    cells = dict(zip((c.name for c in table.columns), table.rows[0], strict=True))
    assert cells["case"] == "all_reduce 64 MiB"
    assert (cells["shm"], cells["network"], cells["gloo/DDP"]) == (20.0, 40.0, 50.0)
    assert (cells["shm x gloo"], cells["network x gloo"]) == (2.5, 1.25)
    assert (cells["cores busy shm"], cells["cores busy network"]) == (1.9, None)
    assert cells["cores busy gloo"] == 1.5
    assert [dataclasses.astuple(f) for f in bench.result_figures(rows)] == [
        ("shm all_reduce 64 MiB N=2", 2.5, "x"), ("network all_reduce 64 MiB N=2", 1.25, "x")]


def test_torch_ddp_rows_become_a_table_with_x_ddp():
    bench = _load("bench_torch_ddp", REPO / "bench" / "torch_ddp.py")
    common = {"n": 2, "model": "1M", "step_ms": 10.0, "compute_ms": 8.0, "comm_ms": 2.0,
              "cpu_step_ms": 9.0, "cpu_compute_ms": 7.0}
    rows = [{**common, "system": "ours shm", "steps_per_s": 75.0},
            {**common, "system": "DDP gloo", "steps_per_s": 60.0}]
    table = bench.result_table(rows)
    x = table.column("x DDP")
    assert [row[x] for row in table.rows] == [1.25, 1.0]
    assert bench.result_figures(rows) == [Figure("ours shm 1M N=2", 1.25, "x")]


def test_scale_rows_keep_numbers_as_numbers_and_spreads_as_printed():
    bench = _load("bench_scale", REPO / "bench" / "scale.py")
    row = {"N": "8", "spawn s": "0.05", "interp s": "4.3", "joined s": "4.6",
           "1st coll s": "4.7", "beyond s": "0.4", "4 KiB ms": "1.30",
           "threads task": "12 (14)", "threads coord": "16", "fds task": "15",
           "fds coord": "22", "RSS MiB task": "66", "RSS MiB coord": "68",
           "detect s": "0.07 / 0.09", "exit s": "1.00", "load before": "3.1"}
    table = bench.result_table([row, {**row, "N": "16", "interp s": "-", "beyond s": "-"}])
    cells = dict(zip((c.name for c in table.columns), table.rows[0], strict=True))
    assert cells["N"] == 8 and cells["threads task"] == "12 (14)" and cells["4 KiB"] == 1.3
    assert cells["detect median / max"] == "0.07 / 0.09"
    assert table.rows[1][table.column("interp")] is None
    assert bench.result_figures([row]) == [Figure("beyond at N=8", 0.4, "s"),
                                           Figure("RSS task at N=8", 66, "MiB")]


def test_ps_rows_become_tables_with_x_echo():
    bench = _load("bench_ps", REPO / "bench" / "ps.py")
    size = 16 << 20
    transfer = [{"server": "ps x1", "bytes": size, "pull_s": 0.02, "push_s": 0.025,
                 "pull_mbps": 838.9, "push_mbps": 671.1},
                {"server": "gRPC echo", "bytes": size, "pull_s": 0.018, "push_s": 0.02,
                 "pull_mbps": 932.1, "push_mbps": 838.9}]
    table = bench.transfer_table(transfer)
    assert table.rows[0] == ("ps x1", "16 MiB", 20.0, 839, 25.0, 671, 0.9, 0.8)
    assert table.rows[1][-2:] == (1.0, 1.0)
    assert bench.transfer_figures(transfer) == [Figure("ps x1 pull 16 MiB", 0.9, "x"),
                                                Figure("ps x1 push 16 MiB", 0.8, "x")]
    train = bench.train_table([{"workers": 2, "mode": "sync", "steps_per_s": 50.0,
                                "updates_per_s": 25.0, "mbps": 104.9}])
    assert train.rows == ((2, "sync", 50.0, 20.0, 25.0, 105),)


def test_tcp_tls_runs_become_the_best_round_trips():
    bench = _load("bench_tcp_tls", REPO / "bench" / "tcp_tls.py")
    big = 64 << 20
    runs = {"plain": [{4096: 2e-4, big: 0.2}, {4096: 1e-4, big: 0.1}],
            "tls": [{4096: 3e-4, big: 0.4}, {4096: 4e-4, big: 0.5}]}
    table = bench.result_table([4096, big], runs)
    assert table.rows[0] == ("4 KiB", 0.1, 0.3, None, None, 3.0)
    assert table.rows[1] == ("64 MiB", 100.0, 400.0, 1.34, 0.34, 4.0)


def test_checkpoint_rows_keep_dd_ratios_and_what_a_restore_read():
    bench = _load("bench_checkpoint", REPO / "bench" / "checkpoint.py")
    size = 64 << 20
    results = {"cluster.checkpoint": (0.2, 0.1, (1, size), True),
               "zarr": None, "dd": (0.1, 0.05, (1, size), False)}
    table = bench.result_table([(size, results)], ["cluster.checkpoint", "zarr", "dd"])
    assert table.rows[0] == ("64 MiB", "cluster.checkpoint", 0.2, 0.34, 2.0, 0.1, 0.67, 2.0,
                             "disk", 1, 64.0)
    assert table.rows[1][2:] == (None,) * 9  # not installed
    assert table.rows[2][8] == "page cache"
    assert bench.result_figures(table) == [
        Figure("cluster.checkpoint save 64 MiB / dd", 2.0, "x"),
        Figure("cluster.checkpoint restore 64 MiB / dd", 2.0, "x")]
