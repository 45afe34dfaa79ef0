"""Packaging of the command line: ``--version``; ``--help`` imports neither grpc nor numpy
(nor a YAML parser), so it answers at once; no arguments exit 2 with usage; ``import cluster``
is lazy too. Speed itself is bench material: here the imports that would cost it are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version

import pytest

from cluster.ctl import cli
from tests.conftest import REPO
from tests.ctl._cli_run import run_cli

pytestmark = pytest.mark.timeout(60)

ENV = {**os.environ, "PYTHONPATH": str(REPO)}  # this tree's code, whatever cwd holds
HEAVY = ("grpc", "numpy", "yaml", "cluster.ctl.launcher", "cluster.ctl.spec",
         "cluster.collectives", "cluster.runtime")

_PROBE = """
import json, sys
from cluster.ctl import cli
try:
    cli.main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps([code, [m for m in {heavy!r} if m in sys.modules]]))
"""


@pytest.mark.parametrize("argv", [["--help"], ["launch", "--help"], ["render", "--help"],
                                  ["--version"]])
def test_help_and_version_import_nothing_heavy(tmp_path, argv) -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *argv],
                          capture_output=True, text=True, timeout=30, cwd=tmp_path, env=ENV)
    code, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert code == 0, proc.stderr
    assert loaded == [], f"{argv} imported {loaded}"


def test_version_is_the_installed_distributions(tmp_path) -> None:
    proc = run_cli(["--version"], cwd=tmp_path, timeout=30)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"clusterctl {version('cluster-runtime')}"


def test_no_arguments_print_usage_and_exit_2(tmp_path) -> None:
    proc = run_cli([], cwd=tmp_path, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: clusterctl")
    assert "clusterctl launch -n 2 train.py" in proc.stderr


def test_the_help_texts_copies_of_render_names_match_render() -> None:
    from cluster.ctl import render
    from cluster.ctl.render.tf_config import PORT_BASE

    assert cli.RENDER_FORMATS == tuple(render.FORMATS)
    assert cli.RENDER_PORT_BASE == PORT_BASE
    assert cli.RENDER_DEFAULT_IMAGE == render.DEFAULT_IMAGE
    assert cli.RENDER_DEFAULT_NAMESPACE == render.DEFAULT_NAMESPACE


def test_import_cluster_is_lazy_and_every_public_name_resolves(tmp_path) -> None:
    probe = ("import json, sys, cluster\nbefore = [m for m in ('grpc', 'numpy') if m in "
             "sys.modules]\nnames = [n for n in cluster.__all__ if getattr(cluster, n) is None]"
             "\nprint(json.dumps([before, names, sorted(set(cluster.__all__) - set(dir(cluster)))"
             "]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=ENV)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[], [], []], proc.stderr
    import cluster

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        cluster.NoSuchThing  # noqa: B018
