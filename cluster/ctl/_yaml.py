"""YAML with line numbers: compose pyyaml's node tree and keep each value's position.

``load(text, filename)`` returns a :class:`Located` tree: mappings become ``dict[str, Located]``,
sequences ``list[Located]``, scalars their safe-loaded Python value; every ``Located`` has the
1-based ``line`` and ``column`` of its value, and mappings remember where each key is
(``key_lines``), so validation errors can point at the exact line. Duplicate keys are an error
(pyyaml silently keeps the last one).

Bounded work: anchors and aliases (``&a``/``*a``) are allowed, since they let a file share e.g.
one ``resources:`` block between jobs, but each alias is a copy, so nine nested aliases of nine
items each (a 400-byte "billion laughs" file) would expand to 9**9 values. The tree is therefore
capped at :data:`MAX_NODES` values after expansion (a 1,024-task file with every address listed
has about 1,100), and nesting at :data:`MAX_DEPTH` levels (the schema needs 4); beyond either
the file is refused at once, before any memory grows. The caller caps the file's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["MAX_DEPTH", "MAX_NODES", "Located", "YamlError", "load"]

MAX_NODES = 100_000  # values in the expanded tree: ~0.3 s to convert, far above any real file
MAX_DEPTH = 64  # nesting levels; pyyaml's composer recurses per level (RecursionError ~1,000)
_DEPTH_HINT = "a cluster file nests a few levels (cluster: worker: [addresses])"


class YamlError(ValueError):
    """Unparseable YAML; ``line`` and ``column`` are 1-based (0 when unknown); ``hint`` says
    how to fix it when the cause is known (else the caller's generic advice applies)."""

    def __init__(self, message: str, line: int = 0, column: int = 0, hint: str = "") -> None:
        super().__init__(message)
        self.line = line
        self.column = column
        self.hint = hint


@dataclass
class Located:
    """A value with its position: ``value`` is a dict, list or scalar (see module doc)."""

    value: Any
    line: int
    column: int
    key_lines: dict[str, int] = field(default_factory=dict)

    def plain(self) -> Any:
        """The value without positions (nested dicts/lists/scalars)."""
        if isinstance(self.value, dict):
            return {k: v.plain() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value


_constructor = yaml.constructor.SafeConstructor()


class _Budget:
    """Counts the values :func:`_convert` produces; raises once :data:`MAX_NODES` is passed."""

    def __init__(self) -> None:
        self.nodes = 0

    def spend(self, node: yaml.Node, depth: int) -> None:
        self.nodes += 1
        line, column = node.start_mark.line + 1, node.start_mark.column + 1
        if self.nodes > MAX_NODES:
            raise YamlError(f"more than {MAX_NODES:,} values once aliases (*name) are expanded: "
                            "an alias copies what its anchor names, so aliases of aliases "
                            "multiply", line, column, hint="write the values out, or use fewer "
                            "levels of aliases")
        if depth > MAX_DEPTH:
            raise YamlError(f"nested more than {MAX_DEPTH} levels deep", line, column,
                            hint=_DEPTH_HINT)


def _convert(node: yaml.Node, budget: _Budget, depth: int = 0) -> Located:
    budget.spend(node, depth)
    line, column = node.start_mark.line + 1, node.start_mark.column + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Located] = {}
        key_lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlError("mapping keys must be plain strings",
                                key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            key = _constructor.construct_object(key_node)
            key = str(key) if key is not None else "null"
            key_line = key_node.start_mark.line + 1
            if key in result:
                raise YamlError(f"duplicate key {key!r} (first on line {key_lines[key]})",
                                key_line, key_node.start_mark.column + 1)
            result[key] = _convert(value_node, budget, depth + 1)
            key_lines[key] = key_line
        return Located(result, line, column, key_lines)
    if isinstance(node, yaml.SequenceNode):
        return Located([_convert(item, budget, depth + 1) for item in node.value], line, column)
    return Located(_constructor.construct_object(node), line, column)


def load(text: str) -> Located | None:
    """Parse one YAML document; ``None`` for an empty one.

    Raises:
        YamlError: syntax errors, anchors/tags pyyaml's safe loader refuses, duplicate keys,
            more than :data:`MAX_NODES` values after alias expansion or :data:`MAX_DEPTH` levels.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError as e:  # pyyaml's composer recurses once per nesting level
        raise YamlError(f"nested more than {MAX_DEPTH} levels deep", hint=_DEPTH_HINT) from e
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or "invalid YAML"
        if e.context:
            problem = f"{problem} ({e.context})"
        raise YamlError(problem, mark.line + 1 if mark else 0,
                        mark.column + 1 if mark else 0) from e
    except yaml.YAMLError as e:
        raise YamlError(str(e)) from e
    if node is None:
        return None
    try:
        return _convert(node, _Budget())
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark
        raise YamlError(e.problem or "cannot load value", mark.line + 1 if mark else 0,
                        mark.column + 1 if mark else 0) from e
