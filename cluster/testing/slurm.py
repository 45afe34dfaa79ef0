"""A real Slurm on this machine for tests: ``munged``, ``slurmctld`` and two ``slurmd``.

:func:`local_slurm` writes ``slurm.conf`` and ``cgroup.conf`` into a directory, starts the
daemons in the foreground as its own children (so it knows every PID), and yields a
:class:`LocalSlurm` once ``sinfo`` shows both nodes idle. Both nodes have ``NodeAddr=127.0.0.1``
and their own port; their names resolve to two distinct loopback addresses through
``/etc/hosts`` lines added for the occasion, so tasks of different nodes bind different
addresses, as on two machines. Node names, addresses and ports are fresh for every instance, so
two test sessions on one machine do not meet.

On exit (however the body ended): every job is cancelled and awaited, each daemon is stopped by
its PID (SIGTERM, then SIGKILL), every process still carrying the instance's marker in its
environment (a ``slurmstepd``, a task) is killed and reported, and the ``/etc/hosts`` lines are
removed. :class:`SlurmLeakError` is raised after the clean-up if anything was left.

Needs root (``slurmd`` runs jobs as their user, ``/etc/hosts``) and Debian's ``slurm-wlm`` and
``munge`` (22.05 here): :func:`unavailable` says what is missing, for a skip reason. Slurm
clients find this cluster through ``SLURM_CONF``: run them with :meth:`LocalSlurm.env`.

Example::

    with local_slurm(tmp_dir) as slurm:
        subprocess.run(["srun", "-N2", "-n3", "hostname"], env=slurm.env(), timeout=60)
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cluster.ctl.ports import pick_free_ports
from cluster.deadline import Deadline
from cluster.testing._probes import kill_and_wait, processes_with, wait_gone

__all__ = ["BINARIES", "LocalSlurm", "SlurmLeakError", "SlurmStartError", "local_slurm",
           "unavailable"]

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scancel")
HOSTS = Path("/etc/hosts")
MARKER_VAR = "TEST_LOCAL_SLURM"
_POLL = 0.2  # seconds between sinfo/squeue queries: Slurm offers nothing to wait on
_hosts_lock = threading.Lock()


class SlurmStartError(RuntimeError):
    """The local Slurm did not come up; the message holds the daemons' log tails."""


class SlurmLeakError(AssertionError):
    """Processes of the local Slurm (a slurmstepd, a task) outlived it; they were killed."""


def unavailable() -> str | None:
    """Why a local Slurm cannot run here (a skip reason), or ``None`` when it can."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (f"Slurm is not installed: {', '.join(missing)} missing (apt-get install "
                "slurm-wlm munge)")
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd, /etc/hosts)"
    return None


@dataclass
class LocalSlurm:
    """A running local Slurm: ``conf`` is its ``slurm.conf``, ``nodes`` its node names (sorted:
    TF's order is Slurm's), ``addresses`` what they resolve to, ``marker`` a value every daemon
    (and so every slurmstepd) has in its environment as ``TEST_LOCAL_SLURM``."""

    root: Path
    conf: Path
    nodes: tuple[str, ...]
    addresses: tuple[str, ...]
    marker: str
    _daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def nodelist(self) -> str:
        return ",".join(self.nodes)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment for a Slurm client (``SLURM_CONF``), plus ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra or {})
        return env

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (``sinfo``, ``squeue``...), its output captured."""
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` as ``sinfo`` reports it (``idle``, ``alloc``, ``down*``...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def jobs(self) -> list[str]:
        """Ids of the jobs Slurm still knows as pending or running."""
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def wait_jobs_gone(self, timeout: float) -> list[str]:
        """Job ids still queued or running after at most ``timeout`` s (``[]``: none)."""
        deadline = Deadline.after(timeout)
        while True:
            left = self.jobs()
            if not left or deadline.expired:
                return left
            threading.Event().wait(min(_POLL, deadline.remaining()))

    def logs(self) -> str:
        """The tail of every daemon's log, for error messages."""
        parts = []
        for log in sorted(self.root.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def _slurm_conf(root: Path, nodes: tuple[str, ...], ctld_port: int,
                node_ports: list[int]) -> str:
    node_lines = "\n".join(
        f"NodeName={node} NodeAddr=127.0.0.1 Port={port} CPUs=8 RealMemory=2000 State=UNKNOWN"
        for node, port in zip(nodes, node_ports, strict=True))
    return f"""\
# A two-node Slurm on one machine for cluster-runtime's tests (cluster/testing/slurm.py).
ClusterName=cluster-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
# No cgroups (not every container has them): processes tracked by parentage, no binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# The nodes claim 8 CPUs each on a 2-core machine: trust slurm.conf, not the hardware.
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
# sbatch --wait polls every 2 s while 2 s < MinJobAge / 2, else every 8 then 32 s (22.05's
# _job_wait): 4 keeps it at 2 s. Completed jobs are then forgotten after 4 s.
MinJobAge=4
{node_lines}
PartitionName=debug Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
"""


_CGROUP_CONF = """\
# Unused with ProctrackType=proctrack/linuxproc and TaskPlugin=task/none; present so that no
# system-wide cgroup.conf is read.
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
"""


def _add_hosts(lines: list[str], tag: str) -> None:
    # /etc/hosts may be a bind mount (containers): rewrite it in place, never rename over it.
    with _hosts_lock, open(HOSTS, "r+") as f:
        text = f.read()
        if text and not text.endswith("\n"):
            text += "\n"
        f.seek(0)
        f.write(text + "".join(f"{line}  # {tag}\n" for line in lines))
        f.truncate()


def _remove_hosts(tag: str) -> None:
    with _hosts_lock, open(HOSTS, "r+") as f:
        kept = [line for line in f.read().splitlines(keepends=True) if f"# {tag}" not in line]
        f.seek(0)
        f.write("".join(kept))
        f.truncate()


def _remove_stale_hosts() -> None:
    """Remove /etc/hosts lines of local Slurms none of whose processes is alive (a test run
    killed before its teardown could not remove them)."""
    with open(HOSTS) as f:
        tags = set(re.findall(r"# (cluster-test-slurm-[0-9a-f]+)", f.read()))
    for tag in tags:
        if not processes_with(tag):
            _remove_hosts(tag)


def _die_with_parent() -> list[str]:
    """A command prefix that makes a daemon die with the process that started it: a test run
    killed before its teardown (a CI time limit, ``timeout`` around pytest) must not leave
    Slurm running. util-linux ``setpriv`` sets the parent-death signal, then execs."""
    return ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []


def _start(slurm: LocalSlurm, name: str, argv: list[str]) -> None:
    log = open(slurm.root / f"{name}.out.log", "wb")  # the daemon's stdout and stderr
    env = slurm.env({MARKER_VAR: slurm.marker})
    try:
        slurm._daemons[name] = subprocess.Popen([*_die_with_parent(), *argv], stdout=log,
                                                stderr=subprocess.STDOUT, env=env,
                                                start_new_session=True)
    finally:
        log.close()


def _stop(slurm: LocalSlurm, name: str, grace: float) -> None:
    proc = slurm._daemons.pop(name, None)
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _wait_ready(slurm: LocalSlurm, timeout: float) -> None:
    deadline = Deadline.after(timeout)
    socket = slurm.root / "munge" / "socket"
    states: dict[str, str] = {}
    while not deadline.expired:
        for name, proc in slurm._daemons.items():
            if proc.poll() is not None:
                raise SlurmStartError(f"{name} exited {proc.returncode} while starting\n"
                                      f"{slurm.logs()}")
        if socket.exists():
            states = slurm.node_states()
            if len(states) == len(slurm.nodes) and all(s == "idle" for s in states.values()):
                return
        threading.Event().wait(min(_POLL, deadline.remaining()))
    raise SlurmStartError(f"the nodes were not idle after {timeout:g} s (sinfo: {states})\n"
                          f"{slurm.logs()}")


@contextlib.contextmanager
def local_slurm(root: Path, *, start_timeout: float = 60.0) -> Iterator[LocalSlurm]:
    """Run a two-node Slurm under ``root`` (an empty directory) for the ``with`` body; see the
    module docstring.

    Raises:
        SlurmStartError: a daemon exited, or the nodes were not idle within ``start_timeout``.
        SlurmLeakError: on exit, a process of this Slurm had outlived it (it was killed).
    """
    tag = f"cluster-test-slurm-{secrets.token_hex(4)}"
    prefix = f"ct{secrets.token_hex(2)}n"  # node names: unique to this instance, sorted as 1, 2
    nodes = (f"{prefix}1", f"{prefix}2")
    subnet = f"127.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}"
    addresses = (f"{subnet}.1", f"{subnet}.2")
    ctld_port, *node_ports = pick_free_ports("127.0.0.1", 1 + len(nodes))
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "munge", *(f"spool-{n}" for n in nodes)):
        (root / sub).mkdir()
    (root / "munge").chmod(0o755)  # munged wants its socket's directory open to everyone
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(128))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, nodes, ctld_port, node_ports))
    (root / "cgroup.conf").write_text(_CGROUP_CONF)
    slurm = LocalSlurm(root, conf, nodes, addresses, marker=tag)
    _remove_stale_hosts()
    _add_hosts([f"{a} {n}" for a, n in zip(addresses, nodes, strict=True)], tag)
    leaked: list[int] = []
    try:
        munge = root / "munge"
        _start(slurm, "munged", ["munged", "--foreground", "--force", f"--socket={munge}/socket",
                                 f"--key-file={key}", f"--pid-file={munge}/munged.pid",
                                 f"--log-file={root}/munged.log", f"--seed-file={munge}/seed"])
        _start(slurm, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)])
        for node in nodes:
            _start(slurm, f"slurmd-{node}", ["slurmd", "-D", "-f", str(conf), "-N", node])
        _wait_ready(slurm, start_timeout)
        yield slurm
    finally:
        try:
            if "slurmctld" in slurm._daemons:
                slurm.run("scancel", "--full", "--user=root", timeout=30)
                slurm.wait_jobs_gone(30)
        finally:
            before = processes_with(tag)  # the daemons and their children (slurmscriptd)
            for name in [n for n in slurm._daemons if n.startswith("slurmd-")]:
                _stop(slurm, name, grace=10)
            for name in ("slurmctld", "munged"):
                _stop(slurm, name, grace=10)
            wait_gone(before, 5)  # a child exits once it sees its daemon gone, not with it
            leaked = processes_with(tag)
            for pid in leaked:
                kill_and_wait(pid, 5)
            wait_gone(leaked, 10)
            _remove_hosts(tag)
    if leaked:
        raise SlurmLeakError(f"processes of the local Slurm outlived it (killed): {leaked}")
