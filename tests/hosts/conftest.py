"""The emulated-host tests: root only (the ``netns_hosts`` fixture skips elsewhere, with the
reason), and never in CI, where their timings (a partition must stop every task within 5 s)
would depend on a shared runner's load: run them by hand, ``sudo uv run pytest tests/hosts``,
and under load with ``tools/load_runs.sh``."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items) -> None:
    if not os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason="emulated-host tests are not run in CI (CI is set): "
                                   "run tests/hosts by hand as root")
    for item in items:
        if item.nodeid.startswith("tests/hosts/"):
            item.add_marker(skip)
