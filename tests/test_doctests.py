"""Every docstring example (``>>>``) in ``cluster/`` and ``resolver/`` runs, one test per module
(its id is the module's dotted name), so ``uv run pytest`` keeps the examples true.

Modules are found by reading their source (``ast``), never by importing them: a module whose
examples need an optional package (torch, JAX, CuPy), because it or a module it imports at
module level (its parent packages included) imports that package at module level, is imported
only when the package is installed, and skipped naming the package otherwise. Examples that
need a running cluster are written as literal blocks (``::``) or ``# doctest: +SKIP``, so what
runs here is in-process and bounded by the test timeout.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import io
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests._requires import require, require_cupy

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("cluster", "resolver")
OPTIONAL = frozenset({"torch", "jax", "jaxlib", "cupy", "keras"})


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _path(module: str) -> Path | None:
    """The source file of an in-repository module, None for anything else."""
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _has_examples(tree: ast.Module) -> bool:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(
        n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef))]
    return any(">>>" in (ast.get_docstring(n, clean=False) or "") for n in nodes)


def _imports(tree: ast.Module) -> set[str]:
    """Dotted names imported at module level (not under ``if TYPE_CHECKING:``, not inside a
    function): ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (``c`` may be a module)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _needs(module: str) -> frozenset[str]:
    """The optional packages importing ``module`` imports, through the module-level imports of
    every in-repository module it pulls in (its parent packages included)."""
    found: set[str] = set()
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        path = _path(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        parent = name.rpartition(".")[0]
        todo += [parent] if parent else []
        for imported in _imports(_tree(path)):
            top = imported.split(".")[0]
            if top in OPTIONAL:
                found.add(top)
            elif top in PACKAGES:
                todo.append(imported)
    return frozenset(found)


def _modules_with_examples() -> list[str]:
    return sorted(_module_name(path) for package in PACKAGES
                  for path in (REPO / package).rglob("*.py")
                  if _has_examples(_tree(path)))


MODULES = _modules_with_examples()


def test_the_modules_with_examples_are_found() -> None:
    assert {"cluster", "cluster.collectives", "cluster.collectives.schedule",
            "cluster.variables"} <= set(MODULES), MODULES
    assert _needs("cluster.torch._gradients") == {"torch"}  # through cluster.torch as well
    assert _needs("cluster.jax") == {"jax"}
    assert _needs("cluster.collectives") == frozenset()  # CuPy is imported lazily there


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module: str) -> None:
    missing = sorted(p for p in _needs(module) if importlib.util.find_spec(p) is None)
    if missing:
        for package in missing:  # skips: "<package> is not installed: <the command>"
            require_cupy() if package == "cupy" else require(package)
    tests = doctest.DocTestFinder(exclude_empty=True).find(importlib.import_module(module))
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in sorted(tests, key=lambda t: t.lineno or 0):
        runner.run(test, out=report.write)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} examples failed:\n{report.getvalue()}"


@pytest.mark.timeout(120)
def test_examples_that_start_from_import_cluster_work_in_a_fresh_interpreter() -> None:
    """The examples above run in this process, where other tests may have imported the
    strategies already; a user's interpreter starts from ``import cluster`` alone."""
    code = ("import cluster\n"
            "v = cluster.Variable([1.0, 2.0], name='w')\n"
            "print(v.assign_add([1.0, 1.0]).numpy().tolist(), v.dtype,\n"
            "      type(cluster.get_strategy()).__name__, cluster.has_strategy())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[2.0,", "3.0]", "float32", "_DefaultStrategy", "False"]
