"""Host names and addresses at start-up: what a task binds, and whether a peer's name resolves yet.

On Kubernetes a task's address is a DNS name (``run-worker-1.run.default.svc:2222``) that the
cluster's DNS publishes only once the pod exists, and may publish seconds after the pod's process
starts; peers come up in any order, minutes apart. Two rules follow, both here:

**Binding** (:func:`bind_choice`, the pure decision :func:`choose_bind`). A server binds the
address the cluster spec gives it when that address is this host's (``127.0.0.1`` clusters never
listen on other interfaces). When it is not -- a name that does not resolve yet, a name that
resolves elsewhere (a stale record of a replaced pod), an address behind NAT -- the task serves
on every interface of its host (``[::]``, dual stack, IPv4 ``0.0.0.0`` where the kernel has no
IPv6) rather than fail: in a pod, "every interface" is the pod's own network namespace (its pod
IP and loopback), and every call is authenticated by the cluster token anyway. The pod IP alone
would need the Downward API in every manifest and is only one of a dual-stack pod's addresses.

**Peer names** (:class:`NameWatch`). A name that does not resolve yet means "not ready", like a
refused connection, never a fatal error. Callers ask :meth:`NameWatch.resolves` before a peer's
first call and retry within their connect deadline; lookups run on a thread of their own, so a
slow DNS server never holds a caller past its deadline, and a failed lookup is repeated with
backoff (50 ms doubling to 1 s). gRPC channels are only dialled once the name resolves: a channel
whose own first lookup failed waits out gRPC's resolver backoff (1 s growing by 1.6x up to 120 s),
so a peer published 30 s late was found 10-13 s later (measured, tests/kubernetes). When the
deadline passes, the caller's error lists the peer with :data:`NOT_RESOLVED`.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "NOT_RESOLVED",
    "WILDCARD",
    "Bind",
    "BindChoice",
    "NameWatch",
    "bind_choice",
    "choose_bind",
    "host_of",
    "is_ip",
    "is_local_ip",
    "listen",
    "lookup",
    "peer_names",
]

log = logging.getLogger(__name__)

NOT_RESOLVED = "name does not resolve"
"""The status a start-up wait reports for a peer whose host name does not resolve (yet)."""

WILDCARD = "::"
"""The host a task binds when its own address is not this host's: every interface."""
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


def host_of(address: str) -> str:
    """The host of ``host:port`` without IPv6 brackets: ``"[::1]:5" -> "::1"``."""
    return address.rpartition(":")[0].strip("[]")


def is_ip(host: str) -> bool:
    """``host`` (without brackets) is an IPv4 or IPv6 literal, not a name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_local_ip(ip: str) -> bool:
    """``ip`` is an address of this host (of this network namespace): binding it works.

    Loopback addresses are local without asking; others are probed with a bind to port 0, which
    the kernel refuses (EADDRNOTAVAIL) for an address no interface holds.
    """
    address = ipaddress.ip_address(ip)
    if address.is_loopback:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
    except OSError:
        return False
    return True


def lookup(host: str) -> tuple[str, ...]:
    """The addresses ``host`` resolves to now (``()`` when it does not resolve). Blocks for as
    long as the system resolver takes: call it through :class:`NameWatch` where a deadline
    applies."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


class Bind(enum.Enum):
    """Why a server listens where it does."""

    SPEC = "the spec's address is this host's"
    NOT_RESOLVED = "the spec's host name does not resolve (yet)"
    NOT_LOCAL = "the spec's address is not this host's"


@dataclass(frozen=True)
class BindChoice:
    """Where a server listens: ``host`` (a name, an address or :data:`WILDCARD`), ``why``, and
    when that is not the spec's host, ``reason`` (for the log line that says so)."""

    host: str
    why: Bind = Bind.SPEC
    reason: str = ""

    @property
    def wildcard(self) -> bool:
        return self.host in _WILDCARDS

    def address(self, port: int) -> str:
        """``host:port`` as gRPC writes it (IPv6 in brackets)."""
        return f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"


def choose_bind(host: str, resolved: Sequence[str], is_local: Callable[[str], bool]
                ) -> BindChoice:
    """Where to listen for a task whose address has host ``host`` (no brackets).

    ``resolved``: the addresses a name resolves to now (``()``: none, or ``host`` is an
    address); ``is_local(ip)``: whether ``ip`` is this host's. The spec's host when it is this
    host's (a local address, or a name whose every address is local); else :data:`WILDCARD`
    with the reason. A wildcard in the spec is kept as it is.

    >>> choose_bind("127.0.0.1", (), lambda ip: True).host
    '127.0.0.1'
    >>> choose_bind("pod-1.run.default.svc", (), lambda ip: False).host
    '::'
    """
    if host in _WILDCARDS:
        return BindChoice(host)
    if is_ip(host):
        if is_local(host):
            return BindChoice(host)
        return BindChoice(WILDCARD, Bind.NOT_LOCAL, f"{host} is not an address of this host")
    if not resolved:
        return BindChoice(WILDCARD, Bind.NOT_RESOLVED, f"{host}: {NOT_RESOLVED} (yet)")
    foreign = [ip for ip in resolved if not is_local(ip)]
    if not foreign:
        return BindChoice(host)
    return BindChoice(WILDCARD, Bind.NOT_LOCAL,
                      f"{host} resolves to {', '.join(foreign)}, not an address of this host")


def bind_choice(address: str) -> BindChoice:
    """:func:`choose_bind` for ``host:port`` on this host (one lookup for a name)."""
    host = host_of(address)
    resolved = () if is_ip(host) or host in _WILDCARDS else lookup(host)
    return choose_bind(host, resolved, is_local_ip)


def listen(host: str, port: int = 0, backlog: int = 64) -> socket.socket:
    """A listening TCP socket on ``host`` (a :class:`BindChoice`'s host): the wildcard listens
    on IPv6 and IPv4 both where the kernel can (IPv4 only otherwise), an IPv6 address on IPv6."""
    host = host.strip("[]")
    if host in _WILDCARDS:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("::", port), family=socket.AF_INET6, backlog=backlog,
                                        dualstack_ipv6=True)
        return socket.create_server(("0.0.0.0", port), backlog=backlog)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class _Pending:
    """One lookup in flight."""

    def __init__(self) -> None:
        self.done = threading.Event()


class NameWatch:
    """Whether peers' host names resolve yet; see the module docstring.

    A name that resolved once is taken as resolvable from then on (gRPC re-resolves it itself).
    A failed lookup is repeated no sooner than ``first`` s later, the wait doubling up to
    ``most`` s. ``lookup`` and ``clock`` are injectable for tests. Thread-safe.
    """

    def __init__(self, lookup: Callable[[str], Sequence[str]] = lookup, *,
                 clock: Callable[[], float] = time.monotonic, first: float = 0.05,
                 most: float = 1.0) -> None:
        self._lookup = lookup
        self._clock = clock
        self._first = first
        self._most = most
        self._lock = threading.Lock()
        self._resolved: set[str] = set()
        self._retry: dict[str, tuple[float, float]] = {}  # host: (not before, next wait)
        self._pending: dict[str, _Pending] = {}

    def resolves(self, host: str, timeout: float = 1.0) -> bool:
        """Whether ``host`` (a name or an address, no brackets) resolves now.

        Starts a lookup unless one is in flight or the last failure is too recent, and waits for
        it at most ``timeout`` s; a lookup still running then counts as "not yet" and its answer
        is kept for the next call.
        """
        if is_ip(host) or host in _WILDCARDS:
            return True
        with self._lock:
            if host in self._resolved:
                return True
            pending = self._pending.get(host)
            if pending is None:
                not_before, _ = self._retry.get(host, (0.0, self._first))
                if self._clock() < not_before:
                    return False
                pending = self._pending[host] = _Pending()
                threading.Thread(target=self._run, args=(host, pending), daemon=True,
                                 name=f"lookup {host}").start()
        pending.done.wait(max(timeout, 0.0))
        with self._lock:
            return host in self._resolved

    def _run(self, host: str, pending: _Pending) -> None:
        try:
            found = bool(self._lookup(host))
        except Exception:  # noqa: BLE001 - a broken resolver is "not resolvable yet", logged
            log.exception("looking up %s failed", host)
            found = False
        with self._lock:
            del self._pending[host]
            if found:
                self._resolved.add(host)
                self._retry.pop(host, None)
            else:
                _, wait = self._retry.get(host, (0.0, self._first))
                self._retry[host] = (self._clock() + wait, min(wait * 2, self._most))
        pending.done.set()

    def forget(self, host: str) -> None:
        """Look ``host`` up again next time (tests; a name known to have gone)."""
        with self._lock:
            self._resolved.discard(host)
            self._retry.pop(host, None)


peer_names = NameWatch()
"""The process's watch over peer names, shared by every client of the transport (a cache of
answers, no connections: tests that need their own make a :class:`NameWatch`)."""
