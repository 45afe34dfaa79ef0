"""Syntax of task addresses (``host:port``), checked before anything binds or connects.

One set of rules for the cluster file (``clusterctl validate``) and for ``TF_CONFIG`` (a task's
start-up, :func:`cluster._placement.resolve_placement`), so a bad address is refused the same
way, naming the fix, wherever it comes from:

- a host is an IPv4 address, an IPv6 address *in brackets* (``[::1]``, as in a URL: without
  them ``::1:2222`` cannot be split into host and port, and gRPC fails on it with
  "Misformatted domain name"), or a DNS name: dot-separated labels of letters, digits, ``-``
  and ``_`` (Docker Compose service names), at most 63 characters each and 253 in all;
- a port is an integer 1-65535;
- two tasks never share an address (the second could never bind it).

Only the syntax is checked: whether a name resolves is known only on the host that runs the
task.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

__all__ = ["check_address", "check_host", "duplicate_address"]

_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_NUMERIC = re.compile(r"^[0-9.]+$")


def check_host(host: object) -> str:
    """``""`` when ``host`` is a syntactically valid host (see the module docstring), else
    what is wrong with it and how to write it."""
    if not isinstance(host, str) or not host:
        return f"expected a host name or address, got {host!r}"
    if host.startswith("[") or host.endswith("]"):
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else None
        try:
            ipaddress.IPv6Address(inner or "")
        except ValueError:
            return f"{host!r} is not an IPv6 address in brackets, e.g. [::1]"
        return ""
    if ":" in host:
        return (f"IPv6 address {host!r} needs brackets: write [{host}] (otherwise its last "
                "':' reads as the port's)")
    if _NUMERIC.match(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host!r} is not an IPv4 address (four numbers 0-255)"
        return ""
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        return (f"{host!r} is not a valid host name: use letters, digits, '-' and '_' in "
                "dot-separated labels of up to 63 characters (or an IP address)")
    return ""


def check_address(address: object) -> str:
    """``""`` when ``address`` is a usable ``host:port`` (see the module docstring), else what
    is wrong."""
    if not isinstance(address, str):
        return f'expected a "host:port" string, got {address!r}'
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        return f'expected "host:port", got {address!r}'
    if host.startswith("[") != host.endswith("]"):
        return f"unbalanced brackets in IPv6 host of {address!r}"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"port must be an integer 1-65535, got {port!r} in {address!r}"
    problem = check_host(host)
    if problem and ":" in host and not host.startswith("["):
        return (f"IPv6 address in {address!r} needs brackets: write [{host}]:{port} "
                "(otherwise its last ':' reads as the port's)")
    return f"{problem} in {address!r}" if problem else ""


def duplicate_address(tasks: Iterable[tuple[str, str]]) -> tuple[str, str, str] | None:
    """The first ``(address, task, earlier_task)`` where two of ``tasks`` (``(task,
    address)`` pairs) share an address, or None. Host names compare case-insensitively."""
    seen: dict[str, str] = {}
    for task, address in tasks:
        key = address.lower()
        if key in seen:
            return address, task, seen[key]
        seen[key] = task
    return None
