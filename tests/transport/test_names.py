"""Pod start-up realities without pods: where a task binds, and peer names that resolve late.

The decision (:func:`choose_bind`) and the retry schedule (:class:`NameWatch`) are table-tested
with a fake resolver and clock; the runtime-level tests use a name that never resolves
(``.invalid`` is reserved: RFC 6761) so they need no namespaces. Multi-host runs are in
tests/kubernetes.
"""

from __future__ import annotations

import socket
import threading

import pytest

import cluster.runtime as runtime
from cluster.ctl.ports import pick_free_ports
from cluster.deadline import Deadline
from cluster.errors import PeersNotReadyError
from cluster.settings import TaskSettings
from cluster.transport.auth import Token
from cluster.transport.control_client import ControlClient
from cluster.transport.names import (
    NOT_RESOLVED,
    WILDCARD,
    Bind,
    NameWatch,
    bind_choice,
    choose_bind,
    host_of,
    is_ip,
    is_local_ip,
    listen,
    lookup,
)
from cluster.transport.server import TaskServer
from resolver import ClusterSpec, SimpleClusterResolver

pytestmark = pytest.mark.timeout(60)

NEVER = "pod-never-published.invalid"
LOCAL = {"127.0.0.1", "10.1.0.5"}


@pytest.mark.parametrize(("host", "resolved", "bound", "why"), [
    ("127.0.0.1", (), "127.0.0.1", Bind.SPEC),            # loopback clusters stay on loopback
    ("10.1.0.5", (), "10.1.0.5", Bind.SPEC),              # this host's address
    ("10.9.9.9", (), WILDCARD, Bind.NOT_LOCAL),           # NAT'd or someone else's
    ("::1", (), WILDCARD, Bind.NOT_LOCAL),                # not in LOCAL here (table only)
    ("pod-0.run.default.svc", (), WILDCARD, Bind.NOT_RESOLVED),
    ("pod-0.run.default.svc", ("10.1.0.5",), "pod-0.run.default.svc", Bind.SPEC),
    ("pod-0.run.default.svc", ("10.9.9.9",), WILDCARD, Bind.NOT_LOCAL),  # a stale record
    ("pod-0.run.default.svc", ("10.1.0.5", "10.9.9.9"), WILDCARD, Bind.NOT_LOCAL),
    ("localhost", ("127.0.0.1",), "localhost", Bind.SPEC),
    ("0.0.0.0", (), "0.0.0.0", Bind.SPEC),                # asked for: kept
    ("::", (), "::", Bind.SPEC),
])
def test_choose_bind_keeps_the_spec_address_when_it_is_this_hosts(host, resolved, bound,
                                                                  why) -> None:
    choice = choose_bind(host, resolved, lambda ip: ip in LOCAL)
    assert (choice.host, choice.why) == (bound, why)
    assert (choice.reason == "") == (why is Bind.SPEC)
    if why is not Bind.SPEC:
        assert host in choice.reason


def test_the_reason_for_an_unresolved_name_says_so() -> None:
    choice = choose_bind("pod-0.run.default.svc", (), lambda ip: False)
    assert choice.reason == f"pod-0.run.default.svc: {NOT_RESOLVED} (yet)"
    assert choice.address(2222) == "[::]:2222"
    assert choice.wildcard


@pytest.mark.parametrize(("address", "host"), [
    ("a.b.svc:2222", "a.b.svc"), ("[::1]:5", "::1"), ("127.0.0.1:0", "127.0.0.1")])
def test_host_of(address, host) -> None:
    assert host_of(address) == host


def test_is_ip_and_is_local_ip() -> None:
    assert is_ip("10.0.0.1") and is_ip("::1") and not is_ip("pod-0.svc")
    assert is_local_ip("127.0.0.1") and is_local_ip("127.3.4.5")
    assert not is_local_ip("192.0.2.1")  # TEST-NET-1: no interface holds it


def test_lookup_answers_for_names_that_resolve_and_empty_for_those_that_do_not() -> None:
    assert "127.0.0.1" in lookup("localhost") or "::1" in lookup("localhost")
    assert lookup(NEVER) == ()
    assert bind_choice("localhost:0").why is Bind.SPEC
    assert bind_choice("127.0.0.1:0").host == "127.0.0.1"


def test_listen_binds_the_given_host_and_the_wildcard_on_both_families() -> None:
    with listen("127.0.0.1") as s:
        assert s.getsockname()[0] == "127.0.0.1"
    if socket.has_dualstack_ipv6():
        # Checked without accepting anything from outside: the socket's options only.
        with listen(WILDCARD) as s:
            assert s.family == socket.AF_INET6
            assert s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0


# -- NameWatch: lazy resolution with retries --------------------------------------------------


class FakeDns:
    """Names that resolve once published; counts lookups; a clock moved by hand."""

    def __init__(self) -> None:
        self.published: set[str] = set()
        self.lookups: list[str] = []
        self.now = 100.0

    def lookup(self, host: str) -> tuple[str, ...]:
        self.lookups.append(host)
        return ("10.0.0.9",) if host in self.published else ()

    def clock(self) -> float:
        return self.now


def test_a_name_that_does_not_resolve_is_asked_again_with_backoff_then_cached() -> None:
    dns = FakeDns()
    # Binary fractions: the fake clock adds up exactly.
    watch = NameWatch(dns.lookup, clock=dns.clock, first=0.125, most=0.5)
    assert not watch.resolves("pod-1")
    assert not watch.resolves("pod-1")          # too soon: no second lookup
    assert len(dns.lookups) == 1
    waits = []
    for _ in range(4):                           # doubling up to `most`
        before = len(dns.lookups)
        step = 0.0
        while len(dns.lookups) == before:
            dns.now += 0.0625
            step += 0.0625
            assert not watch.resolves("pod-1")
        waits.append(step)
    assert waits == [0.125, 0.25, 0.5, 0.5]
    dns.published.add("pod-1")
    dns.now += 0.5
    assert watch.resolves("pod-1")
    count = len(dns.lookups)
    assert watch.resolves("pod-1") and len(dns.lookups) == count  # cached from now on
    assert watch.resolves("10.0.0.1") and len(dns.lookups) == count  # addresses: no lookup


def test_a_slow_lookup_never_holds_the_caller_past_its_timeout() -> None:
    release = threading.Event()

    def slow(host: str) -> tuple[str, ...]:
        release.wait(10)
        return ("10.0.0.9",)

    watch = NameWatch(slow)
    deadline = Deadline.after(5)
    assert not watch.resolves("pod-1", timeout=0.05)   # still looking: "not yet"
    assert not watch.resolves("pod-1", timeout=0.05)   # the same lookup, not a second one
    release.set()
    assert watch.resolves("pod-1", timeout=5)
    assert not deadline.expired


def test_a_broken_resolver_means_not_resolvable_yet() -> None:
    def broken(host: str) -> tuple[str, ...]:
        raise RuntimeError("resolver crashed")

    assert not NameWatch(broken).resolves("pod-1")


# -- the server and the runtime ---------------------------------------------------------------


def test_a_loopback_server_listens_on_loopback_only() -> None:
    with TaskServer("127.0.0.1:0", Token("t")) as server:
        assert server.bind_host == "127.0.0.1"
        assert server.address == f"127.0.0.1:{server.port}"


def test_health_checks_report_a_name_that_does_not_resolve_without_dialling() -> None:
    client = ControlClient("worker:0", Token("t"))
    try:
        answers = client.check({"worker:1": f"{NEVER}:2222"}, timeout=0.5)
    finally:
        client.close()
    assert answers["worker:1"].status == NOT_RESOLVED
    assert not answers["worker:1"].serving


def test_a_coordinator_whose_name_never_resolves_is_named_after_the_deadline() -> None:
    port = pick_free_ports("127.0.0.1", 1)[0]
    cluster = {"worker": [f"{NEVER}:2222", f"127.0.0.1:{port}"]}
    settings = TaskSettings(connect_timeout=2, heartbeat_interval=0.2, heartbeat_timeout=3,
                            token="t")
    rt = runtime.TaskRuntime.create(
        SimpleClusterResolver(ClusterSpec(cluster), task_type="worker", task_id=1), settings)
    try:
        with pytest.raises(PeersNotReadyError) as info:
            rt.wait_for_peers(Deadline.after(1.5))
    finally:
        rt.shutdown(grace=0)
    assert f"worker:0 ({NEVER}:2222) [{NOT_RESOLVED}]" in str(info.value)
    assert info.value.missing == [("worker:0", f"{NEVER}:2222", NOT_RESOLVED)]

