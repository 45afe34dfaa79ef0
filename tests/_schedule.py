"""How ``uv run pytest`` spreads the suite over the machine's cores (pytest-xdist).

``uv run pytest`` runs the suite on worker processes (``-n auto --dist loadgroup`` are in
``pyproject.toml``'s options): one per core, at most :data:`MAX_WORKERS`, and one per
:data:`GIB_PER_WORKER` of available memory, since one test may start a cluster of Keras
processes. ``-n 0`` runs it in one process, in the files' order, where this plugin only
answers that count. A worker takes whole groups, and a test's group is:

- ``examples`` for every test that reads a documented example run (the ``example_runs``
  fixture, ``tests/_examples.py``): the runs are made once per session, and a session is one
  worker's, so their readers share one;
- ``slurm`` for every test of the local Slurm (the ``slurm`` fixture, ``tests/slurm``): started
  once per session as well, and it edits ``/etc/hosts``;
- otherwise the test's file, so that a module-scoped fixture (a trained model, a site build) is
  made once.

Groups are handed out longest first, by the seconds each file took when they were last
recorded (``tests/durations.json``), so that no long group starts last and runs alone at the
end. A file not recorded counts as the recorded files' mean. ``pytest --record-durations``
rewrites the file from the run (the seconds of every phase of every test, per file); only the
order depends on it, never what runs.

Registered as a plugin by ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

__all__ = ["DURATIONS", "GIB_PER_WORKER", "MAX_WORKERS", "auto_workers", "group_of"]

MAX_WORKERS = 4
"""Workers ``-n auto`` starts at most: the end-to-end tests start several processes each, so a
worker per core of a big machine would crowd it, not finish sooner."""

GIB_PER_WORKER = 4
"""Available memory per worker: a Keras test's cluster takes about 2 GiB (four processes of
about 450 MiB), and the other worker's test may take as much."""

DURATIONS = Path(__file__).with_name("durations.json")

_SHARED_FIXTURES = {"example_runs": "examples", "slurm": "slurm"}
"""Session-scoped fixtures whose users must run on one worker, and the group they make."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true", default=False,
                     help=f"write each test file's seconds in this run to {DURATIONS.name} "
                          "(the order parallel runs hand groups out in)")


def auto_workers(cores: int, available_gib: float) -> int:
    """How many workers ``-n auto`` starts on a machine with ``cores`` and that much memory
    available: one per core and per :data:`GIB_PER_WORKER`, at least 1, at most
    :data:`MAX_WORKERS`."""
    return max(1, min(cores, int(available_gib // GIB_PER_WORKER), MAX_WORKERS))


def _available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return float(GIB_PER_WORKER * MAX_WORKERS)  # not Linux: the cores decide


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return auto_workers(cores or 1, _available_gib())


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def group_of(item: pytest.Item) -> str:
    """The xdist group of ``item`` (see the module doc)."""
    for fixture, group in _SHARED_FIXTURES.items():
        if fixture in item.fixturenames:
            return group
    return _file(item.nodeid)


def _recorded() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


@pytest.hookimpl(tryfirst=True)  # before xdist appends the group to each node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: one process, the file order
        return
    seconds = _recorded()
    unknown = sum(seconds.values()) / len(seconds) if seconds else 0.0
    groups: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        group = group_of(item)
        item.add_marker(pytest.mark.xdist_group(group))
        groups[group].append(item)
    weight = {group: sum(seconds.get(f, unknown) for f in {_file(i.nodeid) for i in members})
              for group, members in groups.items()}
    # sorted() is stable: groups of equal weight keep the collection's order.
    items[:] = [item for group in sorted(groups, key=lambda g: -weight[g])
                for item in groups[group]]


class _Recorder:
    """Sums the reports' durations per file on the process that sees every report (the xdist
    controller, or the only process) and writes them when the session ends."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_file(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        merged = _recorded() | {f: round(s, 1) for f, s in self.seconds.items()}
        repo = DURATIONS.parents[1]
        merged = {f: s for f, s in merged.items() if (repo / f).is_file()}  # files gone: out
        DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    worker = hasattr(config, "workerinput")  # an xdist worker: its controller records
    if config.getoption("record_durations") and not worker:
        config.pluginmanager.register(_Recorder(), "cluster-durations")
