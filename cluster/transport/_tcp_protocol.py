"""Bytes on a TCP data connection: the authentication handshake and the frame header.

Everything here is fixed-layout binary (``struct``); nothing read from a socket is ever
unpickled or handed to a general-purpose parser, and every length is bounded before anything is
allocated for it.

Handshake (the connecting rank *sends* on the connection, the accepting rank receives)::

    acceptor  -> connector:  MAGIC, server nonce (32 bytes)
    connector -> acceptor:   MAGIC, src rank, dst rank, world size, stream, client nonce,
                             client MAC
    acceptor  -> connector:  MAGIC, server MAC       (accepted)
                        or:  REFUSED, reason, zeros  (refused, then closed; same length)

Both MACs are HMAC-SHA256, keyed by the cluster token (an empty key in insecure loopback mode,
so a stray connection still cannot speak the protocol), over a transcript of both nonces, the
ranks, the world size, the stream and both task names; they differ by a role label, so one
side's MAC can never be replayed as the other's. The server nonce is fresh per connection, so a
recorded handshake cannot be replayed. The acceptor checks the client MAC with
``hmac.compare_digest`` before it reads a single frame and closes the connection on any
mismatch; the connector checks the server MAC before it sends any data, so it never talks to an
impostor.

A rank may open up to ``MAX_STREAMS`` connections to one peer (its *streams*, numbered from 0;
see :mod:`~cluster.transport._tcp_outbound`). The stream number is in the hello and in the
MACs, so it is authenticated like the ranks; the acceptor holds one connection per (source rank,
stream) and refuses a number of ``MAX_STREAMS`` or more (``BAD_STREAM``) before it is used.

Both sides send ``MAGIC_TLS`` in place of ``MAGIC`` when they run TLS once the handshake is done
(:mod:`~cluster.transport._tcp_tls`); a side that sees the other mode stops with a clear error.

The acceptor says *why* it refuses a connector it has heard out (``REFUSED`` and a reason byte),
so that the connector can tell a configuration error (``BAD_MAC``: another token or other task
names; ``NOT_A_PEER``, ``OTHER_GROUP``: another cluster spec; ``BAD_STREAM``: a stream this
protocol does not have), which retrying cannot mend, from a transient refusal (``DUPLICATE``: its
previous connection on that stream is not yet seen closed; ``CLOSING``).
A connection closed with no answer at all (the acceptor was busy, dropped it at its handshake
deadline, or is going away) is transient too, and never read as a wrong token. The reason tells
a caller without the token nothing it did not know: its MAC failed.

Frames: ``FRAME`` header (kind, lengths, key fields, payload size), then the group name and
signature (UTF-8), then the payload bytes. ``BYE`` (no payload) ends a connection cleanly; its
group field, when not empty, names the task the sender lost and is leaving because of (so the
receiver blames that task, not the sender, whatever else arrives first).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import struct
from typing import NamedTuple

__all__ = [
    "BYE",
    "DATA",
    "FRAME",
    "HELLO",
    "MAGIC",
    "MAGIC_TLS",
    "MAX_STREAMS",
    "NONCE_BYTES",
    "REFUSED",
    "SERVER_HELLO_BYTES",
    "SERVER_PROOF_BYTES",
    "Facts",
    "Refusal",
    "WireError",
    "client_mac",
    "decode_header",
    "decode_refusal",
    "encode_header",
    "encode_refusal",
    "new_nonce",
    "server_mac",
]

MAGIC = b"CRDATA02"  # protocol name and version; anything else is refused at once
MAGIC_TLS = b"CRDATAT2"  # the same, from a side that runs TLS after the handshake (_tcp_tls)
MAX_STREAMS = 2  # connections one rank may hold to one peer; streams are numbered 0..MAX - 1
NONCE_BYTES = 32
MAC_BYTES = 32
SERVER_HELLO_BYTES = len(MAGIC) + NONCE_BYTES
HELLO = struct.Struct("<8sIIII32s32s")  # magic, src, dst, world size, stream, client nonce, MAC
SERVER_PROOF_BYTES = len(MAGIC) + MAC_BYTES
REFUSED = b"CRDATANO"  # instead of MAGIC in the acceptor's answer: refused, reason follows


class Refusal(enum.IntEnum):
    """Why an acceptor refused a connector it heard out (the byte after ``REFUSED``)."""

    BAD_MAC = 1  # the client MAC is wrong: another CLUSTER_TOKEN, or other task names
    NOT_A_PEER = 2  # the claimed source rank is not in the acceptor's group
    OTHER_GROUP = 3  # authenticated, but another destination rank or world size
    DUPLICATE = 4  # the acceptor still holds a connection from this rank (transient)
    CLOSING = 5  # the acceptor is shutting down (transient)
    BAD_STREAM = 6  # authenticated, but a stream number of MAX_STREAMS or more

    @property
    def transient(self) -> bool:
        """Whether the connector may try again (within its deadline) and get in."""
        return self in (Refusal.DUPLICATE, Refusal.CLOSING)


DATA = 1
BYE = 2
FRAME = struct.Struct("<BHHIIQQ")  # kind, group len, signature len, step, chunk, seq, nbytes
MAX_GROUP_BYTES = 1024
MAX_SIGNATURE_BYTES = 16 << 10
MAX_PAYLOAD_BYTES = 1 << 40  # far beyond any real message; bounds what a bad header can ask for


class WireError(ValueError):
    """Bytes on a data connection that do not follow the protocol."""


class Header(NamedTuple):
    kind: int
    group_len: int
    signature_len: int
    step: int
    chunk: int
    seq: int
    nbytes: int


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


class Facts(NamedTuple):
    """What both MACs of one handshake cover: the connection (both nonces), who connects to whom
    in which group, and which of the connector's streams to the acceptor it is."""

    server_nonce: bytes
    client_nonce: bytes
    src: int
    dst: int
    world: int
    stream: int
    src_task: str
    dst_task: str


def _transcript(facts: Facts) -> bytes:
    return b"".join((
        MAGIC, facts.server_nonce, facts.client_nonce,
        struct.pack("<IIII", facts.src, facts.dst, facts.world, facts.stream),
        facts.src_task.encode(), b"\0", facts.dst_task.encode(),
    ))


def client_mac(key: bytes, facts: Facts) -> bytes:
    """What the connector proves: it holds ``key`` and means this connection, now."""
    return hmac.new(key, b"client\0" + _transcript(facts), hashlib.sha256).digest()


def server_mac(key: bytes, facts: Facts) -> bytes:
    """What the acceptor proves back, so the connector never sends data to an impostor."""
    return hmac.new(key, b"server\0" + _transcript(facts), hashlib.sha256).digest()


def encode_refusal(reason: Refusal) -> bytes:
    """The acceptor's answer that refuses a connector, as long as a proof."""
    return (REFUSED + bytes((reason,))).ljust(SERVER_PROOF_BYTES, b"\0")


def decode_refusal(answer: bytes) -> Refusal | None:
    """The reason in an acceptor's answer, or None when it is not a (known) refusal."""
    if len(answer) != SERVER_PROOF_BYTES or not answer.startswith(REFUSED):
        return None
    try:
        return Refusal(answer[len(REFUSED)])
    except ValueError:
        return None


def encode_header(kind: int, group: bytes, signature: bytes, step: int, chunk: int, seq: int,
                  nbytes: int) -> bytes:
    """The header and names of one frame; the payload (``nbytes``) follows it on the wire."""
    return FRAME.pack(kind, len(group), len(signature), step, chunk, seq, nbytes) + group + \
        signature


def decode_header(raw: bytes | memoryview) -> Header:
    """Parse and bound-check the fixed part of a frame header; raises :class:`WireError`."""
    header = Header(*FRAME.unpack(raw))
    if header.kind not in (DATA, BYE):
        raise WireError(f"unknown frame kind {header.kind}")
    if header.group_len > MAX_GROUP_BYTES or header.signature_len > MAX_SIGNATURE_BYTES:
        raise WireError("frame names are too long")
    if header.nbytes > MAX_PAYLOAD_BYTES:
        raise WireError(f"frame payload of {header.nbytes} bytes is beyond any real message")
    if header.kind == BYE and (header.nbytes or header.signature_len):
        raise WireError("goodbye frame with a body")
    return header
