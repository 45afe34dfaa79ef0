"""``bench/elastic.py``: the times it derives from its tasks' lines (pure, table-tested), its
table and figures keep the result schema, a task that fails ends the bench naming it, and one
``--quick`` run (N=4 on this host, 1 repeat) kills a worker, sees the survivors train in a group
of 3 and the replacement in a group of 4, restarts the whole job from its checkpoint, and writes
a result file. Speed is the benchmark's business, never asserted here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench._elastic_job import (
    BenchError,
    TrainArgs,
    local_site,
    measure_elastic,
    netns_site,
    task_names,
)
from bench._elastic_steps import (
    Step,
    TaskLog,
    first_step,
    join_pause,
    median,
    parse,
    recovery,
    step_seconds,
)
from bench.record import Result, load_result, machine_here

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "elastic.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_elastic", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _log(*steps: tuple[int, float, int], imported: float | None = None) -> TaskLog:
    return TaskLog(imported, tuple(Step(*s) for s in steps))


# -- the arithmetic --------------------------------------------------------------------------


def test_task_lines_are_parsed_and_other_lines_ignored():
    output = ("IMPORTED 100.250000\nINFO something\nSTEP 1 101.000000 n=4\n"
              "[worker:1] STEP 9 1.0 n=4\nSTEP 2 101.100000 n=3\n")
    assert parse(output) == _log((1, 101.0, 4), (2, 101.1, 3), imported=100.25)
    assert parse("STEP 1 5.5 n=2\n").imported is None


def test_recovery_counts_only_steps_of_the_new_group():
    # worker A printed step 7 (of the old group of 4) just after the kill at t=10: not counted
    a = _log((6, 9.9, 4), (7, 10.05, 4), (8, 10.6, 3), (9, 10.7, 3))
    b = _log((7, 9.95, 4), (8, 10.4, 3))
    assert recovery([a, b], 10.0, 3) == pytest.approx(0.6)  # the slowest survivor
    assert recovery([a, b], 10.0) == pytest.approx(0.4)  # any step: A's old one at 10.05
    assert first_step(a, 10.0, 3) == Step(8, 10.6, 3)
    with pytest.raises(ValueError, match="no step after 10.700 with 3 replicas"):
        recovery([a], 10.7, 3)
    with pytest.raises(ValueError, match="no task logs"):
        recovery([], 1.0)


def test_join_pause_is_the_longest_gap_before_the_grown_groups_first_step():
    a = _log((10, 20.0, 3), (11, 20.1, 3), (12, 20.9, 4))
    b = _log((10, 20.0, 3), (11, 20.3, 3), (12, 20.8, 4), (13, 20.9, 4))
    assert join_pause([a, b], 19.5, 4) == pytest.approx(0.8)  # a: 20.1 -> 20.9
    with pytest.raises(ValueError, match="no step with 5 replicas"):
        join_pause([a], 19.5, 5)


def test_step_seconds_is_the_median_gap_before_a_time():
    log = _log((1, 1.0, 2), (2, 1.1, 2), (3, 1.3, 2), (4, 1.4, 2), (5, 9.0, 2))
    assert step_seconds(log, before=2.0) == pytest.approx(0.1)
    assert step_seconds(log, before=1.05) is None
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0]) == 2.5


# -- where the tasks run ---------------------------------------------------------------------


class _Host:
    def __init__(self, name: str) -> None:
        self.name = name

    def command(self, argv, *, cwd=None):
        return ["on", self.name, *argv]


class _Hosts:
    def __init__(self, *names: str) -> None:
        self.hosts = {name: _Host(name) for name in names}

    def __getitem__(self, name: str) -> _Host:
        return self.hosts[name]


def test_sites_place_a_chief_and_workers_and_the_service_apart():
    assert task_names(4) == ["chief:0", "worker:0", "worker:1", "worker:2"]
    site = netns_site(_Hosts("h1", "h2"), 4)
    assert site.addresses == {"chief:0": "h1:2222", "worker:0": "h1:2223",
                              "worker:1": "h2:2222", "worker:2": "h2:2223"}
    assert site.service == "h1:2221" and site.name == "2 hosts"
    assert site.cluster == {"chief": ["h1:2222"], "worker": ["h1:2223", "h2:2222", "h2:2223"]}
    assert site.command("worker:1", ["python"]) == ["on", "h2", "python"]
    here = local_site(3)
    addresses = [*here.addresses.values(), here.service]
    assert here.tasks == task_names(3) and len(set(addresses)) == 4
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert here.command("chief:0", ["python"]) == ["python"]


# -- the table -------------------------------------------------------------------------------


def test_rows_become_a_table_and_figures_of_the_schema():
    bench = _load_bench()
    elastic = [{"recovery": 0.3, "join_start": 4.0, "join_imported": 0.6, "join_pause": 0.4,
                "step": 0.08},
               {"recovery": 0.5, "join_start": 6.0, "join_imported": None, "join_pause": 0.2,
                "step": 0.1}]
    restart = [{"restart": 8.0, "stopped": 1.0, "step": 0.09}]
    row = bench.case_row(4, 2, elastic, restart)
    table = bench.result_table([row], notes="n")
    cells = dict(zip((c.name for c in table.columns), table.rows[0], strict=True))
    assert (cells["N"], cells["hosts"], cells["repeats"], cells["step"]) == (4, 2, 2, 90.0)
    assert cells["survivors' next step"] == 0.4 and cells["replacement from start"] == 5.0
    assert cells["from imports"] == 0.6  # the repeat without an IMPORTED line is left out
    assert (cells["whole restart"], cells["survivors x restart"]) == (8.0, 20.0)
    assert [(f.label, f.value, f.unit) for f in bench.result_figures(table)] == [
        ("survivors' next step N=4, 2 hosts", 0.4, "s"), ("x restart N=4, 2 hosts", 20.0, "x")]
    empty = bench.case_row(8, 1, elastic, [])
    assert empty[-3:] == (None, None, None)
    Result(name="elastic", title=bench.TITLE, summary=bench.SUMMARY, command="uv run x",
           machine=machine_here(), date="2026-01-01", commit="abcdef1", source="measured",
           tables=(table,), figures=tuple(bench.result_figures(table)))
    assert "| 4 | 2 | " in bench.markdown(table)


# -- real runs -------------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_failing_task_ends_the_bench_naming_it(monkeypatch, marker):
    monkeypatch.setenv("CLUSTER_TEST_MARKER", marker)
    with pytest.raises(BenchError, match=r"elastic, N=3, 1 host: chief:0: output ended"):
        measure_elastic(local_site(3), 1, TrainArgs(step_time=-1.0), timeout=120)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_quick_run_measures_survivors_replacement_and_restart(tmp_path, capsys, monkeypatch,
                                                               marker):
    monkeypatch.setenv("CLUSTER_TEST_MARKER", marker)
    bench = _load_bench()
    assert bench.main(["--quick", "--timeout", "120", "--json",
                       str(tmp_path / "elastic.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ") and "load average" in out.splitlines()[0]
    saved = load_result(tmp_path / "elastic.json")
    assert saved.name == "elastic" and saved.source.startswith("measured")
    assert saved.command == ("uv run python bench/elastic.py --quick --timeout 120 --json "
                             + str(tmp_path / "elastic.json"))
    (table,) = saved.tables
    assert len(table.rows) == 1
    cells = dict(zip((c.name for c in table.columns), table.rows[0], strict=True))
    assert (cells["N"], cells["hosts"], cells["repeats"]) == (4, 1, 1)
    for name in ("step", "survivors' next step", "replacement from start", "from imports",
                 "members' pause", "whole restart", "old job stopped", "survivors x restart"):
        assert cells[name] is not None and cells[name] > 0, name
    # the replacement's start includes its imports; a restart includes a process start
    assert cells["replacement from start"] > cells["from imports"]
    assert cells["whole restart"] > cells["old job stopped"]
    assert [f.label for f in saved.figures] == ["survivors' next step N=4", "x restart N=4"]
