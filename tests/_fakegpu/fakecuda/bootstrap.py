"""NCCL ranks in different processes of the fake GPU machine, joined as NCCL joins them.

A real unique id carries the address of the root's bootstrap socket; so does the fake's:
``make_id()`` starts a root in this process (a thread behind a local authenticated socket) and
returns 128 bytes naming it. Each rank's communicator connects to the root (``RemoteWorld``),
which waits for all ``ndev`` ranks, then runs each collective once every rank has sent its
part: it checks that they agree, combines the parts and sends every rank the result. A rank
that leaves (its process ended, or it destroyed its communicator) fails the others' pending
and later calls with an error, as NCCL reports a remote failure.

Framing: ``multiprocessing.connection`` byte messages; each call is a JSON header then the
send buffer's bytes. Nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener

import numpy as np

__all__ = ["MAGIC", "RemoteWorld", "make_id", "parse_id"]

MAGIC = b"FAKENCCL"
TIMEOUT = 60.0  # seconds a rank waits for the others (real NCCL waits without limit)


def make_id() -> bytes:
    """A fresh unique id: the address and key of a new root in this process."""
    key = os.urandom(32)
    listener = Listener(("127.0.0.1", 0), authkey=key)
    threading.Thread(target=_Root(listener).serve, name="fake-nccl-root", daemon=True).start()
    port = listener.address[1]
    raw = MAGIC + struct.pack("!H", port) + key
    return raw + bytes(128 - len(raw))


def parse_id(key: bytes) -> tuple[int, bytes] | None:
    """``(port, authkey)`` of an id :func:`make_id` made, ``None`` for any other id."""
    if not key.startswith(MAGIC):
        return None
    (port,) = struct.unpack("!H", key[len(MAGIC):len(MAGIC) + 2])
    return port, key[len(MAGIC) + 2:len(MAGIC) + 34]


class _Root:
    """Accepts ``ndev`` ranks, then serves their collectives in order until one leaves."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def serve(self) -> None:
        ranks: dict[int, Connection] = {}
        try:
            ndev = None
            while ndev is None or len(ranks) < ndev:
                conn = self.listener.accept()
                hello = json.loads(conn.recv_bytes())
                ndev = hello["ndev"] if ndev is None else ndev
                ranks[hello["rank"]] = conn
            for conn in ranks.values():
                conn.send_bytes(b"R")
            while True:
                calls = []
                for r in range(ndev):
                    header = json.loads(ranks[r].recv_bytes())
                    calls.append((header, ranks[r].recv_bytes()))
                for r, result in enumerate(_run(calls)):
                    ranks[r].send_bytes(result)
        except (EOFError, OSError):
            pass  # a rank left: closing the others' connections fails their calls
        finally:
            self.listener.close()
            for conn in ranks.values():
                conn.close()


def _run(calls: list[tuple[dict, bytes]]) -> list[bytes]:
    """Every rank's reply to one collective: ``R`` and the result's bytes, or ``E`` and why
    not."""
    headers = [dict(h, rank=None) for h, _ in calls]
    if any(h != headers[0] for h in headers):
        return [b"E" + f"ranks disagree: {[h for h, _ in calls]}".encode()] * len(calls)
    kind, dtype, extra = headers[0]["kind"], np.dtype(headers[0]["dtype"]), headers[0]["extra"]
    result = combine(kind, [np.frombuffer(b, dtype) for _, b in calls], extra)
    return [b"R" + result.tobytes()] * len(calls)


def combine(kind: str, sends: list[np.ndarray], extra: int | None) -> np.ndarray:
    """The result of collective ``kind`` of the ranks' ``sends`` (``extra``: op or root)."""
    ufuncs = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum}
    if kind == "allReduce":
        result = sends[0].copy()
        for other in sends[1:]:
            ufuncs[extra](result, other, out=result)
        return result
    if kind == "broadcast":
        return sends[extra].copy()
    return np.concatenate(sends)


class RemoteWorld:
    """One rank's connection to the root named by an id (``ncclCommInitRank``: blocks until
    every rank joined, within :data:`TIMEOUT`)."""

    def __init__(self, port: int, authkey: bytes, ndev: int, rank: int,
                 buffer: Callable[[int, int, int], np.ndarray]) -> None:
        self.buffer = buffer
        self.conn = Client(("127.0.0.1", port), authkey=authkey)
        self.conn.send_bytes(json.dumps({"ndev": ndev, "rank": rank}).encode())
        self._receive("joining the communicator")

    def _receive(self, what: str) -> bytes:
        try:
            if not self.conn.poll(TIMEOUT):
                raise RuntimeError(f"fake NCCL: other ranks did not come within {TIMEOUT} s "
                                   f"({what})")
            return self.conn.recv_bytes()
        except (EOFError, OSError) as e:
            raise RuntimeError("fake NCCL: a remote rank left (its process ended or it "
                               f"destroyed its communicator) while {what}") from e

    def post(self, rank: int, kind: str, args: tuple, *, wait: bool) -> None:
        send, recv, count, dtype, *rest = args
        data = self.buffer(send, count, dtype)
        header = {"kind": kind, "dtype": data.dtype.str, "count": count,
                  "extra": rest[0] if rest else None, "rank": rank}
        try:
            self.conn.send_bytes(json.dumps(header).encode())
            self.conn.send_bytes(data.tobytes())
        except OSError as e:
            raise RuntimeError(f"fake NCCL: the root is gone ({kind})") from e
        reply = self._receive(kind)
        if reply[:1] == b"E":
            raise AssertionError(reply[1:].decode())
        result = np.frombuffer(reply[1:], data.dtype)
        self.buffer(recv, result.size, dtype)[:] = result

    def close(self) -> None:
        self.conn.close()


