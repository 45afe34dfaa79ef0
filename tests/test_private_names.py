"""No module uses another module's private names (``_name``); checked on the source with ``ast``.

A name is private when it starts with one underscore (``_x``, not the dunder ``__x__``). It
belongs to the module that defines it: there it may be used freely, on ``self`` or on any other
object. The modules checked are every ``.py`` file of ``cluster/``, ``worker/``, ``ps/`` and
``resolver/`` except the protoc-generated ``_pb/`` stubs. A module M *uses another module's
private name* when it contains any of:

1. ``from X import _y`` where ``X`` is a module of these packages and ``X._y`` is not a module;
2. ``X._y`` where ``X`` is a name M bound to one of these modules by an import, and ``X._y`` is
   not a module;
3. ``expr._y`` where ``expr`` is not ``self``, ``cls`` or ``super()``, ``_y`` is a private name
   some module of these packages defines, and M does not define ``_y`` itself;
4. a keyword argument ``_y=...`` in a call, when M does not define ``_y`` itself.

"Defines" means: a ``def`` or ``class`` of that name, an assignment to it at module, class or
function level, ``self._y = ...`` / ``cls._y = ...``, or a parameter of that name. Through
``self``, ``cls`` and ``super()`` a class uses its own members, inherited ones included (a
subclass extends its bases' implementation). Private *modules* are not names: a package's
``_foo.py`` is its internal file, imported by its siblings (that is what private modules are
for); a private module may well hold public names, which is how a package shares a helper among
its modules without publishing it.

The rule matches names by spelling, not by type, so it cannot see the class an attribute belongs
to: a module that defines ``_y`` itself is taken to use its own ``_y``; private names of other
libraries (``os._exit``, a named tuple's ``_replace``) are not this repository's business; and
``getattr(obj, "_y")`` is not seen.

The fix for a finding: make the name public where it is defined (inside a private module when
only its package should use it), or move the code that uses it to the module that owns it: for
a private attribute of a user-facing object (a coordinator, a checkpoint, a variable, an
optimizer), a function of the owning module or an internal object with public names, so the
user-facing class gains no public surface.

*Protocols* are the exception, declared in one place: the member names of the
``typing.Protocol`` classes in ``cluster/_protocols.py`` may be used by any module (3 and 4 do
not apply to them). A protocol belongs there only when it is a cross-module contract that
several classes implement and that must stay private-looking on user-facing objects; its
docstring states the contract. Those declared now, and why each is a protocol:

- ``RawVariable`` (``_read``, ``_write``, ``_distribute_strategy``): the raw-array access that
  every variable kind implements (plain, mirrored, sync-on-read, parameter-server, components)
  and the optimizers, the strategies and the checkpoints use. Public names would widen
  ``cluster.Variable``, which mirrors ``tf.Variable``; ``_distribute_strategy`` is TF's own
  attribute name.
- ``ExternalTrackable`` (``_checkpoint_save``, ``_checkpoint_restore``, ``_distribute_strategy``):
  hooks that objects outside ``cluster.checkpoint`` implement (``cluster.torch.StateDict``, a
  user's own), private-looking as TF's ``Trackable`` hooks are.
- ``StrategyDrivenOptimizer`` (``_apply_in_replica_context``, ``_update_rule``): what the
  strategies and the parameter-server values call back on an optimizer; they sit below
  ``cluster.optimizers`` (which imports them) so they cannot call a function of it, and public
  methods would widen the Keras-mirroring optimizers.
- ``ElasticExtended`` (``_elastic_enabled``, ``_elastic_pending``, ``_elastic_joining``,
  ``_elastic_regroup``, ``_elastic_regroup_timeout``): what ``cluster.elastic`` calls on
  ``strategy.extended``, which mirrors TF's ``StrategyExtended``; implemented by the strategies'
  ``extended`` (the elastic one answers all, every other says it is not elastic).

``_ALLOWED`` lists the uses that stay for now, each with its reason; an entry that no longer
matches a use fails the test, so the list only shrinks. A protocol name no module uses across
modules fails the test too, so the exception does not outlive its use.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("cluster", "worker", "ps", "coordination_service", "resolver")

PROTOCOLS = REPO / "cluster" / "_protocols.py"

_ALLOWED: dict[tuple[str, str], str] = {}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    """Every checked module, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "_pb" not in path.relative_to(REPO).parts:
                found[_module_name(path)] = path
    return found


def _defined(tree: ast.AST) -> set[str]:
    """The private names a module defines (see the module docstring)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
    return {name for name in names if _private(name)}


def protocol_names(tree: ast.AST) -> set[str]:
    """The private member names the ``Protocol`` classes of a module declare."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "Protocol")
                or (isinstance(b, ast.Attribute) and b.attr == "Protocol") for b in node.bases):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
    return {name for name in names if _private(name)}


def _own_object(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: a class using its own (or inherited) members."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "super")


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The module an ``import from`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def find_uses(module: str, tree: ast.AST, *, modules: set[str], is_package: bool,
              project_private: set[str],
              protocol: frozenset[str] = frozenset()) -> Iterator[tuple[int, str, str]]:
    """``(line, name, how)`` for each use of another module's private name in ``tree``, the
    source of ``module``; ``modules`` are the dotted names of every checked module,
    ``project_private`` the private names they define and ``protocol`` the member names of the
    declared protocols (used freely)."""
    own = _defined(tree)
    aliases: dict[str, str] = {}  # local name -> module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, node, is_package)
            if source.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in modules:
                    aliases[alias.asname or alias.name] = full
                elif _private(alias.name):
                    yield node.lineno, alias.name, f"from {source} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            target = node.value
            if _own_object(target):
                continue
            if isinstance(target, ast.Name) and target.id in aliases:
                if f"{aliases[target.id]}.{node.attr}" not in modules:
                    yield node.lineno, node.attr, f"{target.id}.{node.attr}"
                continue
            if node.attr in project_private and node.attr not in own \
                    and node.attr not in protocol:
                yield node.lineno, node.attr, f"{ast.unparse(target)[:40]}.{node.attr}"
        elif isinstance(node, ast.keyword) and node.arg and _private(node.arg) \
                and node.arg not in own and node.arg not in protocol:
            yield node.lineno, node.arg, f"keyword {node.arg}="


@functools.cache
def _protocol() -> frozenset[str]:
    return frozenset(protocol_names(ast.parse(PROTOCOLS.read_text(), filename=str(PROTOCOLS))))


@functools.cache
def _all_uses(with_protocol: bool = True) -> list[tuple[str, int, str, str]]:
    sources = _sources()
    trees = {name: ast.parse(path.read_text(), filename=str(path))
             for name, path in sources.items()}
    project_private = set().union(*(_defined(tree) for tree in trees.values()))
    protocol = _protocol() if with_protocol else frozenset()
    uses = []
    for name, tree in trees.items():
        path = sources[name]
        rel = str(path.relative_to(REPO))
        for line, private, how in find_uses(name, tree, modules=set(sources),
                                            is_package=path.name == "__init__.py",
                                            project_private=project_private,
                                            protocol=protocol):
            uses.append((rel, line, private, how))
    return sorted(uses)


def test_no_module_uses_another_modules_private_names() -> None:
    found = [f"{path}:{line}: {how}" for path, line, name, how in _all_uses()
             if (path, name) not in _ALLOWED]
    assert not found, (
        "these modules use private names of other modules; make the name public where it is "
        "defined (in a private module if only its package needs it) or move the code to its "
        "owner:\n  " + "\n  ".join(found))


def test_every_allowed_use_still_exists() -> None:
    used = {(path, name) for path, _, name, _ in _all_uses()}
    stale = sorted(set(_ALLOWED) - used)
    assert not stale, f"remove these entries from _ALLOWED, the uses are gone: {stale}"


def test_every_protocol_name_is_used_across_modules() -> None:
    declared = _protocol()
    assert declared, f"no protocol names found in {PROTOCOLS.relative_to(REPO)}"
    used = {name for _, _, name, _ in _all_uses(with_protocol=False)}
    assert declared <= used, (
        f"{sorted(declared - used)} are declared in {PROTOCOLS.relative_to(REPO)} but no module "
        "uses them across modules: remove them from the protocol")


def _uses_in(source: str, module: str = "cluster.a") -> list[tuple[int, str]]:
    tree = ast.parse(source)
    others = ast.parse("def _helper(): pass\nclass K:\n    def __init__(self):\n"
                       "        self._secret = 1\n")
    return [(line, name) for line, name, _ in find_uses(
        module, tree, modules={"cluster.a", "cluster.b", "cluster._impl"}, is_package=False,
        project_private=_defined(others) | _defined(tree))]


def test_the_rule_finds_each_kind_of_use() -> None:
    assert _uses_in("from cluster.b import _helper") == [(1, "_helper")]
    assert _uses_in("from cluster import b\nb._helper()") == [(2, "_helper")]
    assert _uses_in("def f(k):\n    return k._secret") == [(2, "_secret")]
    assert _uses_in("f(x, _secret=1)") == [(1, "_secret")]


def test_the_rule_leaves_a_modules_own_names_and_private_modules_alone() -> None:
    assert _uses_in("from cluster import _impl\nfrom cluster._impl import thing") == []
    assert _uses_in("class K:\n    def f(self, other):\n        self._secret = 1\n"
                    "        return other._secret + self._secret + super()._secret") == []
    assert _uses_in("import os\nos._exit(0)\nx._replace(a=1)") == []  # not this project's names
    assert _uses_in("def _helper(_secret): pass\n_helper(_secret=1)") == []


def test_the_rule_accepts_only_the_names_a_protocol_declares() -> None:
    protocols = ast.parse("from typing import Protocol\nclass P(Protocol):\n"
                          "    def _secret(self): ...\nclass Q:\n    def _helper(self): ...\n")
    assert protocol_names(protocols) == {"_secret"}
    tree = ast.parse("def f(k):\n    return k._secret, k._helper")
    others = ast.parse("def _helper(): pass\nclass K:\n    def __init__(self):\n"
                       "        self._secret = 1\n")
    found = [name for _, name, _ in find_uses(
        "cluster.a", tree, modules={"cluster.a"}, is_package=False,
        project_private=_defined(others), protocol=frozenset(protocol_names(protocols)))]
    assert found == ["_helper"]
