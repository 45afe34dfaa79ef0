"""The cluster file's resources: section: validated like every other key (file, line, key,
hint), known to clusterctl validate, ignored by launch. No process is started."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cluster.ctl.cli import main
from cluster.ctl.spec import parse_cluster_file
from cluster.errors import ClusterFileError

pytestmark = pytest.mark.timeout(30)

HEAD = "entrypoint: train.py\ncluster: {chief: 1, worker: 2}\n"


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "cluster.yaml"
    path.write_text(HEAD + textwrap.dedent(text))
    return path


def test_valid_resources_are_kept_as_quantity_text(tmp_path, capsys) -> None:
    path = write(tmp_path, """\
        resources:
          worker: {cpu: 2, memory: 4Gi, nvidia.com/gpu: 1, ephemeral-storage: 10G}
          chief: {cpu: 0.5, memory: 1e9}
          evaluator: {cpu: 250m}
        """)
    spec = parse_cluster_file(path.read_text(), path)
    assert spec.resources == {
        "worker": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1",
                   "ephemeral-storage": "10G"},
        "chief": {"cpu": "0.5", "memory": "1e9"},
        "evaluator": {"cpu": "250m"},  # a job with no tasks: allowed, unused
    }
    assert main(["validate", str(path)]) == 0
    assert "OK" in capsys.readouterr().out


BAD = [
    # (resources text, line, expected, hint)
    ("resources: {worker: {gpu: 1}}\n", 3, "resources.worker.gpu: unknown resource 'gpu'",
     'did you mean "nvidia.com/gpu"?'),
    ("resources:\n  worker:\n    memroy: 4Gi\n", 5, "resources.worker.memroy: unknown resource",
     'did you mean "memory"?'),
    ("resources:\n  worker:\n    disk_io: 4\n", 5, "unknown resource 'disk_io'",
     "known: cpu, memory, ephemeral-storage, nvidia.com/gpu, amd.com/gpu"),
    ("resources:\n  workers: {cpu: 1}\n", 4, "resources.workers: unknown key 'workers'",
     'did you mean "worker"?'),
    ("resources:\n  worker:\n    memory: 4GB\n", 5,
     "resources.worker.memory: '4GB' is not a Kubernetes quantity", "binary units are Ki"),
    ("resources:\n  worker:\n    cpu: two\n", 5, "'two' is not a Kubernetes quantity",
     "a number with an optional unit"),
    ("resources:\n  worker:\n    cpu: -1\n", 5, "'-1' is not a Kubernetes quantity", ""),
    ("resources:\n  worker:\n    cpu: 0\n", 5, "resources.worker.cpu: must be more than 0",
     "leave the resource out"),
    ("resources:\n  worker:\n    memory: 512m\n", 5, "thousandths of a byte",
     'did you mean "512Mi"?'),
    ("resources:\n  worker:\n    nvidia.com/gpu: 0.5\n", 5, "nvidia.com/gpu counts whole devices",
     "whole number"),
    ("resources:\n  worker:\n    cpu: true\n", 5, "expected a quantity, got a boolean", ""),
    ("resources:\n  worker: 2\n", 4, "resources.worker: expected a mapping of resources",
     "nvidia.com/gpu: 1"),
    ("resources: [cpu]\n", 3, "resources: expected a mapping of job names", ""),
    ("resource: {worker: {cpu: 1}}\n", 3, "resource: unknown key 'resource'",
     'did you mean "resources"?'),
]


@pytest.mark.parametrize(("text", "line", "expected", "hint"), BAD)
@pytest.mark.parametrize("command", ["validate", "render"])
def test_bad_resources_exit_2_naming_file_line_key_and_hint(tmp_path, capsys, text, line,
                                                            expected, hint, command) -> None:
    path = write(tmp_path, text)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: " in err and expected in err, err
    hints = [t for t in err.splitlines() if t.strip().startswith("hint:")]
    assert not hint or any(hint in t for t in hints), err


def test_every_bad_resource_is_reported(tmp_path) -> None:
    path = write(tmp_path, "resources:\n  worker: {cpu: x, gpu: 1}\n  ps: {memory: 1Q}\n")
    with pytest.raises(ClusterFileError) as info:
        parse_cluster_file(path.read_text(), path)
    assert [(p.line, p.key) for p in info.value.problems] == [
        (4, "resources.worker.cpu"), (4, "resources.worker.gpu"), (5, "resources.ps.memory")]
