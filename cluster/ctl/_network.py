"""The cluster file's network keys: ``host``, ``port_base`` and how the ports of counted jobs
fit beside the listed addresses. Part of :mod:`cluster.ctl.spec`'s validation; every check here
runs before any port is chosen or any process started.

- ``host`` must be a syntactically valid host (:func:`cluster._address.check_host`): a typo
  such as ``'no such host!'`` is refused by ``validate``, not by ``launch`` after it made a run
  directory; whether the name resolves is known only when ``launch`` binds on it.
- ``port_base``: jobs given as a count get consecutive ports from it; they must all be <= 65535
  and none may be an address a listed job already uses on the same host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cluster._address import check_host
from cluster.ctl._checker import Checker
from cluster.ctl._yaml import Located

__all__ = ["check_ports", "parse_host", "parse_port_base"]


class _Job(Protocol):
    name: str
    count: int
    addresses: tuple[str, ...] | None


def parse_host(c: Checker, node: Located) -> str | None:
    """``host:`` when valid; else a problem and None."""
    host = c.string(node, "host")
    if host is None:
        return None
    if ":" in host.strip("[]") and not host.startswith("["):
        c.add(node.line, "host", f"{host!r}: give the host only; ports are chosen",
              "write IPv6 hosts in brackets, e.g. [::1]")
        return None
    problem = check_host(host)
    if problem:
        c.add(node.line, "host", problem, "the host every task of a counted job binds on, "
              "e.g. 127.0.0.1 (default), 0.0.0.0 or a name of this machine")
        return None
    return host


def parse_port_base(c: Checker, node: Located) -> int | None:
    """``port_base:`` when an integer 1-65535; else a problem and None."""
    port = c.number(node, "port_base", minimum=1, strict=False, integer=True)
    if port is not None and port > 65535:
        c.add(node.line, "port_base", f"port {port} is above 65535")
        return None
    return None if port is None else int(port)


def check_ports(c: Checker, top: dict[str, Located], jobs: Sequence[_Job], host: str,
                port_base: int | None) -> None:
    """With ``port_base``: the counted jobs' consecutive ports must end at or below 65535 and
    must not repeat a listed address on ``host`` (that task could never bind it)."""
    if port_base is None:
        return
    counted = sum(job.count for job in jobs if job.addresses is None)
    line = top["port_base"].line
    if port_base + counted - 1 > 65535:
        c.add(line, "port_base", f"{counted} consecutive ports from {port_base} go past 65535",
              f"use port_base <= {max(1, 65536 - counted)}")
        return
    ports = range(port_base, port_base + counted)
    for job in jobs:
        for i, address in enumerate(job.addresses or ()):
            listed_host, _, port = address.rpartition(":")
            if listed_host.lower() == host.lower() and int(port) in ports:
                clear = _clear_of(jobs, host, counted, port_base)
                move = (f"use `port_base: {clear}`" if clear + counted - 1 <= 65535
                        else "list that task at another port")
                given = (f"ports {port_base}-{port_base + counted - 1}" if counted > 1
                         else f"port {port_base}")
                c.add(line, "port_base", f"the counted tasks get {given} on {host}, but "
                      f"{job.name}:{i} is listed at {address}",
                      f"{move} (every task needs its own host:port)")
                return


def _clear_of(jobs: Sequence[_Job], host: str, counted: int, start: int) -> int:
    """The first port_base from ``start`` whose ``counted`` ports miss every listed address."""
    taken = {int(a.rpartition(":")[2]) for job in jobs for a in job.addresses or ()
             if a.rpartition(":")[0].lower() == host.lower()}
    base = start
    while any(p in taken for p in range(base, base + counted)):
        base = max(p for p in range(base, base + counted) if p in taken) + 1
    return base
