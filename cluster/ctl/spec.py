"""The cluster file (``cluster.yaml``) as frozen dataclasses, validated once at the edge.

``load_cluster_file(path)`` parses the YAML keeping line numbers, checks every key and value,
and returns a :class:`ClusterFile`, or raises :class:`~cluster.errors.ClusterFileError` listing
*every* problem as ``FILE:LINE: KEY: what is wrong`` with a hint (the close match of a misspelt
key, the allowed values). Nothing is started before a file validates. docs/guide/cluster-file.md is
the reference of every key.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cluster._address import check_address
from cluster._placement import JOB_NAMES
from cluster.ctl._checker import Checker, Problem, kind_of, scalar_text
from cluster.ctl._elastic import ENV_ELASTIC, Elastic, elastic_problems, parse_elastic
from cluster.ctl._network import check_ports, parse_host, parse_port_base
from cluster.ctl._resources import parse_resources
from cluster.ctl._timeouts import HEARTBEAT_RANGE, Timeouts, env_problems, parse_timeouts
from cluster.ctl._tls_spec import TlsSpec, parse_tls
from cluster.ctl._yaml import Located, YamlError, load
from cluster.ctl.policy import COLLECTIVE, COORDINATOR, MODES
from cluster.errors import ClusterFileError

__all__ = [
    "MODES",
    "ClusterFile",
    "Elastic",
    "JobSpec",
    "Limits",
    "HEARTBEAT_RANGE",
    "MAX_FILE_BYTES",
    "MAX_TASKS",
    "Problem",
    "RestartPolicy",
    "Timeouts",
    "TlsSpec",
    "load_cluster_file",
    "parse_cluster_file",
]

MAX_TASKS = 1024  # default limits.max_tasks (docs/guide/cluster-file.md, "Limits at scale")
MAX_FILE_BYTES = 1 << 20  # a cluster file larger than this is refused unread
RESERVED_ENV = ("TF_CONFIG", "CLUSTER_TOKEN", "CLUSTER_ERROR_FILE", "CLUSTER_LAUNCHER_PID",
                "CLUSTER_RESTART_COUNT", ENV_ELASTIC)
RESTART_POLICIES = ("exit-code", "on-failure", "never")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class RestartPolicy:
    """``max_restarts`` whole-cluster restarts; ``policy`` says which failures restart:
    ``exit-code`` (Kubeflow: root cause exit code >= 128), ``on-failure`` (any), ``never``.
    ``max_worker_restarts`` (``mode: coordinator`` and elastic runs only): how many times each
    worker (elastic: chief or worker) that dies is restarted alone, per attempt, before the run
    goes on without it."""

    max_restarts: int = 0
    policy: str = "exit-code"
    max_worker_restarts: int = 3

    def __post_init__(self) -> None:
        if (self.max_restarts < 0 or self.policy not in RESTART_POLICIES
                or self.max_worker_restarts < 0):
            raise ValueError(f"invalid restart policy: {self}")


@dataclass(frozen=True)
class Limits:
    """Sanity bounds checked before anything is started. ``max_tasks``: most tasks (of every
    job) one cluster file may have; a file over it is refused before a port is chosen, so a
    typo like ``worker: 100000`` costs nothing. Raise it with ``limits: {max_tasks: N}``."""

    max_tasks: int = MAX_TASKS

    def __post_init__(self) -> None:
        if not self.max_tasks >= 1:
            raise ValueError(f"limits.max_tasks must be >= 1, got {self.max_tasks!r}")


@dataclass(frozen=True)
class JobSpec:
    """A job: ``count`` tasks, at ``addresses`` when given, else on ports chosen at launch."""

    name: str
    count: int
    addresses: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.name not in JOB_NAMES or self.count < 0:
            raise ValueError(f"invalid job: {self}")
        if self.addresses is not None and len(self.addresses) != self.count:
            raise ValueError(f"job {self.name}: {self.count} tasks but {self.addresses}")


@dataclass(frozen=True)
class ClusterFile:
    """A validated cluster file. Paths are absolute; ``jobs`` in chief/worker/ps/evaluator order
    (jobs with no task omitted). ``mode``: ``collective`` (chief, workers and evaluators run the
    entrypoint) or ``coordinator`` (only the chief and evaluators do; workers serve the chief's
    ClusterCoordinator; needs a chief and a worker). ``resources``: per job, Kubernetes
    quantities (``{"worker": {"cpu": "2"}}``) for ``clusterctl render``; launch ignores them.
    ``elastic``: the bounds of an elastic run (:mod:`cluster.ctl._elastic`), ``None`` if not."""

    path: Path
    name: str
    jobs: tuple[JobSpec, ...]
    entrypoint: Path | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    workdir: Path = Path(".")
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port_base: int | None = None
    restart: RestartPolicy = RestartPolicy()
    log_dir: Path = Path("runs")
    timeouts: Timeouts = Timeouts()
    mode: str = COLLECTIVE
    limits: Limits = Limits()
    resources: dict[str, dict[str, str]] = field(default_factory=dict)  # Kubernetes only
    tls: TlsSpec | None = None  # mutual TLS: cluster/ctl/_tls_spec.py
    timeline: bool = False  # write RUN_DIR/timeline.json (cluster.ctl._telemetry)
    elastic: Elastic | None = None

    def __post_init__(self) -> None:
        if (self.entrypoint is None) == (self.module is None):
            raise ValueError("exactly one of entrypoint and module must be given")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == COORDINATOR and not (self.has_chief and self.count("worker")):
            raise ValueError("mode coordinator needs a chief and at least one worker")
        total = sum(job.count for job in self.jobs)
        if total > self.limits.max_tasks:
            raise ValueError(f"{total} tasks exceed limits.max_tasks = {self.limits.max_tasks}")
        if self.elastic is not None:
            broken = elastic_problems(self.elastic.min, self.elastic.max, self.jobs, self.mode)
            if broken:
                raise ValueError(f"elastic {self.elastic}: {broken[0][0]}")

    def tasks(self) -> list[tuple[str, int]]:
        """Every task as ``(job, index)``, in cluster order."""
        return [(job.name, i) for job in self.jobs for i in range(job.count)]

    @property
    def has_chief(self) -> bool:
        return any(job.name == "chief" and job.count for job in self.jobs)

    def count(self, job: str) -> int:
        """How many tasks ``job`` has (0 when the file has none)."""
        return sum(j.count for j in self.jobs if j.name == job)

    def runs_entrypoint(self, job: str) -> bool:
        """Whether tasks of ``job`` run the entrypoint (else they serve until stopped)."""
        if job == "ps":
            return False
        return self.mode == COLLECTIVE or job in ("chief", "evaluator")

    def task_argv(self, job: str) -> tuple[str, ...]:
        """The interpreter arguments of a ``job`` task: ``("-m", "ps")``, ``("-m", "worker")``
        (serve only) or ``("-m", "worker", SCRIPT, *ARGS)`` / ``("-m", "worker", "-m", MODULE,
        *ARGS)``; the same for every host and launcher (``python`` + these)."""
        if job == "ps":
            return ("-m", "ps")
        if not self.runs_entrypoint(job):
            return ("-m", "worker")
        if self.module is not None:
            return ("-m", "worker", "-m", self.module, *self.args)
        return ("-m", "worker", str(self.entrypoint), *self.args)


_TOP_KEYS = ("name", "mode", "entrypoint", "module", "args", "workdir", "env", "cluster", "host",
             "port_base", "restart", "log_dir", "timeouts", "limits", "resources", "tls",
             "timeline", "elastic")
_RESTART_KEYS = ("max_restarts", "policy", "max_worker_restarts")
_LIMIT_KEYS = ("max_tasks",)


def _jobs(c: Checker, node: Located) -> list[JobSpec]:
    before = len(c.problems)
    jobs_node = c.mapping(node, "cluster", JOB_NAMES, "job names to task counts or addresses")
    if jobs_node is None:
        return []
    jobs = []
    seen: dict[str, str] = {}
    for name in JOB_NAMES:
        if name not in jobs_node:
            continue
        job = jobs_node[name]
        key = f"cluster.{name}"
        if isinstance(job.value, list):
            addresses = []
            for i, item in enumerate(job.value):
                problem = check_address(item.value)
                if problem:
                    c.add(item.line, f"{key}[{i}]", problem, 'write "host:port", e.g. '
                          '"127.0.0.1:2222"')
                elif item.value in seen:
                    c.add(item.line, f"{key}[{i}]", f"address {item.value} is also "
                          f"{seen[item.value]}", "every task needs its own host:port")
                else:
                    seen[item.value] = f"{name}:{i}"
                    addresses.append(item.value)
            if len(addresses) == len(job.value):
                jobs.append(JobSpec(name, len(addresses), tuple(addresses)))
            continue
        value = job.value
        if isinstance(value, bool) or not isinstance(value, int):
            c.add(job.line, key, f"expected a task count or a list of addresses, got "
                  f"{kind_of(value)}", 'e.g. `worker: 2` or `worker: ["host0:2222", "host1:2222"]`')
            continue
        if value < 0:
            c.add(job.line, key, f"negative task count {value}",
                  "a count is 0 or more (0 means no such job)")
            continue
        jobs.append(JobSpec(name, value))
    tasks = {j.name: j.count for j in jobs}
    if tasks.get("chief", 0) > 1:
        c.add(jobs_node["chief"].line, "cluster.chief", f"at most one chief, got {tasks['chief']}",
              "use `chief: 1` and put the other tasks under `worker`")
    if not (tasks.get("chief", 0) or tasks.get("worker", 0)) and len(c.problems) == before:
        c.add(node.line, "cluster", "no chief and no worker: nothing would run the entrypoint",
              "add `worker: 1` (or `chief: 1`)")
    return [j for j in jobs if j.count]


_MODE_HINT = (f"{COLLECTIVE} (default: chief and workers all run the entrypoint) or "
              f"{COORDINATOR} (parameter-server training: only the chief runs it)")


def _mode(c: Checker, node: Located) -> str | None:
    value = node.value
    if isinstance(value, str) and value in MODES:
        return value
    allowed = ", ".join(MODES)
    if not isinstance(value, str):
        c.add(node.line, "mode", f"expected one of {allowed}, got {kind_of(value)}", _MODE_HINT)
        return None
    close = difflib.get_close_matches(value, MODES, n=1)
    c.add(node.line, "mode", f"unknown mode {value!r} (allowed: {allowed})",
          f'did you mean "{close[0]}"?' if close else _MODE_HINT)
    return None


def _check_coordinator(c: Checker, node: Located, jobs: tuple[JobSpec, ...]) -> None:
    """``mode: coordinator`` needs a chief (it runs the entrypoint, the ClusterCoordinator)
    and a worker (the coordinator schedules functions on workers); ps may be 0 or more."""
    counts = {j.name: j.count for j in jobs}
    if not counts.get("chief"):
        c.add(node.line, "mode", f"{COORDINATOR} needs a chief: only the chief runs the "
              "entrypoint (the ClusterCoordinator)", "add `chief: 1` under `cluster:`, or use "
              f"`mode: {COLLECTIVE}` for workers that all run the entrypoint")
    if not counts.get("worker"):
        c.add(node.line, "mode", f"{COORDINATOR} needs at least one worker: the "
              "coordinator schedules its functions on workers", "add e.g. `worker: 2` under "
              "`cluster:`")


@dataclass(frozen=True)
class _Where:
    """What every section parser may need: the file's directory (relative paths resolve
    against it), the line of the top-level mapping (for missing keys) and the run's mode."""

    base: Path
    root_line: int
    mode: str = COLLECTIVE
    mode_ok: bool = True  # False when ``mode:`` itself was invalid
    elastic: bool = False  # the file has an ``elastic:`` key


def _name(c: Checker, top: dict[str, Located], where: _Where) -> str:
    name = where.base.name or "cluster"
    if "name" in top:
        given = c.string(top["name"], "name")
        if given is not None and not _NAME_RE.match(given):
            c.add(top["name"].line, "name", f"{given!r} is not a valid run name",
                  "use letters, digits, '.', '_' and '-'")
        elif given is not None:
            name = given
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)


def _program(c: Checker, top: dict[str, Located], where: _Where) -> dict[str, Any]:
    """``entrypoint`` (a script, resolved) or ``module``: exactly one."""
    if "entrypoint" in top and "module" in top:
        c.add(top["module"].line, "module", "give either entrypoint or module, not both")
    elif "entrypoint" in top:
        script = c.string(top["entrypoint"], "entrypoint")
        if script is not None:
            resolved = (where.base / script).resolve()
            if not resolved.is_file():
                c.add(top["entrypoint"].line, "entrypoint", f"file not found: {resolved}",
                      "the path is relative to the cluster file's directory")
            return {"entrypoint": resolved}
    elif "module" in top:
        module = c.string(top["module"], "module")
        if module is not None and not _MODULE_RE.match(module):
            c.add(top["module"].line, "module", f"{module!r} is not a dotted module name")
        return {"module": module}
    else:
        c.add(where.root_line, "entrypoint", "missing: what should chief and workers run?",
              "add `entrypoint: train.py` (relative to this file) or `module: pkg.train`")
    return {}


def _args(c: Checker, node: Located) -> tuple[str, ...] | None:
    if not isinstance(node.value, list):
        c.add(node.line, "args", f"expected a list, got {kind_of(node.value)}",
              'e.g. args: ["--epochs", "3"]')
        return None
    args = []
    for i, item in enumerate(node.value):
        text_value = scalar_text(item.value)
        if text_value is None:
            c.add(item.line, f"args[{i}]", f"expected a string, got {kind_of(item.value)}")
        else:
            args.append(text_value)
    return tuple(args)


def _workdir(c: Checker, top: dict[str, Located], where: _Where) -> Path:
    if "workdir" not in top:
        return where.base
    workdir = c.string(top["workdir"], "workdir")
    if workdir is None:
        return where.base
    resolved = (where.base / workdir).resolve()
    if not resolved.is_dir():
        c.add(top["workdir"].line, "workdir", f"directory not found: {resolved}")
    return resolved


def _env(c: Checker, node: Located) -> dict[str, str] | None:
    if not isinstance(node.value, dict):
        c.add(node.line, "env", f"expected a mapping of variables, got {kind_of(node.value)}",
              "e.g. env: {OMP_NUM_THREADS: \"1\"}")
        return None
    env = {}
    for var, item in node.value.items():
        line = node.key_lines[var]
        text_value = scalar_text(item.value)
        if not _ENV_RE.match(var):
            c.add(line, f"env.{var}", "not a valid environment variable name")
        elif var in RESERVED_ENV:
            c.add(line, f"env.{var}", "is set by clusterctl for each task", "remove it from env")
        elif text_value is None:
            c.add(item.line, f"env.{var}", f"expected a string, got {kind_of(item.value)}")
        else:
            env[var] = text_value
    return env


def _cluster(c: Checker, top: dict[str, Located], where: _Where) -> tuple[JobSpec, ...] | None:
    """The jobs, and in coordinator mode the jobs that mode needs (when the jobs are valid)."""
    if "cluster" not in top:
        c.add(where.root_line, "cluster", "missing", "add e.g. `cluster: {chief: 1, worker: 2}`")
        return None
    before = len(c.problems)
    jobs = tuple(_jobs(c, top["cluster"]))
    if where.mode == COORDINATOR and len(c.problems) == before:
        _check_coordinator(c, top["mode"], jobs)
    return jobs


def _restart(c: Checker, node: Located, where: _Where) -> RestartPolicy | None:
    restart = c.mapping(node, "restart", _RESTART_KEYS, "restart settings")
    if restart is None:
        return None
    kwargs: dict[str, Any] = {}
    if "max_restarts" in restart:
        n = c.number(restart["max_restarts"], "restart.max_restarts", minimum=0, strict=False,
                     integer=True)
        if n is not None:
            kwargs["max_restarts"] = int(n)
    if "policy" in restart:
        policy = restart["policy"].value
        if policy not in RESTART_POLICIES:
            close = difflib.get_close_matches(str(policy), RESTART_POLICIES, n=1)
            c.add(restart["policy"].line, "restart.policy", f"unknown policy {policy!r}",
                  f'did you mean "{close[0]}"?' if close
                  else f"one of {', '.join(RESTART_POLICIES)}")
        else:
            kwargs["policy"] = policy
    if "max_worker_restarts" in restart:
        item = restart["max_worker_restarts"]
        n = c.number(item, "restart.max_worker_restarts", minimum=0, strict=False, integer=True)
        if n is not None and where.mode_ok and where.mode != COORDINATOR and not where.elastic:
            c.add(item.line, "restart.max_worker_restarts", "only applies to "
                  f"`mode: {COORDINATOR}` or an elastic run (this file's mode is {where.mode})",
                  f"add `mode: {COORDINATOR}` or remove this key (or add `elastic:`); in "
                  f"{COLLECTIVE} mode a failure restarts the whole cluster "
                  "(restart.max_restarts)")
        elif n is not None:
            kwargs["max_worker_restarts"] = int(n)
    return RestartPolicy(**kwargs)


def _log_dir(c: Checker, top: dict[str, Located], where: _Where) -> Path:
    log_dir = c.string(top["log_dir"], "log_dir") if "log_dir" in top else None
    path = (where.base / Path(log_dir).expanduser()).resolve() if log_dir else where.base / "runs"
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():  # launch could never make a run dir
        c.add(top["log_dir"].line if "log_dir" in top else where.root_line, "log_dir",
              f"{blocker} is a file, not a directory, so {path} cannot be made",
              "point log_dir at a directory (it is made when missing)")
    return path


def _limits(c: Checker, node: Located) -> Limits | None:
    limits = c.mapping(node, "limits", _LIMIT_KEYS, "limits")
    if limits is None:
        return None
    if "max_tasks" not in limits:
        return Limits()
    n = c.number(limits["max_tasks"], "limits.max_tasks", minimum=1, strict=False, integer=True)
    return None if n is None else Limits(max_tasks=int(n))


def _check_counts(c: Checker, top: dict[str, Located], jobs: tuple[JobSpec, ...],
                  limits: Limits) -> None:
    """The total number of tasks against ``limits.max_tasks``: checked here, before any port
    is chosen or any process started (a ``worker: 100000`` typo would otherwise bind thousands
    of sockets, then fork until the process limit)."""
    total = sum(job.count for job in jobs)
    if total > limits.max_tasks:
        biggest = max(jobs, key=lambda j: j.count)
        cluster = top["cluster"].value
        line = cluster[biggest.name].line if isinstance(cluster, dict) else top["cluster"].line
        per_job = ", ".join(f"{j.name}: {j.count}" for j in jobs)
        c.add(line, f"cluster.{biggest.name}", f"{total} tasks ({per_job}) exceed "
              f"limits.max_tasks = {limits.max_tasks}",
              f"if this is no typo, add `limits: {{max_tasks: {total}}}` (each task is a "
              "process with its own interpreter; see docs/guide/cluster-file.md)")


def _top_level(file: str, text: str, c: Checker) -> tuple[Located, dict[str, Located]]:
    """The YAML's top-level mapping; raises :class:`ClusterFileError` when there is none."""
    try:
        root = load(text)
    except YamlError as e:
        hint = e.hint or "check the indentation and quoting around this line"
        raise ClusterFileError([Problem(file, e.line, "", f"invalid YAML: {e}", hint)]) from e
    if root is None:
        raise ClusterFileError([Problem(file, 1, "", "the file is empty",
                                        "a minimal file has `entrypoint:` and `cluster:`")])
    top = c.mapping(root, "", _TOP_KEYS, "settings")
    if top is None:
        raise ClusterFileError(c.problems)
    return root, top


def parse_cluster_file(text: str, path: Path, *, tls_files: bool = True) -> ClusterFile:
    """Validate ``text`` as the cluster file at ``path`` (relative paths resolve against its
    directory). Raises :class:`ClusterFileError` listing every problem, sorted by line.
    ``tls_files=False`` skips checking that ``tls.dir`` holds the certificates (``clusterctl
    certs`` is about to write them).

    Each section parser adds its problems to one list and returns what it could read (None
    only after adding a problem); sections are read in a fixed order, so problems on the same
    line keep a stable order.
    """
    c = Checker(str(path))
    root, top = _top_level(str(path), text, c)
    where = _Where(base=path.resolve().parent, root_line=root.line, elastic="elastic" in top)
    values: dict[str, Any] = {"name": _name(c, top, where)}
    if "mode" in top:
        mode = _mode(c, top["mode"])
        where = replace(where, mode=mode or COLLECTIVE, mode_ok=mode is not None)
        if mode is not None:
            values["mode"] = mode
    values.update(_program(c, top, where))
    if "args" in top:
        values["args"] = _args(c, top["args"])
    values["workdir"] = _workdir(c, top, where)
    if "env" in top:
        values["env"] = _env(c, top["env"])
    values["jobs"] = _cluster(c, top, where)
    if "host" in top:
        values["host"] = parse_host(c, top["host"])
    if "port_base" in top and top["port_base"].value is not None:
        values["port_base"] = parse_port_base(c, top["port_base"])
    if "restart" in top:
        values["restart"] = _restart(c, top["restart"], where)
    values["log_dir"] = _log_dir(c, top, where)
    if "timeouts" in top:
        values["timeouts"] = parse_timeouts(c, top["timeouts"])
    if values.get("env"):
        env_problems(c, top["env"], values["env"], values.get("timeouts", Timeouts()))
    if "limits" in top:
        values["limits"] = _limits(c, top["limits"])
    if "resources" in top:
        values["resources"] = parse_resources(c, top["resources"])
    if "tls" in top:
        values["tls"] = parse_tls(c, top["tls"], where.base, values["jobs"] or (), tls_files)
    if "timeline" in top:
        if isinstance(top["timeline"].value, bool):
            values["timeline"] = top["timeline"].value
        else:
            c.add(top["timeline"].line, "timeline",
                  f"expected true or false, got {kind_of(top['timeline'].value)}",
                  "timeline: true writes RUN_DIR/timeline.json")
    if "elastic" in top:
        values["elastic"] = parse_elastic(c, top["elastic"], values["jobs"] or None,
                                          where.mode if where.mode_ok else None)
    if values["jobs"] and values.get("limits", Limits()) is not None:
        _check_counts(c, top, values["jobs"], values.get("limits", Limits()))
    if values["jobs"] and values.get("host", "") is not None:
        check_ports(c, top, values["jobs"], values.get("host", ClusterFile.host),
                    values.get("port_base"))
    if c.problems:
        raise ClusterFileError(sorted(c.problems, key=lambda p: p.line))
    return ClusterFile(path=path.resolve(), **values)


def load_cluster_file(path: str | Path, *, tls_files: bool = True) -> ClusterFile:
    """Read and validate a cluster file; :class:`ClusterFileError` when unreadable or invalid.

    At most :data:`MAX_FILE_BYTES` are read (a cluster file is a few hundred bytes; listing
    every address of 10,000 tasks takes ~250 KB), and the text must be UTF-8, as YAML 1.2 says.
    ``tls_files=False`` skips checking that a ``tls: {dir: ...}`` directory holds the files
    (``clusterctl certs`` writes them).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ClusterFileError([Problem(str(path), 0, "", f"cannot read the file: "
                                        f"{e.strerror or e}")]) from e
    if len(data) > MAX_FILE_BYTES:
        raise ClusterFileError([Problem(str(path), 0, "", f"larger than {MAX_FILE_BYTES:,} "
                                        "bytes: not a cluster file",
                                        "a cluster file is a short YAML mapping; see "
                                        "docs/guide/cluster-file.md")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ClusterFileError([Problem(str(path), line, "", f"not UTF-8 text: byte "
                                        f"0x{data[e.start]:02x} at offset {e.start}",
                                        "save the file as UTF-8")]) from e
    return parse_cluster_file(text, path, tls_files=tls_files)
