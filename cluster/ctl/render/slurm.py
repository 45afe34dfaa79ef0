"""``clusterctl render FILE --format slurm``: a cluster file as an sbatch script.

The script runs every task of the file as one Slurm job step, the way ``clusterctl launch`` runs
them on one host:

- ``srun --kill-on-bad-exit=1`` starts one process per task across the allocation; with
  ``--distribution=block`` Slurm's ranks are the ranks :class:`resolver.SlurmClusterResolver`
  assumes. Tasks learn the cluster from the step (:mod:`cluster.task_source`), so nothing here
  names a host or a port: ``CLUSTER_SLURM_JOBS`` says how many tasks each job has, in TF's rank
  order (jobs sorted by name: chief, evaluator, ps, worker).
- Roles that run different commands (``python -m ps``; workers of ``mode: coordinator``, which
  serve with no script) get ``--multi-prog`` with a config written inside the job.
- ``CLUSTER_TOKEN`` is made inside the job from ``/dev/urandom``: it is never in the script, on a
  command line, or in the environment Slurm saved at submission.
- Ports: each node's tasks listen on ``BASE``, ``BASE + 1``, ... (the resolver's rule); ``BASE``
  moves with the job id so that two jobs sharing a node do not collide (a fixed ``port_base``
  from the file, or ``CLUSTER_SLURM_PORT_BASE`` set at submission, wins).
- Output: ``srun --label`` numbers each line by rank; a one-line ``awk`` filter turns the rank
  into clusterctl's ``[worker:1]`` prefix (the rank -> task table is fixed at render time).
- Exit code: ``srun`` returns the *highest* task exit code, so a task's permanent failure (1)
  would hide behind its peers' "peer failed" (201) or a signal (143). Each task's wrapper records
  its exit code (and the runtime its error record) in the run directory; at the end
  :mod:`cluster.ctl.slurm_outcome` names the root cause as clusterctl does and exits with its
  code. That needs the run directory (under ``log_dir``) on a filesystem every node sees, as
  the job's output usually is; without it the script falls back to srun's code (never 0 on
  failure).
- ``mode: coordinator``: the chief's exit ends the run (its servers serve until stopped): after
  a successful chief its wrapper sends SIGTERM to the step (servers exit 0), and
  ``srun --wait=GRACE`` kills whatever is left ``timeouts.grace`` seconds after the first exit.
  Workers that die are not restarted under Slurm: the run fails.

- Grace period: ``#SBATCH --signal=TERM@GRACE`` (``timeouts.grace``, rounded up) sends the
  tasks SIGTERM that long before the time limit, the notice a
  :class:`~cluster.checkpoint.PreemptionCheckpointHandler` saves on; at the limit itself Slurm
  sends SIGTERM again and SIGKILL ``KillWait`` (slurm.conf) later. Not ``B:``: that would
  signal the batch shell only, which waits on srun and would not pass it on. ``scancel`` and
  preemption (``GraceTime`` of the partition) give ``KillWait``/``GraceTime``: cluster settings
  a job cannot change, so the script prints a warning when ``KillWait`` is shorter than the
  grace. Tasks get ``CLUSTER_GRACE_PERIOD``.

- ``tls:``: the script makes a CA and one certificate naming the allocation's nodes (known
  only then) in the run directory, and gives every task ``CLUSTER_TLS_CERT``/``_KEY``/``_CA``.

- Elastic runs (``elastic: {min, max}``): the chief and worker ranks get
  ``CLUSTER_ELASTIC=MIN:MAX``, and their wrapper starts a task that dies again alone (same
  rank, node and port, after 1 s), as ``restart.policy`` says (``exit-code``: 128 and above;
  ``on-failure``: any failure; ``never``: none), up to ``restart.max_worker_restarts`` times,
  while the step's other tasks run on; not once Slurm has signalled it (scancel, the time
  limit). A task out of restarts ends the step (``--kill-on-bad-exit``). Whether the
  survivors can go on without a task is the runtime's to say.

Not rendered: ``restart`` outside elastic runs (Slurm's ``--requeue`` is the tool there),
``host``, and the addresses of jobs given as lists (Slurm's allocation decides the hosts; only
the counts are used).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from cluster.ctl._elastic import ELASTIC_JOBS, ENV_ELASTIC
from cluster.ctl.policy import COORDINATOR
from cluster.ctl.render.api import RenderError, RenderOptions, grace_seconds
from cluster.ctl.spec import ClusterFile
from cluster.settings import ENV_GRACE_PERIOD, ENV_STOP_WITH_COORDINATOR
from cluster.task_source import ENV_SLURM_JOBS, ENV_SLURM_PORT_BASE

__all__ = ["PORT_RANGE", "SlurmRenderError", "rank_order", "render", "render_slurm"]

# Ports a job's base is taken from: below Linux's ephemeral range (32768-60999), so a task's
# port is never an outgoing connection's source port.
PORT_RANGE = (10000, 32000)
_REPO_ROOT = Path(__file__).resolve().parents[3]  # holds the worker/ and ps/ packages

# Every task runs as `bash -c 'eval "$CLUSTER_TASK_WRAPPER"' JOB ARGS...` (JOB is only a label,
# bash's $0): the wrapper runs "$PYTHON" ARGS as its child (not exec'd), gives the runtime a
# per-rank error file and records the exit code, the time, whether Slurm had signalled the
# task and its node, for slurm_outcome. SIGTERM (scancel, --kill-on-bad-exit) reaches every
# process of the step, the task included; the trap keeps the wrapper alive to record what the
# task made of it.
_TASK = ('stopped=0; trap stopped=1 TERM INT; '
         'export CLUSTER_ERROR_FILE="$CLUSTER_RUN_DIR/$SLURM_PROCID.error.json"; '
         '"$PYTHON" "$@"; code=$?; '
         'echo "$code $(date +%s.%N) $stopped ${SLURMD_NODENAME:-?}" '
         '> "$CLUSTER_RUN_DIR/$SLURM_PROCID.exit"; ')
_TASK_WRAPPER = _TASK + 'exit "$code"'
# Elastic runs: the task runs again alone while RETRY holds (CLUSTER_TASK_RESTARTS times at
# most; 0 for ranks outside the group, which do not get CLUSTER_ELASTIC either); each start
# begins without the error record of the last.
_ELASTIC_TASK = ('stopped=0; trap stopped=1 TERM INT; '
                 'export CLUSTER_ERROR_FILE="$CLUSTER_RUN_DIR/$SLURM_PROCID.error.json"; '
                 'case " $CLUSTER_ELASTIC_RANKS " in *" $SLURM_PROCID "*) ;; '
                 '*) unset CLUSTER_ELASTIC; CLUSTER_TASK_RESTARTS=0 ;; esac; restarts=0; '
                 'while :; do rm -f "$CLUSTER_ERROR_FILE"; "$PYTHON" "$@"; code=$?; '
                 'if [ "$stopped" = 0 ] && [ "$restarts" -lt "$CLUSTER_TASK_RESTARTS" ] '
                 '&& {retry}; then restarts=$((restarts + 1)); '
                 'echo "[slurm] rank $SLURM_PROCID exited $code: restarting it alone (restart '
                 '$restarts of $CLUSTER_TASK_RESTARTS)" >&2; sleep 1; continue; fi; break; '
                 'done; '
                 'echo "$code $(date +%s.%N) $stopped ${{SLURMD_NODENAME:-?}}" '
                 '> "$CLUSTER_RUN_DIR/$SLURM_PROCID.exit"; exit "$code"')
_RETRY = {"exit-code": '[ "$code" -ge 128 ]', "on-failure": '[ "$code" -ne 0 ]',
          "never": "false"}
# mode: coordinator, the chief: its success ends the step (the servers exit 0 on SIGTERM).
_CHIEF_WRAPPER = (_TASK + 'if [ "$code" = 0 ]; then '
                  'scancel --signal=TERM "$SLURM_JOB_ID.$SLURM_STEP_ID" || true; fi; '
                  'exit "$code"')
_RUN_TASK = """bash -c 'eval "$CLUSTER_TASK_WRAPPER"'"""
_RUN_CHIEF = """bash -c 'eval "$CLUSTER_CHIEF_WRAPPER"'"""

# rank -> "[task] " prefix on srun --label's "RANK: " (padded with spaces for >= 10 tasks).
_PREFIX_AWK = ('BEGIN { n = split(tasks, t, " ") } '
               'match($0, /^ *[0-9]+: /) { r = substr($0, 1, RLENGTH - 2) + 0; '
               'if (r < n) { print "[" t[r + 1] "] " substr($0, RLENGTH + 1); fflush(); next } } '
               '{ print; fflush() }')


# Warns when slurm.conf's KillWait (SIGTERM to SIGKILL on scancel and at the time limit) is
# shorter than the grace period; `scontrol show config` prints "KillWait = 30 sec".
_KILL_WAIT_CHECK = (
    'kill_wait="$(scontrol show config 2>/dev/null | awk \'$1 == "KillWait" {{print $3}}\' '
    '|| true)"\n'
    'if [ -n "$kill_wait" ] && [ "$kill_wait" -lt {grace} ] 2>/dev/null; then\n'
    '  echo "[slurm] warning: KillWait is ${{kill_wait}} s, less than timeouts.grace ({grace} s):'
    ' a task saving on SIGTERM may be killed first" >&2\n'
    'fi')


# tls: in the cluster file. The nodes are known only now, so the CA and one certificate naming
# them are made here, in the run directory every node sees (a tls: {dir:} is not used: its
# certificates name the file's hosts, not the allocation's).
_TLS_LINES = [
    "# Mutual TLS (tls:): a CA and a certificate naming the allocation's nodes, made now.",
    '"$PYTHON" -m cluster.ctl.cli certs "$CLUSTER_RUN_DIR/tls" --days 30 --hosts '
    '$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
    'export CLUSTER_TLS_CERT="$CLUSTER_RUN_DIR/tls/cluster.pem" '
    'CLUSTER_TLS_KEY="$CLUSTER_RUN_DIR/tls/cluster.key" '
    'CLUSTER_TLS_CA="$CLUSTER_RUN_DIR/tls/ca.pem"',
]


class SlurmRenderError(RenderError):
    """The cluster file or the options cannot be rendered as an sbatch script (the CLI prints
    it and exits 2)."""


def rank_order(spec: ClusterFile) -> list[tuple[str, int]]:
    """Every task as ``(job, index)`` in Slurm rank order: TF's SlurmClusterResolver deals ranks
    to the jobs sorted by name (chief, evaluator, ps, worker), each job's tasks in index order."""
    return [(job.name, i) for job in sorted(spec.jobs, key=lambda j: j.name)
            for i in range(job.count)]


def _multi_prog_word(word: str, what: str) -> str:
    """``word`` quoted for a ``--multi-prog`` line. Slurm 22.05 groups single-quoted text and
    knows no escape, and replaces ``%t``/``%o`` even there: such words cannot be passed."""
    if "'" in word or "\n" in word or "%" in word:
        raise SlurmRenderError(f"{what} {word!r} cannot be passed through srun --multi-prog "
                               "(no single quote, % or newline); pass it another way, e.g. "
                               "through `env:`")
    return f"'{word}'"


def _check(spec: ClusterFile, nodes: int | None, partition: str | None,
           time_limit: str | None) -> int:
    total = len(spec.tasks())
    if nodes is not None and not 1 <= nodes <= total:
        raise SlurmRenderError(f"--nodes {nodes}: expected 1 to {total} (the file has {total} "
                               "tasks; a node without one would make srun fail)")
    for name, value in (("--partition", partition), ("--time", time_limit)):
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise SlurmRenderError(f"{name} {value!r}: expected one word, e.g. "
                                   f"{'gpu' if name == '--partition' else '1:00:00'}")
    return total


def _port_base(spec: ClusterFile, total: int) -> str:
    if spec.port_base is not None:
        return str(spec.port_base)
    low, high = PORT_RANGE
    slots = (high - low) // total  # a node has at most `total` tasks: blocks never overlap
    return f"$(( {low} + SLURM_JOB_ID % {slots} * {total} ))"


def render_slurm(spec: ClusterFile, *, nodes: int | None = None, partition: str | None = None,
                 time_limit: str | None = None, python: str | None = None) -> str:
    """The sbatch script (text, newline-terminated) that runs every task of ``spec`` as one
    Slurm job step; see the module docstring for what it does and why.

    ``nodes``: ``#SBATCH --nodes`` (default: Slurm decides); ``partition``, ``time_limit``:
    ``--partition``, ``--time`` when given; ``python``: the interpreter on the nodes (default:
    this one, ``sys.executable``; ``CLUSTER_PYTHON`` at submission overrides it).

    Raises:
        SlurmRenderError: ``nodes`` outside 1..tasks, a partition or time that is not one word,
            an argument that ``srun --multi-prog`` cannot carry.
    """
    total = _check(spec, nodes, partition, time_limit)
    order = rank_order(spec)
    names = [f"{job}:{i}" for job, i in order]
    jobs = ",".join(f"{job.name}:{job.count}" for job in spec.jobs)
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# {spec.name}: {total} tasks as one Slurm job step. Made by `clusterctl render "
        f"{spec.path.name} --format slurm`.",
        "# Submit: sbatch FILE (sbatch --wait FILE blocks; its exit code is the run's).",
        f"#SBATCH --job-name={spec.name}",
    ]
    if nodes is not None:
        lines.append(f"#SBATCH --nodes={nodes}")
    lines.append(f"#SBATCH --ntasks={total}")
    if partition is not None:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit is not None:
        lines.append(f"#SBATCH --time={time_limit}")
    grace = grace_seconds(spec)
    if grace > 0:  # the preemption notice before the time limit: see the module docstring
        lines.append(f"#SBATCH --signal=TERM@{grace}")
    lines += [
        f"#SBATCH --output={spec.name}-%j.out",
        "set -euo pipefail",
        "",
        "# Ranks in TF's order (jobs sorted by name): "
        + ", ".join(f"{rank} {name}" for rank, name in enumerate(names)),
        f"export {ENV_SLURM_JOBS}={jobs}",
        "unset TF_CONFIG  # one exported at submission would win over the Slurm step",
        "# Each node's tasks listen on BASE, BASE+1, ...; BASE moves with the job id so that two",
        "# jobs on one node do not collide (export it before sbatch to choose it).",
        f'export {ENV_SLURM_PORT_BASE}="${{{ENV_SLURM_PORT_BASE}:-{_port_base(spec, total)}}}"',
        "# The cluster's shared secret, made here: never in this file or on a command line.",
        'CLUSTER_TOKEN="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d \' \\n\')"',
        "export CLUSTER_TOKEN",
        "export " + " ".join(f"{name}={value}" for name, value in spec.timeouts.task_env().items())
        + " PYTHONUNBUFFERED=1",
        "# SIGTERM to SIGKILL (timeouts.grace): --signal above before the time limit; scancel and",
        "# preemption use the cluster's KillWait / GraceTime, which this job cannot change.",
        f"export {ENV_GRACE_PERIOD}={grace}",
    ]
    if spec.elastic is not None:
        lines += _elastic_lines(spec, order)
    if grace > 0:
        lines.append(_KILL_WAIT_CHECK.format(grace=grace))
    if (_REPO_ROOT / "worker" / "__init__.py").exists():  # a source checkout, as clusterctl does
        lines.append(f'export PYTHONPATH={q(str(_REPO_ROOT))}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    if spec.env:
        lines.append("# The cluster file's env:")
        lines += [f"export {key}={q(value)}" for key, value in spec.env.items()]
    lines += [
        f'export PYTHON="${{CLUSTER_PYTHON:-{q(python or sys.executable)}}}"',
        f"cd {q(str(spec.workdir))}",
        "# Error records and exit codes of the tasks: on a filesystem every node sees.",
        f'export CLUSTER_RUN_DIR={q(str(spec.log_dir / spec.name))}"-slurm-$SLURM_JOB_ID"',
        'mkdir -p "$CLUSTER_RUN_DIR"',
        "# Each task runs under this wrapper: it runs \"$PYTHON\" ARGS, gives the runtime a "
        "per-rank",
        "# error file and records the exit code for the summary at the end.",
        f"export CLUSTER_TASK_WRAPPER={q(_wrapper(spec))}",
    ]
    if spec.tls is not None:
        lines += _TLS_LINES
    coordinator = spec.mode == COORDINATOR
    if coordinator:
        lines += ["# Servers exit 0 once the chief has finished cleanly; the chief's wrapper also "
                  "ends the",
                  "# step when the chief succeeds, for whatever still serves.",
                  f"export {ENV_STOP_WITH_COORDINATOR}=1",
                  f"export CLUSTER_CHIEF_WRAPPER={q(_CHIEF_WRAPPER)}"]
    lines.append("")
    srun = ["srun", "--kill-on-bad-exit=1", "--label", "--distribution=block",
            f"--ntasks={total}"]
    if coordinator:
        srun.append(f"--wait={max(1, round(spec.timeouts.grace))}")
    argvs = [spec.task_argv(job) for job, _ in order]
    if not coordinator and len(set(argvs)) == 1:
        command = " ".join(q(w) for w in argvs[0])
        lines += [
            "set +e",
            f'{" ".join(srun)} {_RUN_TASK} task {command} 2>&1 \\',
        ]
    else:
        lines += [
            "# Which command each rank runs (srun --multi-prog; JOB after the wrapper is a label).",
            'cat > "$CLUSTER_RUN_DIR/tasks.conf" <<\'EOF\'',
            *_multi_prog_lines(spec, order),
            "EOF",
            "set +e",
            f'{" ".join(srun)} --multi-prog "$CLUSTER_RUN_DIR/tasks.conf" 2>&1 \\',
        ]
    lines += [
        f"  | awk -v tasks={q(' '.join(names))} {q(_PREFIX_AWK)}",
        "srun_exit=${PIPESTATUS[0]}",
        "set -e",
        "# srun returns the highest task exit code; the run's is its root cause's.",
        f'exec "$PYTHON" -m cluster.ctl.slurm_outcome --mode {spec.mode} '
        f'--tasks {",".join(names)} --srun-exit "$srun_exit" "$CLUSTER_RUN_DIR"',
    ]
    return "\n".join(lines) + "\n"


def _wrapper(spec: ClusterFile) -> str:
    """The task wrapper: restarting a task alone in an elastic run, else running it once."""
    if spec.elastic is None:
        return _TASK_WRAPPER
    return _ELASTIC_TASK.format(retry=_RETRY[spec.restart.policy])


def _elastic_lines(spec: ClusterFile, order: list[tuple[str, int]]) -> list[str]:
    """The exports of an elastic run: its bounds, which ranks are in the group (chief and
    workers), how many times each may be restarted alone."""
    ranks = " ".join(str(r) for r, (job, _) in enumerate(order) if job in ELASTIC_JOBS)
    return [
        "# Elastic: chief and worker ranks go on while MIN of them run; one that dies is "
        "started",
        "# again alone by its wrapper (restart.policy, restart.max_worker_restarts).",
        f"export {ENV_ELASTIC}={spec.elastic} CLUSTER_ELASTIC_RANKS={shlex.quote(ranks)} "
        f"CLUSTER_TASK_RESTARTS={spec.restart.max_worker_restarts}",
    ]


def _multi_prog_lines(spec: ClusterFile, order: list[tuple[str, int]]) -> list[str]:
    """One ``--multi-prog`` line per run of ranks with the same job (in a quoted heredoc: the
    text is taken as it is)."""
    lines: list[str] = []
    rank = 0
    while rank < len(order):
        job = order[rank][0]
        end = rank
        while end + 1 < len(order) and order[end + 1][0] == job:
            end += 1
        words = [_multi_prog_word(w, f"argument of {job}") for w in spec.task_argv(job)]
        run = _RUN_CHIEF if spec.mode == COORDINATOR and job == "chief" else _RUN_TASK
        ranks = str(rank) if rank == end else f"{rank}-{end}"
        lines.append(f"{ranks} {run} {job} {' '.join(words)}")
        rank = end + 1
    return lines


def render(spec: ClusterFile, options: RenderOptions) -> str:
    """The ``--format slurm`` row of :data:`cluster.ctl.render.FORMATS`."""
    return render_slurm(spec, nodes=options.nodes, partition=options.partition,
                        time_limit=options.time)
