"""The exit code of a Slurm run: ``python -m cluster.ctl.slurm_outcome``, the last step of the
sbatch script that ``clusterctl render --format slurm`` writes.

``srun`` exits with the *highest* exit code of its tasks, so the root cause of a failure (a
script that raised: 1, permanent) hides behind its peers' reactions (201 "peer failed", 143
SIGTERM: retryable). Every task's wrapper leaves, in the run directory, ``RANK.exit`` (``CODE
TIME STOPPED NODE``: its exit code, when, whether Slurm had signalled it, where it ran) and the
runtime ``RANK.error.json`` (:class:`cluster.lifecycle.ErrorRecord`). From them this module
names the root cause with the same rule as ``clusterctl launch``
(:func:`cluster.ctl.policy.root_cause`), prints it, and exits with its code:

- ``collective``: 0 when srun says every task exited 0; else the root cause's code;
- ``coordinator``: 0 when the chief exited 0 (its servers were then stopped: srun may say 137);
  else the root cause's code;
- no file to go by (a run directory that the nodes do not share): srun's own code, which is
  never 0 after a failure.

Usage: ``python -m cluster.ctl.slurm_outcome --mode MODE --tasks chief:0,worker:0,...
--srun-exit CODE RUN_DIR`` (tasks in rank order).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cluster import exitcodes, lifecycle
from cluster.ctl import policy

__all__ = ["decide", "main", "read_exits"]


def read_exits(run_dir: Path, tasks: list[str]) -> list[policy.TaskExit]:
    """The exits the tasks' wrappers recorded, ordered by time (``order`` 0 = first); a task
    with no readable file (killed with its wrapper, or not on this filesystem) is left out."""
    found: list[tuple[float, int, str, int, bool]] = []
    for rank, task in enumerate(tasks):
        try:
            fields = (run_dir / f"{rank}.exit").read_text().split()
            code, when = exitcodes.normalize(int(fields[0])), float(fields[1])
            stopped = len(fields) > 2 and fields[2] == "1"
        except (OSError, ValueError, IndexError):
            continue
        found.append((when, rank, task, code, stopped))
    found.sort()
    return [policy.TaskExit(task, code, order, stopped,
                            _declared(run_dir, rank, task, code, stopped))
            for order, (_, rank, task, code, stopped) in enumerate(found)]


def _declared(run_dir: Path, rank: int, task: str, code: int, stopped: bool) -> int | None:
    """What the task recorded for its own failure before Slurm's signal ended it
    (:func:`policy.declared_code`)."""
    record = lifecycle.read_error_file(run_dir / f"{rank}.error.json") if stopped else None
    return policy.declared_code(task, code, stopped, record.exit_code if record else None,
                                record.root_task if record else "")


def decide(exits: list[policy.TaskExit], mode: str,
           srun_exit: int) -> tuple[int, policy.TaskExit | None]:
    """``(exit code of the run, root cause or None)``; never 0 when srun or the chief (in
    ``coordinator`` mode) says the run failed and a root cause is known."""
    if mode == policy.COORDINATOR:
        chief = next((e for e in exits if e.task == "chief:0"), None)
        if chief is not None and chief.code == 0:
            return exitcodes.EXIT_OK, None
    elif srun_exit == 0:
        return exitcodes.EXIT_OK, None
    root = policy.root_cause(exits, mode)
    if root is not None and root.verdict != 0:
        return root.verdict, root
    return exitcodes.normalize(srun_exit), None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.ctl.slurm_outcome",
                                     description="exit with the code of a Slurm run")
    parser.add_argument("--mode", choices=policy.MODES, required=True)
    parser.add_argument("--tasks", required=True, help="task names in rank order, commas")
    parser.add_argument("--srun-exit", type=int, required=True)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    exits = read_exits(args.run_dir, tasks)
    code, root = decide(exits, args.mode, args.srun_exit)
    if code == 0:
        print(f"[slurm] the run succeeded ({len(tasks)} tasks)", file=sys.stderr, flush=True)
        return 0
    if root is None:
        print(f"[slurm] the run failed: srun exited {exitcodes.describe(args.srun_exit)}; no "
              f"task left its exit code in {args.run_dir}", file=sys.stderr, flush=True)
        return code
    rank = tasks.index(root.task)
    record = lifecycle.read_error_file(args.run_dir / f"{rank}.error.json")
    cause = record.summary() if record is not None else "(no error record)"
    try:
        node = f" on {(args.run_dir / f'{rank}.exit').read_text().split()[3]}"
    except (OSError, IndexError):
        node = ""
    print(f"[slurm] the run failed: {root.task}{node} {root.ended()}: {cause}",
          file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
