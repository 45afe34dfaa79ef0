"""Dependencies point down only (DESIGN.md: layers)."""

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


@pytest.mark.parametrize("upper", ["worker", "ps"])
def test_cluster_never_imports_process_entry_points(upper: str) -> None:
    offenders = [f for f, names in _imported_top_levels("cluster").items() if upper in names]
    assert not offenders, f"cluster/ must not import {upper}/: {offenders}"
