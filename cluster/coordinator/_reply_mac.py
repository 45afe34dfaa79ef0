"""The MAC on a worker's reply to ``Worker.Run``: what lets the coordinator unpickle it.

Trust model. A function travels as cloudpickle bytes, and unpickling runs code, so both ends
authenticate before they unpickle: the worker's token interceptor refuses a call without the
cluster token before the handler sees it, and the coordinator unpickles a reply only after
checking its HMAC-SHA256, keyed by the same token and bound to the request's fresh nonce and run
id (a forged or replayed reply is refused). Anyone who holds the token can run code on every
worker: treat ``CLUSTER_TOKEN`` like an SSH key. Without a token (an insecure loopback cluster)
nothing is authenticated, so such a cluster must only run where every local user is trusted.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from cluster.transport.auth import Token

__all__ = ["reply_mac", "verify_reply"]


def reply_mac(token: Token, nonce: bytes, run_id: int, outcome: int, payload: bytes) -> bytes:
    """The MAC a worker puts on its reply to run ``run_id`` (request nonce ``nonce``)."""
    key = (token.value or "").encode()
    mac = hmac.new(key, b"run-reply\0", hashlib.sha256)
    mac.update(struct.pack("<HQI", len(nonce), run_id, outcome))
    mac.update(nonce)
    mac.update(payload)
    return mac.digest()


def verify_reply(token: Token, nonce: bytes, run_id: int, outcome: int, payload: bytes,
                 mac: bytes) -> bool:
    """True when ``mac`` is :func:`reply_mac` of these fields (compared in constant time)."""
    return hmac.compare_digest(reply_mac(token, nonce, run_id, outcome, payload), mac)
