"""Several hosts on one machine: each a network, mount, PID and UTS namespace, on one switch.

Multi-host behaviour (pods on Kubernetes, nodes of a cluster) is tested here with real kernels
parts instead of mocks. A :class:`NetnsCluster` makes:

- a *switch*: a network namespace of its own holding a bridge, so that no packet of a test ever
  touches this machine's own network namespace;
- per host: a network namespace (``eth0`` on a veth to the bridge, ``10.77.0.N/24``, ``lo``), and
  a long-lived *holder* process (``unshare --mount --pid --uts --fork``) whose namespaces every
  process of that host enters (:meth:`NetnsHost.command`, through ``nsenter``). The holder
  mounts a private ``/dev/shm`` (so co-location detection sees distinct hosts: see
  ``cluster.collectives.shm_segment.host_key``), a ``/proc`` of its PID namespace, sets the
  hostname, and sees ``/etc/hosts`` from ``/etc/netns/NETNS/hosts`` (``ip netns exec`` bind-mounts
  it), which holds every host's names: the test's DNS. Names can be published late
  (:meth:`NetnsCluster.publish`), as a Kubernetes Service does once a pod exists.

Faults, all silent (no RST): :meth:`NetnsCluster.partition` (nftables drop between two hosts),
:meth:`NetnsCluster.link_down`, :meth:`NetnsCluster.shape` (``tc tbf`` rate limit; this kernel has
no netem), :meth:`NetnsHost.kill` (SIGKILL to the host's PID 1: every process on it dies at once,
like a pod or a node that vanishes).

:meth:`NetnsCluster.close` kills every holder (and with it every process of every host), deletes
the namespaces and the ``/etc/netns`` folders; :func:`leftover_namespaces` lets tests check that
nothing leaked. Needs root, ``ip``, ``unshare`` and ``nsenter``; :func:`unavailable` says why not
when they are missing (the tests skip with that reason). ``nft`` is needed only for partitions.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from cluster.deadline import Deadline

__all__ = ["NetnsCluster", "NetnsError", "NetnsHost", "leftover_namespaces", "unavailable"]

SUBNET = "10.77.0"
NETNS_ETC = Path("/etc/netns")
_PREFIX = "crt"  # every namespace this module makes starts with it (the leak check looks for it)
_counter = itertools.count()
_COMMAND_TIMEOUT = 20.0


class NetnsError(RuntimeError):
    """A namespace command failed; the message holds the command and its output."""


def unavailable() -> str | None:
    """Why namespace hosts cannot be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    probe = f"{_PREFIX}probe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe])
    except NetnsError as e:
        return f"cannot create a network namespace: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=_COMMAND_TIMEOUT)
    return None


def leftover_namespaces(prefix: str = _PREFIX) -> list[str]:
    """Network namespaces named by this module that still exist (a leak when a test is over)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         timeout=_COMMAND_TIMEOUT).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = _COMMAND_TIMEOUT,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          input=stdin)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout).strip()}")
    return proc


class NetnsHost:
    """One emulated host. ``name`` is its hostname, ``address`` its IPv4 address on the switch,
    ``netns`` its network namespace's name, ``pid`` its PID 1 as this machine sees it."""

    def __init__(self, name: str, netns: str, address: str, veth: str) -> None:
        self.name = name
        self.netns = netns
        self.address = address
        self.veth = veth  # the switch-side end of its link
        self._holder: subprocess.Popen | None = None
        self.pid = 0

    def command(self, argv: Sequence[str | os.PathLike], *,
                cwd: str | os.PathLike | None = None) -> list[str]:
        """``argv`` run on this host: inside all its namespaces, in directory ``cwd`` (default:
        ``/``; this machine's files are visible: the mount namespace is a copy)."""
        wd = [f"--wd={os.fspath(cwd)}"] if cwd is not None else []
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "-p", "-u", *wd, "--",
                *(os.fspath(a) for a in argv)]

    def run(self, argv: Sequence[str], *, check: bool = True,
            timeout: float = _COMMAND_TIMEOUT) -> subprocess.CompletedProcess:
        """Run a short command on this host and wait for it (raises :class:`NetnsError` when
        ``check`` and it fails)."""
        return _run(self.command(argv), check=check, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the host's PID 1: the kernel kills every process of its PID namespace."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def renew(self, deadline: Deadline) -> None:
        """Kill everything on the host and give it fresh PID, mount and UTS namespaces (an
        empty ``/dev/shm``) on the same network namespace: a machine rebooted, or a pod's
        replacement scheduled where the old one ran (same address)."""
        self._stop_holder(deadline)
        self._start_holder(deadline)

    # -- set-up and tear-down (NetnsCluster's) ----------------------------------------------------

    def _start_holder(self, deadline: Deadline) -> None:
        script = ("mount -t tmpfs -o size=512m,mode=1777 tmpfs /dev/shm && "
                  f"hostname {self.name} && echo ready && exec sleep infinity")
        self._holder = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--pid", "--uts",
             "--fork", "--mount-proc", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        line = _read_line(self._holder, deadline)
        if line.strip() != "ready":
            raise NetnsError(f"host {self.name}: namespace holder did not start: {line.strip()}")
        # The holder is `unshare`; its only child is the PID 1 of the new namespaces.
        children = Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children")
        pids = children.read_text().split()
        if len(pids) != 1:
            raise NetnsError(f"host {self.name}: expected one child of unshare, got {pids}")
        self.pid = int(pids[0])

    def _stop_holder(self, deadline: Deadline) -> None:
        self.kill()
        if self._holder is not None:
            with contextlib.suppress(ProcessLookupError):
                self._holder.kill()
            try:
                self._holder.wait(timeout=max(deadline.remaining(), 1.0))
            except subprocess.TimeoutExpired:
                pass
            if self._holder.stdout is not None:
                self._holder.stdout.close()
            self._holder = None


def _read_line(proc: subprocess.Popen, deadline: Deadline) -> str:
    """The first line ``proc`` prints, or what it printed before exiting, within ``deadline``."""
    import select

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    while b"\n" not in data:
        ready, _, _ = select.select([fd], [], [], max(deadline.remaining(), 0.0))
        if not ready:
            raise NetnsError(f"namespace holder printed nothing in time: {data!r}")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


class NetnsCluster:
    """Hosts ``names`` on one switch; a context manager (``with NetnsCluster(["h1", "h2"])``).

    ``aliases`` maps a host to more names it answers to in every host's ``/etc/hosts`` (pod DNS
    names such as ``run-worker-0.run.default.svc``); ``late`` lists aliases left out until
    :meth:`publish` adds them. Every host sees every name, its own included.
    """

    def __init__(self, names: Sequence[str], *, aliases: Mapping[str, Iterable[str]] | None = None,
                 late: Iterable[str] = (), timeout: float = 30.0) -> None:
        if not names or len(set(names)) != len(names) or len(names) > 250:
            raise ValueError(f"host names must be 1-250 distinct names, got {list(names)}")
        tag = f"{_PREFIX}{os.getpid() % 100000}x{next(_counter)}"
        self.switch = f"{tag}-sw"
        self.hosts: dict[str, NetnsHost] = {
            name: NetnsHost(name, f"{tag}-h{i}", f"{SUBNET}.{i + 1}", f"v{i}")
            for i, name in enumerate(names)}
        self._aliases = {name: list((aliases or {}).get(name, ())) for name in names}
        self._late = set(late)
        self._published: set[str] = set()
        self._created: list[str] = []
        try:
            self._build(Deadline.after(timeout))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> NetnsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> NetnsHost:
        return self.hosts[name]

    # -- DNS ------------------------------------------------------------------------------------

    def publish(self, alias: str) -> None:
        """Make a late alias resolvable on every host from now on."""
        if alias not in self._late:
            raise ValueError(f"{alias!r} is not a late alias")
        self._published.add(alias)
        self._write_hosts_files()

    def hosts_file(self) -> str:
        """The ``/etc/hosts`` text every host sees now."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        for name, host in self.hosts.items():
            names = [name] + [a for a in self._aliases[name]
                              if a not in self._late or a in self._published]
            lines.append(f"{host.address}\t{' '.join(names)}")
        return "\n".join(lines) + "\n"

    def _write_hosts_files(self) -> None:
        text = self.hosts_file()
        for host in self.hosts.values():
            path = NETNS_ETC / host.netns / "hosts"
            # In place, never by rename: the hosts see this inode through a bind mount.
            with open(path, "r+" if path.exists() else "w") as f:
                f.write(text)
                f.truncate()

    # -- faults ---------------------------------------------------------------------------------

    def partition(self, a: str, b: str) -> None:
        """Silently drop every packet between hosts ``a`` and ``b`` (both directions, new and
        established connections alike: no RST, no ICMP). Needs ``nft``.

        One ``nft -f`` transaction per host: once ``a``'s returns, nothing passes between the
        two (``a`` drops both directions), so a caller timing from before this call over-counts
        by one command at most."""
        for src, dst in ((a, b), (b, a)):
            peer = self.hosts[dst].address
            # Declaring an existing table or chain again only adds the rules (isolate()).
            ruleset = ("table inet crt {\n"
                       "  chain input { type filter hook input priority 0; policy accept;\n"
                       f"    ip saddr {peer} drop; }}\n"
                       "  chain output { type filter hook output priority 0; policy accept;\n"
                       f"    ip daddr {peer} drop; }}\n"
                       "}\n")
            _run(["ip", "netns", "exec", self.hosts[src].netns, "nft", "-f", "-"], stdin=ruleset)

    def isolate(self, name: str) -> None:
        """Partition host ``name`` from every other host."""
        for other in self.hosts:
            if other != name:
                self.partition(name, other)

    def link_down(self, name: str) -> None:
        """Take host ``name``'s link down (its ``eth0``): it can reach no one, silently."""
        _run(["ip", "-n", self.hosts[name].netns, "link", "set", "eth0", "down"])

    def shape(self, name: str, rate: str = "100mbit") -> None:
        """Limit host ``name``'s link to ``rate`` both ways (``tc tbf`` on both veth ends)."""
        host = self.hosts[name]
        for netns, dev in ((host.netns, "eth0"), (self.switch, host.veth)):
            _run(["ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", dev, "root",
                  "tbf", "rate", rate, "burst", "256kb", "latency", "100ms"])

    # -- set-up and tear-down -------------------------------------------------------------------

    def _build(self, deadline: Deadline) -> None:
        _run(["ip", "netns", "add", self.switch])
        self._created.append(self.switch)
        sw = ["ip", "-n", self.switch]
        _run([*sw, "link", "add", "br0", "type", "bridge"])
        _run([*sw, "link", "set", "br0", "up"])
        _run([*sw, "link", "set", "lo", "up"])
        for host in self.hosts.values():
            _run(["ip", "netns", "add", host.netns])
            self._created.append(host.netns)
            (NETNS_ETC / host.netns).mkdir(parents=True, exist_ok=True)
            _run([*sw, "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                  "netns", host.netns])
            _run([*sw, "link", "set", host.veth, "master", "br0", "up"])
            hn = ["ip", "-n", host.netns]
            _run([*hn, "addr", "add", f"{host.address}/24", "dev", "eth0"])
            _run([*hn, "link", "set", "eth0", "up"])
            _run([*hn, "link", "set", "lo", "up"])
        self._write_hosts_files()
        for host in self.hosts.values():
            host._start_holder(deadline)

    def close(self, timeout: float = 20.0) -> None:
        """Kill every process of every host, delete the namespaces and their ``/etc/netns``
        folders. Idempotent; never raises for what is already gone."""
        deadline = Deadline.after(timeout)
        for host in self.hosts.values():
            host._stop_holder(deadline)
        for netns in reversed(self._created):
            # A namespace lives on while a process is still in it: retry until the holders
            # are reaped.
            while True:
                proc = _run(["ip", "netns", "del", netns], check=False)
                if proc.returncode == 0 or "No such file" in proc.stderr or deadline.expired():
                    break
                time.sleep(0.05)
            shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
        self._created.clear()
