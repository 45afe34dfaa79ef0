"""Choosing free TCP ports: the one port picker of clusterctl and of the tests.

:func:`pick_free_ports` asks the kernel for ``n`` ports by binding port 0. It guarantees only
what is true at the moment it returns: the ports are distinct and were free on ``host``. It
cannot reserve them: the sockets are closed before the ports are handed out, so another process
may bind one before its task does. Whoever uses a chosen port must handle "address in use"
(a task exits 203 and the launcher chooses again; a test that needs a port held should keep its
own socket bound instead).

Holding ``n`` sockets at once needs ``n`` file descriptors beyond those already open:
:func:`ensure_fd_limit` raises the soft ``RLIMIT_NOFILE`` (often 1024) up to the hard limit when
that is needed, and says which limit to raise when even the hard limit is too low.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import resource
import socket

__all__ = ["ensure_fd_limit", "pick_free_ports", "taken_addresses"]

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


def pick_free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now.

    All ``n`` sockets are bound and listening together while choosing, so the ports differ from
    each other; they are closed before returning (see the module docstring for the race that
    leaves). ``host`` is an IPv4 address, a name, or an IPv6 address with or without brackets.

    Raises:
        OSError: ``host`` cannot be bound at all (the message names the host), or ``n``
            sockets cannot be open at once (see :func:`ensure_fd_limit`).
    """
    ensure_fd_limit(n, f"choosing {n} ports")
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
