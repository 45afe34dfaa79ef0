"""tests/_schedule.py: which tests share an xdist worker, and the order groups are handed out."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import _schedule

_WORKER = SimpleNamespace(workerinput={"workerid": "gw0"})
"""The config of an xdist worker, as far as the plugin reads it."""


class _Item:
    """What the plugin reads of a collected test: its node id, fixtures and markers."""

    def __init__(self, nodeid: str, *fixtures: str) -> None:
        self.nodeid = nodeid
        self.fixturenames = list(fixtures)
        self.groups: list[str] = []

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        assert mark.name == "xdist_group"
        self.groups.append(mark.args[0])


def _order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: dict[str, float],
           items: list[_Item]) -> list[str]:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps(recorded))
    monkeypatch.setattr(_schedule, "DURATIONS", path)
    _schedule.pytest_collection_modifyitems(_WORKER, items)  # type: ignore[arg-type]
    return [i.nodeid for i in items]


def test_shared_session_fixtures_make_one_group_and_other_tests_group_by_file() -> None:
    assert _schedule.group_of(_Item("tests/docs/a.py::t", "tmp_path", "example_runs")) \
        == "examples"
    assert _schedule.group_of(_Item("tests/examples/b.py::t[x]", "example_runs")) == "examples"
    assert _schedule.group_of(_Item("tests/slurm/c.py::t", "slurm", "marker")) == "slurm"
    assert _schedule.group_of(_Item("tests/x/d.py::Cls::t[a::b]", "marker")) == "tests/x/d.py"


def test_groups_start_longest_first_and_keep_their_order_inside(tmp_path, monkeypatch) -> None:
    items = [_Item("tests/a.py::t1"), _Item("tests/b.py::t1", "example_runs"),
             _Item("tests/a.py::t2"), _Item("tests/c.py::t1"), _Item("tests/d.py::t1",
                                                                     "example_runs")]
    order = _order(tmp_path, monkeypatch, {"tests/a.py": 5.0, "tests/b.py": 4.0,
                                           "tests/c.py": 20.0, "tests/d.py": 3.0}, items)
    # c (20 s), then the examples group (b + d: 7 s), then a (5 s)
    assert order == ["tests/c.py::t1", "tests/b.py::t1", "tests/d.py::t1", "tests/a.py::t1",
                     "tests/a.py::t2"]
    assert [i.groups for i in items] == [["tests/c.py"], ["examples"], ["examples"],
                                         ["tests/a.py"], ["tests/a.py"]]


def test_a_file_not_recorded_counts_as_the_mean(tmp_path, monkeypatch) -> None:
    items = [_Item("tests/short.py::t"), _Item("tests/new.py::t"), _Item("tests/long.py::t")]
    order = _order(tmp_path, monkeypatch, {"tests/short.py": 1.0, "tests/long.py": 9.0}, items)
    assert order == ["tests/long.py::t", "tests/new.py::t", "tests/short.py::t"]


def test_no_record_keeps_the_collection_order(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_schedule, "DURATIONS", tmp_path / "missing.json")
    items = [_Item("tests/b.py::t"), _Item("tests/a.py::t"), _Item("tests/b.py::u")]
    _schedule.pytest_collection_modifyitems(_WORKER, items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["tests/b.py::t", "tests/b.py::u", "tests/a.py::t"]


def test_one_process_keeps_the_files_order(tmp_path, monkeypatch) -> None:
    items = [_Item("tests/short.py::t"), _Item("tests/long.py::t")]
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/short.py": 1.0, "tests/long.py": 9.0}))
    monkeypatch.setattr(_schedule, "DURATIONS", path)
    _schedule.pytest_collection_modifyitems(SimpleNamespace(), items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["tests/short.py::t", "tests/long.py::t"]
    assert [i.groups for i in items] == [[], []]



@pytest.mark.parametrize(("cores", "gib", "workers"), [
    (2, 24.0, 2),  # this VM and CI: a worker per core
    (16, 128.0, 4),  # a server: capped, each test starts processes of its own
    (8, 7.9, 1),  # a laptop short of memory: one Keras cluster at a time
    (8, 12.0, 3),
    (1, 64.0, 1),
    (4, 0.5, 1),  # never none
])
def test_auto_workers_follow_cores_and_memory(cores, gib, workers) -> None:
    assert _schedule.auto_workers(cores, gib) == workers


def test_xdist_asks_the_plugin_for_the_count() -> None:
    count = _schedule.pytest_xdist_auto_num_workers(SimpleNamespace())  # type: ignore[arg-type]
    assert 1 <= count <= _schedule.MAX_WORKERS
