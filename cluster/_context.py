"""Which strategy and which replica the current thread is in (``tf.distribute``'s context stack).

Each thread has a stack of :class:`Frame` entries. Entering ``strategy.scope()`` pushes a
cross-replica frame (``replica_context is None``); a replica thread started by ``strategy.run``
pushes a frame holding its :class:`~cluster.strategies.replica.ReplicaContext`. With an empty
stack the thread is in the default strategy's default replica context, as in TensorFlow.

This module sits below the strategies: it never imports them, and "is this the default
strategy" is :func:`is_default`: the default strategy's class, and only it, derives from
:class:`DefaultStrategyMarker`, defined here. The default strategy's frame
comes from a factory that the package root (``cluster/__init__.py``) installs with
:func:`set_default_frame`. Python runs the package root before any module of the package, so the
factory is in place whatever the user imported first; it imports the strategies only when a
thread outside every strategy first asks for the strategy or replica context object, so that
``import cluster`` (and ``clusterctl``) stays cheap. :func:`has_strategy`,
:func:`in_cross_replica_context` and :func:`in_default_context` answer from the stack alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cluster.strategies.base import Strategy
    from cluster.strategies.replica import ReplicaContext

__all__ = [
    "DefaultStrategyMarker",
    "Frame",
    "add_scope_hook",
    "current_frame",
    "describe",
    "entering_scope",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
    "in_default_context",
    "is_default",
    "push",
    "set_default_frame",
]


@dataclass(frozen=True)
class Frame:
    """One entry of a thread's context stack: a strategy, and the replica context the thread is
    in (``None``: cross-replica context of ``strategy``)."""

    strategy: Strategy
    replica_context: ReplicaContext | None


class DefaultStrategyMarker:
    """A base class of the default strategy's class (``cluster.strategies.default``) and of no
    other: how this module and the modules below the strategies recognise the default strategy
    (:func:`is_default`) without importing it, and without an attribute on every Strategy."""


def is_default(strategy: Strategy) -> bool:
    """Whether ``strategy`` is the default strategy (what :func:`get_strategy` returns outside
    every strategy's scope)."""
    return isinstance(strategy, DefaultStrategyMarker)


_local = threading.local()
_default_lock = threading.Lock()
_default_factory: Callable[[], Frame] | None = None
_default: Frame | None = None


def set_default_frame(factory: Callable[[], Frame]) -> None:
    """Install ``factory``, which builds the frame of a thread outside every strategy: the
    default strategy in its default replica context.

    The package root installs it on ``import cluster``. ``factory`` is called once, when that
    frame is first needed (by one thread, under a lock); every later lookup gets the same frame.
    """
    global _default_factory, _default
    with _default_lock:
        _default_factory = factory
        _default = None


_scope_hooks: list[Callable[[Any], None]] = []


def add_scope_hook(hook: Callable[[Any], None]) -> None:
    """Call ``hook(strategy)`` each time a strategy's ``scope()`` is entered, before variables
    can be created in it. The package root adds one: framework support (``cluster.keras``) wires
    itself in there when the program uses that framework. Hooks run in the order added."""
    with _default_lock:
        _scope_hooks.append(hook)


def entering_scope(strategy: Any) -> None:
    """Run every scope hook for ``strategy`` (``Strategy.scope()`` calls it)."""
    for hook in tuple(_scope_hooks):
        hook(strategy)


def _default_frame() -> Frame:
    global _default
    frame = _default
    if frame is not None:
        return frame
    with _default_lock:
        if _default is None:
            if _default_factory is None:
                raise RuntimeError("no default strategy factory: cluster/__init__.py installs it; "
                                   "load cluster._context as part of the cluster package")
            _default = _default_factory()
        return _default


def _stack() -> list[Frame]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def current_frame() -> Frame:
    """The innermost frame of this thread (the default strategy's when none was entered)."""
    stack = _stack()
    if stack:
        return stack[-1]
    return _default_frame()


@contextmanager
def push(strategy: Strategy, replica_context: ReplicaContext | None):
    """Enter ``strategy`` in this thread: cross-replica when ``replica_context`` is None."""
    stack = _stack()
    stack.append(Frame(strategy, replica_context))
    try:
        yield
    finally:
        stack.pop()


def get_strategy() -> Strategy:
    """The current strategy: the one whose scope (or ``run``) this thread is in, else the default
    strategy (one replica, no distribution), like ``tf.distribute.get_strategy()``."""
    return current_frame().strategy


def has_strategy() -> bool:
    """True inside a non-default strategy's scope or replica context."""
    stack = _stack()
    return bool(stack) and not is_default(stack[-1].strategy)


def get_replica_context() -> ReplicaContext | None:
    """The current replica context; ``None`` in cross-replica context (inside a strategy's scope,
    outside ``run``); the default replica context outside every strategy."""
    return current_frame().replica_context


def in_cross_replica_context() -> bool:
    """True inside ``strategy.scope()`` and outside ``strategy.run`` (outside every strategy
    the thread is in the default replica context: False)."""
    stack = _stack()
    return bool(stack) and stack[-1].replica_context is None


def in_default_context() -> bool:
    """True outside every strategy: in the default strategy's default replica context, where TF
    lets any strategy's cross-replica methods (``reduce``, ``gather``, ``run``...) be called.
    (Inside the default strategy's ``run`` the thread is in a replica context of its own.)"""
    return not _stack()


def describe(strategy: Any) -> str:
    """``strategy`` named for error messages: its type and identity."""
    return f"{type(strategy).__name__} at {id(strategy):#x}"
