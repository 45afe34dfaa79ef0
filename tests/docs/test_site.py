"""The documentation site builds with ``mkdocs build --strict``: every page of ``docs/`` is in the
nav, every link and anchor resolves, and mkdocstrings renders the API reference from the
docstrings, all without a single warning (``--strict`` turns warnings into a failed build).

Measured on 2 shared cores: about 10 s on a quiet machine, up to about 50 s under load (most of
it griffe reading the packages for the reference pages).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

INSTALL = 'uv pip install "mkdocs>=1.6" "mkdocs-material>=9.5" "mkdocstrings[python]>=0.27"'
BUILD_TIMEOUT = 240  # seconds; a build that takes longer is a failure, not a hang

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 30)


def _missing() -> list[str]:
    modules = {"mkdocs": "mkdocs", "material": "mkdocs-material",
               "mkdocstrings_handlers.python": "mkdocstrings[python]"}
    missing = []
    for module, package in modules.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is absent
            found = False
        if not found:
            missing.append(package)
    return missing


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    missing = _missing()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: {INSTALL}")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
         "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    return out


def test_the_site_builds_without_a_warning(site: Path) -> None:
    for page in ("index.html", "guide/install/index.html", "design/layering/index.html",
                 "benchmarks/index.html"):
        assert (site / page).is_file(), page


@pytest.mark.parametrize(("page", "names"), [
    ("cluster", ["cluster.MultiWorkerMirroredStrategy", "cluster.Variable"]),
    ("cluster.checkpoint", ["cluster.checkpoint.CheckpointManager",
                            "cluster.checkpoint.PreemptionCheckpointHandler"]),
    ("cluster.optimizers", ["cluster.optimizers.Adam", "cluster.optimizers.SGD"]),
    ("cluster.coordinator", ["cluster.coordinator.ClusterCoordinator"]),
    ("cluster.torch", ["cluster.torch.DistributedGradients"]),
    ("cluster.jax", ["cluster.jax.all_reduce_tree"]),
    ("cluster.collectives", ["cluster.collectives.CollectiveGroup"]),
    ("resolver", ["resolver.TFConfigClusterResolver", "resolver.ClusterSpec"]),
])
def test_the_reference_renders_each_public_module(site: Path, page: str, names: list[str]) -> None:
    html = (site / "reference" / page / "index.html").read_text()
    for name in names:
        assert f'id="{name}"' in html, f"{name} is missing from reference/{page}"
