"""Does a peer's host still answer for its port? One TCP connect, answered by the peer's kernel.

A task that stops heartbeating is dead, cut off, or alive but busy (a long C call that holds the
GIL, a big unpickle, a stop signal). Its heartbeats cannot tell these apart; a fresh connection
to its server can, without any help from its Python threads:

- dead: its listening socket is gone, so its kernel refuses at once (or its host is gone too:
  nothing answers);
- cut off (a silent partition): nothing comes back, and the connect times out;
- alive but busy: its kernel completes the handshake into the listen backlog whatever the
  process is doing, so the connect succeeds.

Callers declare a silent peer lost when it does not answer, and only report it as stalled when
it does (see :class:`~cluster.transport.membership.Membership` and
:class:`~cluster.transport.control.HeartbeatMonitor`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping

__all__ = ["PROBE_TIMEOUT", "RESOLVE_BOUND", "answering"]

PROBE_TIMEOUT = 0.5
"""Seconds a probe waits for a peer's kernel: a connect within a data centre takes well under a
millisecond, even to a loaded host, so this only bounds the wait for a cut-off one."""

RESOLVE_BOUND = 10.0
"""Seconds beyond the connect's timeout that :func:`answering` waits for its probes to report.
The connect's timeout bounds the wait on the network; this bounds only a name resolver that
hangs. A probe is not given up when the connect's timeout passes: in a loaded process (a
starved CPU, a C call holding the GIL) its thread may get its turn to report a connection that
succeeded long after, and a peer whose kernel answered must not be declared lost for that."""


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _connects(address: str, timeout: float) -> bool:
    try:
        with socket.create_connection(_split(address), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def answering(addresses: Mapping[str, str], timeout: float = PROBE_TIMEOUT,
              resolve_bound: float = RESOLVE_BOUND) -> set[str]:
    """The keys of ``addresses`` (``{name: "host:port"}``) whose kernel accepts a TCP
    connection within ``timeout`` seconds, all probed at once. Never raises. A name counts as
    not answering only when its probe finished and failed, or when it has not finished
    ``timeout + resolve_bound`` seconds after the call (a resolver that hangs); a probe whose
    thread merely reports late (a loaded process) still counts. The connection is closed at
    once (a server sees a client that left before saying anything)."""
    found: set[str] = set()
    lock = threading.Lock()

    def probe(name: str, address: str) -> None:
        if _connects(address, timeout):
            with lock:
                found.add(name)

    threads = [threading.Thread(target=probe, args=item, name=f"probe-{item[0]}", daemon=True)
               for item in addresses.items()]
    for thread in threads:
        thread.start()
    end = time.monotonic() + timeout + resolve_bound
    for thread in threads:
        # Only a hung resolver outlasts the connect's timeout by much: the join, not the
        # thread, is bounded, and never at the connect's timeout itself (see RESOLVE_BOUND).
        thread.join(max(0.0, end - time.monotonic()))
    with lock:
        return set(found)
