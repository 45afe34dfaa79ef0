"""The layering rules of the repository, checked on the source with ``ast`` (nothing is imported).

Layers, top to bottom; a module imports only from its own layer or below:

1. user code (``train.py``) and ``clusterctl`` (``cluster/ctl/``, the command line that starts
   processes with ``TF_CONFIG``);
2. the process entry points ``worker/`` (``python -m worker``) and ``ps/`` (``python -m ps``), with
   their gRPC servicers;
3. ``cluster/``: strategies, variables, optimizers, data, checkpoints, the coordinator,
   collectives and the transport (gRPC, auth, deadlines, health);
4. ``resolver/``: ``TF_CONFIG`` / Slurm / explicit specs to a cluster spec and a task.

The rules:

- ``resolver/`` imports the standard library only (and itself).
- ``cluster/`` never imports ``worker/`` or ``ps/``.
- The environment (``os.environ``, ``os.getenv``/``putenv``/``environb``) is read only by
  ``cluster/settings.py`` (``TaskSettings``, the one reader of the ``CLUSTER_*`` variables below
  the entry points), by the entry points (``worker/``, ``ps/``, ``cluster/testing/`` for the
  processes it spawns, ``cluster/ctl/``) and by ``resolver/``, which reads ``TF_CONFIG`` and
  Slurm's variables whenever a method is called, as TensorFlow's resolvers do. Everything else
  receives settings as arguments or asks ``cluster.settings.current()``.
- ``grpc`` is imported only by ``cluster/transport/`` and the servicers (``worker/servicer.py``,
  ``ps/servicer.py``): everything else talks to peers through the transport's clients, and the
  collectives run the same over the in-process and the gRPC transport.
- gRPC status codes are read (``.code()``, ``StatusCode.X`` outside a call that sets a status)
  only in ``cluster/transport/_grpc_errors.py``, which maps them to the errors of
  ``cluster/errors.py``; servicers may still produce a status (``context.abort(code, ...)``).
- The transport (``cluster/transport/``) and the optimizers (``cluster/optimizers.py``) never
  import ``cluster.ps``, the parameter server's store and placement: the value types they share
  with it (``AssignMode``, ``OptimizerSpec``, ``Pulled``) live below all three, in
  ``cluster/_ps_values.py``.
- No module of ``cluster/``, ``worker/``, ``ps/`` or ``resolver/`` exceeds 600 lines (the
  protoc-generated ``_pb/`` stubs aside): a module has one responsibility and is split by it
  before it grows that long, never trimmed to fit.

Private names (``_name``) stay inside the module that defines them: ``tests/test_private_names.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _imported_top_levels(package: str) -> dict[str, set[str]]:
    """Map each module file of `package` to the top-level names it imports (absolute imports)."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(REPO))] = names
    return found


def test_resolver_imports_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"resolver", "__future__"}
    offenders = {
        f: sorted(names - allowed)
        for f, names in _imported_top_levels("resolver").items()
        if names - allowed
    }
    assert not offenders, f"resolver/ must stay standard-library only: {offenders}"


@pytest.mark.parametrize("upper", ["worker", "ps", "coordination_service"])
def test_cluster_never_imports_process_entry_points(upper: str) -> None:
    offenders = [f for f, names in _imported_top_levels("cluster").items() if upper in names]
    assert not offenders, f"cluster/ must not import {upper}/: {offenders}"


# The process entry points may read the environment; below them, only cluster/settings.py does
# (configuration is read once, at the edge). resolver/ reads TF_CONFIG and Slurm's variables by
# contract (TF reads them on every call); cluster/ctl/ is the clusterctl command line;
# cluster/testing/ is the entry point of the processes it spawns.
_ENV_READERS = ("cluster/settings.py", "cluster/testing/", "cluster/ctl/", "worker/", "ps/",
                "coordination_service/", "resolver/")


def _reads_environment(tree: ast.AST) -> list[int]:
    """Lines that touch ``os.environ``, ``os.getenv``/``putenv`` or import them from os."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv",
                                                              "environb")
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv", "environb") for a in node.names):
            lines.append(node.lineno)
    return lines


def test_only_settings_and_entry_points_read_the_environment() -> None:
    offenders = {}
    for package in ("cluster", "worker", "ps", "coordination_service", "resolver"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel.startswith(_ENV_READERS):
                continue
            lines = _reads_environment(ast.parse(path.read_text(), filename=rel))
            if lines:
                offenders[rel] = lines
    assert not offenders, (
        f"read the environment in cluster/settings.py (TaskSettings) and pass it down: {offenders}")


def test_the_environment_check_finds_a_reader() -> None:
    assert _reads_environment(ast.parse("import os\nx = os.environ.get('A')")) == [2]
    assert _reads_environment(ast.parse("from os import getenv")) == [1]
    assert _reads_environment(ast.parse("import os\nx = os.path.join('a')")) == []


# gRPC stays at the edge: the transport package and the servicers of the process entry points.
# Everything else talks to peers through cluster/transport/'s clients.
_GRPC_USERS = ("cluster/transport/", "worker/servicer.py", "ps/servicer.py")


def test_only_the_transport_and_the_servicers_import_grpc() -> None:
    offenders = []
    for package in ("cluster", "worker", "ps", "coordination_service", "resolver"):
        for module, names in _imported_top_levels(package).items():
            if "grpc" in names and not module.startswith(_GRPC_USERS):
                offenders.append(module)
    assert not offenders, f"only cluster/transport/ and the servicers may import grpc: {offenders}"


def _reads_status_codes(tree: ast.AST) -> list[int]:
    """Lines that read a call's status: ``.code()`` calls, or ``StatusCode`` outside a call that
    sets one (``context.abort(grpc.StatusCode.X, ...)`` produces a status, it maps nothing)."""
    produced: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("abort", "set_code") and node.args):
            produced.add(id(node.args[0]))
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "code" and not node.args):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "StatusCode" and id(node) not in produced):
            lines.append(node.lineno)
    return lines


def test_one_module_maps_grpc_status_codes() -> None:
    offenders = {}
    for package in ("cluster", "worker", "ps", "coordination_service"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel == "cluster/transport/_grpc_errors.py" or "/_pb/" in rel:
                continue
            lines = _reads_status_codes(ast.parse(path.read_text(), filename=rel))
            if lines:
                offenders[rel] = lines
    assert not offenders, f"map gRPC status codes in cluster/transport/_grpc_errors.py: {offenders}"


def test_the_status_code_check_finds_a_reader() -> None:
    reader = "if e.code() == grpc.StatusCode.UNAVAILABLE: pass"
    assert _reads_status_codes(ast.parse(reader)) == [1, 1]
    producer = "context.abort(grpc.StatusCode.INVALID_ARGUMENT, 'bad')"
    assert _reads_status_codes(ast.parse(producer)) == []


def test_no_module_exceeds_600_lines() -> None:
    """Modules have one job and a few hundred lines; split by responsibility before 600."""
    long = {}
    for package in ("cluster", "worker", "ps", "coordination_service", "resolver"):
        for path in (REPO / package).rglob("*.py"):
            rel = str(path.relative_to(REPO))
            if "/_pb/" in rel:
                continue  # generated by protoc
            lines = len(path.read_text().splitlines())
            if lines > 600:
                long[rel] = lines
    assert not long, f"split these modules: {long}"


def _imported_modules(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every absolute import of ``source``, module names in full
    (``from cluster.ps import store`` gives ``cluster.ps`` and ``cluster.ps.store``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def test_the_transport_and_the_optimizers_never_import_the_parameter_servers_store() -> None:
    clients = [*sorted((REPO / "cluster" / "transport").rglob("*.py")),
               REPO / "cluster" / "optimizers.py"]
    offenders = [f"{path.relative_to(REPO)}:{line}: {module}"
                 for path in clients for line, module in _imported_modules(path.read_text())
                 if module == "cluster.ps" or module.startswith("cluster.ps.")]
    assert not offenders, (
        f"import the parameter server's value types from cluster._ps_values: {offenders}")


def test_the_import_scan_sees_the_store() -> None:
    source = "from cluster.ps import store\nimport cluster.ps.store\n"
    assert _imported_modules(source) == [(1, "cluster.ps"), (1, "cluster.ps.store"),
                                         (2, "cluster.ps.store")]
