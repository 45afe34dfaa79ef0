"""Choosing free TCP ports: the one port picker of clusterctl and of the tests.

:func:`pick_free_ports` asks the kernel for ``n`` ports by binding port 0. It guarantees only
what is true at the moment it returns: the ports are distinct and were free on ``host``. It
cannot reserve them: the sockets are closed before the ports are handed out, so another process
may bind one before its task does. Whoever uses a chosen port must handle "address in use"
(a task exits 203 and the launcher chooses again; a test that needs a port held should keep its
own socket bound instead).
"""

from __future__ import annotations

import socket

__all__ = ["pick_free_ports"]


def _bind_host(host: str) -> tuple[int, str]:
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    return family, bare


def pick_free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now.

    All ``n`` sockets are bound and listening together while choosing, so the ports differ from
    each other; they are closed before returning (see the module docstring for the race that
    leaves). ``host`` is an IPv4 address, a name, or an IPv6 address with or without brackets.

    Raises:
        OSError: ``host`` cannot be bound at all; the message names the host.
    """
    family, bare = _bind_host(host)
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(s)
            try:
                s.bind((bare, 0))
            except OSError as e:
                message = f"cannot choose a port on host {host!r}: {e.strerror}"
                raise OSError(e.errno, message) from e
            s.listen(1)  # ports in use stay unique across the n sockets
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
