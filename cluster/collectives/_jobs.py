"""A collective call as a job: validated on the caller's thread, run later in the group's stream.

Validation happens before any byte moves, on every rank for its own input (the dtype, the array
family, the op, the root, the options). A rejected input does not abort the group: see
:func:`reject` for how the ranks agree without costing valid calls anything.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cluster.collectives._call import Call
from cluster.collectives.options import CommunicationOptions
from cluster.errors import ClusterError

__all__ = [
    "Prepare", "Prepared", "identity", "in_place", "job", "on_gpu", "reject", "restore_each",
    "then",
]

Prepared = tuple[Callable[[Call], Any], Callable[[Any], Any]]
"""What a validated call needs: ``run(call) -> raw result`` inside the collective, and
``restore(raw) -> result`` in the caller's array family, after it."""
Prepare = Callable[[], Prepared]
"""Validates a call's arguments (``TypeError``/``ValueError`` for bad ones): its ``Prepared``."""
Collective = Callable[[str, CommunicationOptions | None], contextlib.AbstractContextManager[Call]]


def job(
    kind: str,
    options: CommunicationOptions | None,
    prepare: Prepare,
    *,
    collective: Collective,
    reject: Callable[[str, Any, Exception], Any],
) -> Callable[[], Any]:
    """Run ``prepare`` now; return the job that runs the collective.

    The job numbers the call when it runs (``collective(kind, options)``) and restores the
    result in the caller's family outside the collective, so a failure there cannot abort the
    group. A rejected input becomes a job that runs ``reject(kind, options, error)`` instead.
    """
    try:
        if options is not None and not isinstance(options, CommunicationOptions):
            raise TypeError(f"options must be a CommunicationOptions, got {options!r:.80}")
        run, restore = prepare()
    except (TypeError, ValueError) as error:
        return functools.partial(reject, kind, options, error)

    def collective_job() -> Any:
        with collective(kind, options) as call:
            raw = run(call)
        return restore(raw)

    return collective_job


def reject(
    kind: str,
    options: Any,
    error: Exception,
    *,
    world_size: int,
    collective: Collective,
    barrier: Callable[[Call, str], None],
) -> None:
    """Raise ``error``, the input this rank rejected for a ``kind`` call, keeping the group.

    Ranks cannot know whether their peers rejected too, so the rejected call still takes its
    place in the group's numbering and runs a barrier signed ``rejected <kind>: <error type>``;
    no data moves. When every rank rejected (the usual case: the same code on every rank), the
    signatures agree, every rank raises its own error and the group goes on. When some rank's
    input was valid, the mismatch handshake (``_exchange``, or the arena's identities) catches
    the difference at once: this rank raises ``error`` with a note, the others
    :class:`~cluster.errors.CollectiveMismatchError` or
    :class:`~cluster.errors.CollectiveAbortedError` naming this rank and the error type, and
    the group is aborted, as for any other disagreement between ranks. Valid calls pay nothing.
    """
    if world_size > 1:
        if not isinstance(options, CommunicationOptions):
            options = None
        try:
            with collective(kind, options) as call:
                barrier(call, f"rejected {kind}: {type(error).__name__}")
        except ClusterError as peers_error:
            error.add_note(
                f"the other ranks' input was valid, so the group is aborted: {peers_error}")
    raise error


def identity(result: Any) -> Any:
    return result


def restore_each(pairs: list[tuple[Callable[[Any], Any], Any]]) -> list[Any]:
    """The results of ``all_reduce_many``, each in its value's family."""
    return [restore(result) for restore, result in pairs]


def in_place(items: list[Any], values: Sequence[Any], what: str
             ) -> tuple[list[Any], Callable[[list[tuple[Any, Any]]], list[Any]]]:
    """``all_reduce_many(..., in_place=True)``: ``items`` (each value staged on the host as a
    view of it) marked owned, so a value that travels alone is reduced into itself; and the
    restore that writes every other result (a view of its pack) back into its value, then
    returns the values themselves.

    Raises ``ValueError`` for a value that is no writeable, C-contiguous host view of itself.
    """
    owned = []
    for i, item in enumerate(items):
        array = item.array
        if not (isinstance(array, np.ndarray) and array.flags.c_contiguous
                and array.flags.writeable and not item.owned):
            raise ValueError(f"{what}(in_place=True): value {i} must be a writeable, "
                             "C-contiguous host array (NumPy, or a CPU tensor through DLPack)")
        owned.append(type(item)(array, True, item.restore))

    def restore(pairs: list[tuple[Any, Any]]) -> list[Any]:
        for item, (_, result) in zip(owned, pairs, strict=True):
            if not np.shares_memory(result, item.array):
                np.copyto(item.array, result.reshape(item.array.shape))
        return list(values)

    return owned, restore


def then(first: Callable[[Any], Any], second: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda result: second(first(result))


def on_gpu(value: Any) -> bool:
    """A DLPack exporter whose memory is not on the CPU (a torch CUDA tensor)."""
    device = getattr(value, "__dlpack_device__", None)
    return device is not None and not isinstance(value, np.ndarray) and device()[0] != 1
