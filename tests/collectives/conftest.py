"""Every collective test runs on both paths, unless marked ``network_path`` (it checks something
only the network path has: its algorithms, message texts, a fake transport) or ``shm_path``, or
the whole module is ``path_independent`` (no collective groups: schedules, options, NCCL):

- ``shm``: the default, co-located ranks (all ranks here) use shared memory; ``make_groups``
  gives them 1 KiB rounds, so modest sizes exercise many rounds and both algorithms;
- ``network``: ``CollectiveSettings(path=NETWORK)`` for groups built in the test (and
  ``CLUSTER_COLLECTIVE_PATH=network`` for tasks it spawns), the gRPC/TCP path for everything.
"""

from __future__ import annotations

import pytest

from cluster.collectives.options import PATH_ENV, CollectivePath, CollectiveSettings
from tests._fakegpu import fake_gpu  # noqa: F401  (a fixture: tasks on the fake GPU machine)

from . import _threads

PATHS = ("shm", "network")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "collective_path" in metafunc.fixturenames:
        marked = metafunc.definition.get_closest_marker
        paths = [p for p in PATHS if not marked(f"{_other(p)}_path")]
        if marked("path_independent"):
            paths = ["network"]
        metafunc.parametrize("collective_path", paths, indirect=True)


def _other(path: str) -> str:
    return "network" if path == "shm" else "shm"


@pytest.fixture(autouse=True)
def collective_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The path this test runs on (set before the test builds its groups)."""
    path = getattr(request, "param", "network")
    if path == "network":
        # Groups built here get the settings; tasks spawned by the test read the environment.
        monkeypatch.setenv(PATH_ENV, "network")
        monkeypatch.setattr(_threads, "GROUP_DEFAULTS",
                            {"settings": CollectiveSettings(path=CollectivePath.NETWORK)})
    else:
        monkeypatch.delenv(PATH_ENV, raising=False)
        monkeypatch.setattr(_threads, "GROUP_DEFAULTS",
                            {"shm_round_bytes": 1024, "shm_whole_bytes": 256})
    return path
