"""No import cycles in cluster/, and every module-level import at the top of its file.

The graph counts module-level *and* function-level imports: a function-level import that dodges a
cycle is still a cycle (it only moves the failure from import time to the first call). Imports
under ``if TYPE_CHECKING:`` are left out, since they never run.

An edge goes to the module named by the import: ``from cluster import _nest`` and
``import cluster._nest`` both point at ``cluster._nest``; ``from cluster.strategies import
Strategy`` points at the package ``cluster.strategies`` (its ``__init__``). The implicit import of
a module's parent packages is left out, or every module would "cycle" through ``cluster``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "cluster"

# The strategy layer: these modules must never import one another in a cycle.
_STRATEGY_LAYER = (
    "cluster._context",
    "cluster.values",
    "cluster.variables",
    "cluster.cross_device_ops",
    "cluster.strategies",
)

# Cycles elsewhere in cluster/ that are known and owned by other work, as frozensets of modules.
# Each entry needs a reason; an entry that no longer matches a cycle fails the test, so the list
# only shrinks.
_KNOWN_CYCLES: dict[frozenset[str], str] = {}


# -- the graph ------------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (module level and in functions), not TYPE_CHECKING."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    """The absolute module an ``ImportFrom`` names, relative imports resolved against
    ``module`` (its own package when it is a package's ``__init__``)."""
    if node.level == 0:
        return node.module
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def import_graph(modules: Mapping[str, str]) -> dict[str, set[str]]:
    """``{module: {imported modules}}`` among ``modules`` (``{name: source}``)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, source in modules.items():
        for node in _imports(ast.parse(source, filename=name)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                is_package = any(other.startswith(name + ".") for other in modules)
                target = _resolve(name, node, is_package)
                if target is None:
                    continue
                # `from pkg import sub` names the submodule when there is one.
                targets = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules
                           else target for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cluster_sources() -> dict[str, str]:
    return {_module_name(path): path.read_text()
            for path in sorted((REPO / PACKAGE).rglob("*.py"))
            if "_pb" not in path.relative_to(REPO).parts}


# -- cycles ---------------------------------------------------------------------------------------


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _in_layer(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in _STRATEGY_LAYER)


# -- the self-tests: the finder finds what it should ---------------------------------------------


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b"}, "b": {"a"}}, [{"a", "b"}]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [{"a", "b", "c"}]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b", "c"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [{"a", "b"}, {"c", "d"}]),
    ({"a": set()}, []),
])
def test_the_cycle_finder_finds_cycles_in_synthetic_graphs(graph, expected) -> None:
    assert sorted(map(sorted, strongly_connected(graph))) == sorted(map(sorted, expected))


def test_function_level_and_relative_imports_are_edges_but_type_checking_ones_are_not() -> None:
    modules = {
        "pkg": "",
        "pkg.a": "def f():\n    from pkg import b\n",
        "pkg.b": "from . import c\n",
        "pkg.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
        "pkg.d": "import pkg.a\nfrom pkg import e\n",
        "pkg.e": "from pkg.d import thing\n",
    }
    assert import_graph(modules) == {
        "pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": set(),
        "pkg.d": {"pkg.a", "pkg.e"}, "pkg.e": {"pkg.d"},
    }
    assert strongly_connected(import_graph(modules)) == [frozenset({"pkg.d", "pkg.e"})]


# -- the rules ------------------------------------------------------------------------------------


def test_no_import_cycle_in_the_strategy_layer() -> None:
    cycles = [sorted(c) for c in strongly_connected(import_graph(_cluster_sources()))
              if any(_in_layer(m) for m in c)]
    assert not cycles, (
        f"import cycles through the strategy layer: {cycles}. Pass what a lower module needs "
        "down (a registration, a class attribute, a method) instead of importing upwards")


def test_no_import_cycle_in_cluster_except_the_known_ones() -> None:
    cycles = set(strongly_connected(import_graph(_cluster_sources())))
    unknown = sorted(sorted(c) for c in cycles - set(_KNOWN_CYCLES))
    assert not unknown, f"import cycles in cluster/: {unknown}"
    stale = sorted(sorted(c) for c in set(_KNOWN_CYCLES) - cycles)
    assert not stale, f"_KNOWN_CYCLES lists cycles that are gone; remove them: {stale}"


def _late_imports(source: str, filename: str) -> list[int]:
    """Lines of module-level imports that come after the module's first def or class."""
    tree = ast.parse(source, filename=filename)
    seen_definition = False
    late = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            seen_definition = True
        elif seen_definition:
            late.extend(n.lineno for n in _imports(node))
    return late


def test_late_import_finder_finds_an_import_after_a_definition() -> None:
    source = "import os\n\n\ndef f():\n    import sys\n\n\nimport json\n"
    assert _late_imports(source, "m.py") == [8]


def test_module_level_imports_come_before_the_first_definition() -> None:
    offenders = {}
    for path in sorted((REPO / PACKAGE).rglob("*.py")):
        rel = str(path.relative_to(REPO))
        lines = _late_imports(path.read_text(), rel)
        if lines:
            offenders[rel] = lines
    assert not offenders, (
        f"module-level imports below a def/class (lines): {offenders}; move them to the top "
        "(an import placed late to dodge a cycle is a cycle: break it instead)")
