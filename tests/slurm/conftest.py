"""The session's local Slurm (cluster.testing.slurm): started once, for every test here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.testing.slurm import LocalSlurm, local_slurm, unavailable


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """Two Slurm nodes on this machine; skipped, with the reason, where Slurm or root is
    missing (CI installs Slurm: see .ci/run)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with local_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
