"""Bitwise-exact broadcast of a state from one replica, over the strategy's public collectives.

A strategy offers ``all_reduce`` and ``all_gather`` in replica context, not a broadcast; a SUM
in which every replica but the root contributes zeros is one. To make it exact for every bit
pattern (NaN payloads, ``-0.0``, any dtype) the payload travels as raw bytes viewed as int64:
integer addition of zeros changes no bit. Three collectives, every member in the same order:

1. ``all_gather`` of each replica's "holds committed state" flag: the root is the lowest
   replica id whose task holds it (rank 0 when none does), so a task that joined fresh, with
   only its initial values, is never the root while one that trained is there;
2. ``all_reduce`` of the root's two byte counts (manifest, data);
3. ``all_reduce`` of one buffer: the manifest (UTF-8 JSON: each array's name, dtype, shape and
   the plain values' encoding) then every array's bytes, in manifest order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

import cluster
from cluster.elastic import _plain

__all__ = ["Payload", "broadcast", "choose_root", "run_collective"]


@dataclass
class Payload:
    """What a state broadcasts: its trackables' tensors by name and its plain values."""

    tensors: dict[str, np.ndarray]
    plain: _plain.Encoded


def run_collective(strategy: Any, fn: Any) -> Any:
    """``fn(context)`` in every local replica; this task's first replica's result (every
    replica of every task gets the same result from a collective)."""
    results = strategy.run(lambda: fn(cluster.get_replica_context()))
    return strategy.experimental_local_results(results)[0]


def choose_root(strategy: Any, holds_state: bool) -> int:
    """The replica id everyone takes the state from (step 1 of the module docstring)."""
    flag = np.array([1 if holds_state else 0], np.int64)
    flags = np.asarray(run_collective(strategy, lambda ctx: ctx.all_gather(flag, 0)))
    holders = np.flatnonzero(flags)
    return int(holders[0]) if holders.size else 0


def _dtype_code(dtype: np.dtype) -> str:
    """A string ``np.dtype`` turns back into ``dtype`` (names first: ``bfloat16`` has no
    portable ``dtype.str``)."""
    try:
        if np.dtype(dtype.name) == dtype:
            return dtype.name
    except TypeError:
        pass
    return dtype.str


def _pack(payload: Payload) -> tuple[bytes, list[np.ndarray]]:
    text, plain_arrays = payload.plain
    arrays = [np.ascontiguousarray(a) for a in payload.tensors.values()] + \
        [np.ascontiguousarray(a) for a in plain_arrays]
    manifest = {
        "tensors": [[name, _dtype_code(a.dtype), list(a.shape)]
                    for name, a in payload.tensors.items()],
        "plain": text,
        "plain_arrays": [[_dtype_code(a.dtype), list(a.shape)] for a in plain_arrays],
    }
    return json.dumps(manifest, separators=(",", ":")).encode(), arrays


def _unpack(manifest: dict[str, Any], data: memoryview) -> Payload:
    offset = 0

    def take(code: str, shape: list[int]) -> np.ndarray:
        nonlocal offset
        dtype = np.dtype(code)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        array = np.frombuffer(data[offset:offset + size], dtype).reshape(shape).copy()
        offset += size
        return array

    tensors = {name: take(code, shape) for name, code, shape in manifest["tensors"]}
    plain_arrays = [take(code, shape) for code, shape in manifest["plain_arrays"]]
    return Payload(tensors, (manifest["plain"], plain_arrays))


def _words(nbytes: int) -> int:
    return (nbytes + 7) // 8


def broadcast(strategy: Any, root: int, payload: Payload | None) -> Payload:
    """The root replica's ``payload`` on every member (steps 2 and 3 of the module docstring).

    ``payload`` is needed only on the root's task (others may pass ``None``); the root's task
    must pass it. Every member calls this with the same ``root``.
    """
    manifest, arrays = _pack(payload) if payload is not None else (b"", [])
    data_bytes = sum(a.nbytes for a in arrays)

    def is_root(ctx: Any) -> bool:
        return ctx.replica_id_in_sync_group == root

    def sizes(ctx: Any) -> Any:
        if is_root(ctx) and payload is None:
            raise ValueError("elastic: the root replica's task has no state to broadcast")
        mine = [len(manifest), data_bytes] if is_root(ctx) else [0, 0]
        return ctx.all_reduce("SUM", np.array(mine, np.int64))

    manifest_bytes, total_data = (int(n) for n in run_collective(strategy, sizes))
    words = _words(manifest_bytes) + _words(total_data)

    def send(ctx: Any) -> Any:
        buffer = np.zeros(words, np.int64)
        if is_root(ctx):
            raw = buffer.view(np.uint8)
            raw[:manifest_bytes] = np.frombuffer(manifest, np.uint8)
            offset = _words(manifest_bytes) * 8
            for a in arrays:
                raw[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)
                offset += a.nbytes
        return ctx.all_reduce("SUM", buffer)

    received = np.ascontiguousarray(run_collective(strategy, send), np.int64).view(np.uint8)
    text = bytes(received[:manifest_bytes]).decode()
    data = memoryview(received[_words(manifest_bytes) * 8:])
    return _unpack(json.loads(text), data)
