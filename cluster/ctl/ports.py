"""Choosing free TCP ports: the one port picker of clusterctl and of the tests.

:func:`pick_free_ports` chooses ``n`` ports outside the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default on Linux): from
:data:`PICK_FROM` and above the range's top, at random, each checked free by binding it. It
guarantees only what is true at the moment it returns: the ports are distinct and were free on
``host``. It cannot reserve them: the sockets are closed before the ports are handed out. But
outside the ephemeral range nothing is handed a port by the kernel (an outgoing connection's
source port, a ``bind`` to port 0), so between the choice and the task's bind only a process
that binds that very port can take it, where inside it any busy host's connections could.
Where the range is unknown or leaves no room, the kernel chooses (a bind to port 0). Whoever
uses a chosen port must still handle "address in use" (a task exits 203 and the launcher
chooses again; a test that needs a port held should keep its own socket bound instead).

Holding ``n`` sockets at once needs ``n`` file descriptors beyond those already open:
:func:`ensure_fd_limit` raises the soft ``RLIMIT_NOFILE`` (often 1024) up to the hard limit when
that is needed, and says which limit to raise when even the hard limit is too low.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import random
import resource
import socket
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PICK_FROM", "ensure_fd_limit", "ephemeral_range", "pick_free_ports",
           "taken_addresses"]

PICK_FROM = (20000, 30000)
"""Ports chosen first, below Linux's default ephemeral range: clear of the well-known and the
registered services' low ports, and of Kubernetes' NodePort range (30000-32767), which a node
routes to services."""

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")

_FD_SLACK = 64  # descriptors kept free for what the process opens meanwhile (logs, pipes, gRPC)


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: count nothing, the slack covers the usual few
        return 0


def ensure_fd_limit(extra: int, what: str) -> int:
    """Make room for ``extra`` more open file descriptors than this process holds now (plus a
    slack), raising the soft ``RLIMIT_NOFILE`` towards the hard limit if needed; returns the
    soft limit in force. ``what`` names the need in the error (``"choosing 256 ports"``).

    Raises:
        OSError: (``EMFILE``) even the hard limit is too low; the message says how many
            descriptors are needed and to raise ``ulimit -Hn``.
    """
    needed = _open_fds() + extra + _FD_SLACK
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return soft
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise OSError(errno.EMFILE, f"{what} needs about {needed} open files but the hard "
                      f"limit (RLIMIT_NOFILE) is {hard}: raise it (`ulimit -Hn {needed}` as "
                      "root, or LimitNOFILE= in a systemd unit)")
    target = hard if hard != resource.RLIM_INFINITY else needed
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def _bind_host(host: str) -> tuple[int, str]:
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    return family, bare


def ephemeral_range(path: Path | None = None) -> tuple[int, int] | None:
    """The kernel's ephemeral port range (lowest, highest), or None where it cannot be read."""
    try:
        low, high = (int(v) for v in (path or _EPHEMERAL).read_text().split()[:2])
    except (OSError, ValueError):
        return None
    return (low, high) if 0 < low <= high <= 65535 else None


def _candidates(ephemeral: tuple[int, int] | None) -> Iterator[int]:
    """Ports outside ``ephemeral`` to try, in random order: :data:`PICK_FROM` first, then
    those above the range's top. Drawn one at a time (a Fisher-Yates shuffle that stops where
    the caller does): a pick tries a few of the ~15,000, and shuffling them all cost ~13 ms."""
    if ephemeral is None:
        return
    low, high = ephemeral
    rng = random.SystemRandom()  # not the user's seeded random: it may be shared
    for pool in ([p for p in range(*PICK_FROM) if not low <= p <= high],
                 list(range(max(high + 1, PICK_FROM[1]), 65536))):
        for i in range(len(pool)):
            j = rng.randrange(i, len(pool))
            pool[i], pool[j] = pool[j], pool[i]
            yield pool[i]


def pick_free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now, outside the ephemeral range.

    All ``n`` sockets are bound and listening together while choosing, so the ports differ from
    each other; they are closed before returning (see the module docstring for the race that
    leaves). ``host`` is an IPv4 address, a name, or an IPv6 address with or without brackets.

    Raises:
        OSError: ``host`` cannot be bound at all (the message names the host), or ``n``
            sockets cannot be open at once (see :func:`ensure_fd_limit`).
    """
    ensure_fd_limit(n, f"choosing {n} ports")
    family, bare = _bind_host(host)
    candidates = _candidates(ephemeral_range())
    sockets = []
    try:
        while len(sockets) < n:
            s = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(s)
            while True:
                port = next(candidates, 0)  # 0 once none is left: the kernel chooses
                try:
                    s.bind((bare, port))
                    break
                except OSError as e:
                    if port and e.errno in (errno.EADDRINUSE, errno.EACCES):
                        continue  # taken, or reserved for another user: the next one
                    message = f"cannot choose a port on host {host!r}: {e.strerror}"
                    raise OSError(e.errno, message) from e
            s.listen(1)  # ports in use stay unique across the n sockets
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _probe_host(host: str) -> str | None:
    """The address to probe for ``host`` (an IP literal or ``localhost``), else None: a name
    is not resolved here (that could block on DNS), and a host elsewhere cannot be probed."""
    bare = host.strip("[]")
    if bare.lower() == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        return None
    return bare


def taken_addresses(addresses: dict[str, str]) -> list[str]:
    """The keys of ``addresses`` (``task -> "host:port"``) whose port some process already
    listens on, on this machine. Probes by binding (``SO_REUSEADDR``, so connections of an
    earlier run in ``TIME_WAIT`` do not count); an address that cannot be probed (a name, a host
    of another machine, an address this machine lacks) is assumed free: its task reports it."""
    taken = []
    for task, address in addresses.items():
        host, _, port = address.rpartition(":")
        probe = _probe_host(host)
        if probe is None or not port.isdigit():
            continue
        family = socket.AF_INET6 if ":" in probe else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((probe, int(port)))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    taken.append(task)
    return taken
