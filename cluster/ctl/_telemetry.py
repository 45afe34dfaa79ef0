"""What ``clusterctl launch`` does for the timeline and ``clusterctl status``.

Per run directory::

    RUN_DIR/steps/worker-1.jsonl      each task's step records (always; cluster.timeline)
    RUN_DIR/timeline/worker-1.json    each task's Chrome trace (when a timeline is asked for)
    RUN_DIR/timeline.json             the merged trace, one process track per task (at the end;
                                      or the file CLUSTER_TIMELINE names), and a ``clusterctl``
                                      track with an elastic run's membership events
    RUN_DIR/timeline/clusterctl.json  those events as a trace (written when merging)

A timeline is asked for by ``timeline: true`` in the cluster file or ``CLUSTER_TIMELINE=FILE`` in
clusterctl's environment (or the file's ``env``). The run directory of the newest launch is
remembered in ``$XDG_STATE_HOME/cluster-runtime/latest-run`` (default ``~/.local/state``), the
default of ``clusterctl status``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from cluster.ctl import _membership
from cluster.ctl.spec import ClusterFile
from cluster.settings import ENV_STEPS, ENV_TIMELINE

__all__ = ["ENV_RUN_DIR", "finish", "latest_run_pointer", "started", "steps_path", "task_env",
           "trace_path"]

ENV_RUN_DIR = "CLUSTER_RUN_DIR"


def steps_path(run_dir: Path, task: str) -> Path:
    return run_dir / "steps" / (task.replace(":", "-") + ".jsonl")


def trace_path(run_dir: Path, task: str) -> Path:
    return run_dir / "timeline" / (task.replace(":", "-") + ".json")


def _merged_path(spec: ClusterFile, run_dir: Path, env: Mapping[str, str]) -> Path | None:
    """Where the run's merged trace goes, or ``None`` when no timeline was asked for."""
    wanted = spec.env.get(ENV_TIMELINE, "").strip() or env.get(ENV_TIMELINE, "").strip()
    if wanted:
        return Path(wanted).expanduser().resolve()  # relative to clusterctl's directory
    return run_dir / "timeline.json" if spec.timeline else None


def task_env(spec: ClusterFile, run_dir: Path, task: str,
             env: Mapping[str, str]) -> dict[str, str]:
    """The variables that make ``task`` record its steps (and its trace) into ``run_dir``;
    ``env`` is the task's environment so far (clusterctl's, plus the file's ``env``)."""
    run_dir = run_dir.resolve()
    out = {ENV_RUN_DIR: str(run_dir), ENV_STEPS: str(steps_path(run_dir, task))}
    # Each task writes its own file (never the merged one, which clusterctl writes at the end).
    out[ENV_TIMELINE] = (str(trace_path(run_dir, task))
                         if _merged_path(spec, run_dir, env) is not None else "")
    return out


def latest_run_pointer(environ: Mapping[str, str] | None = None) -> Path:
    """The file that holds the newest run directory (XDG state directory)."""
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME", "").strip() or "~/.local/state"
    return Path(state).expanduser() / "cluster-runtime" / "latest-run"


def started(run_dir: Path, info: Callable[[str], None]) -> None:
    """Remember ``run_dir`` as the newest run; a failure (a read-only home) only costs
    ``clusterctl status`` its default, so it is said through ``info`` and the run goes on."""
    pointer = latest_run_pointer()
    try:
        pointer.parent.mkdir(parents=True, exist_ok=True)
        tmp = pointer.with_name(f".latest-run.{os.getpid()}")
        tmp.write_text(str(run_dir.resolve()) + "\n")
        os.replace(tmp, pointer)
    except OSError as e:
        info(f"cannot remember this run for `clusterctl status` in {pointer}: {e}")


def finish(spec: ClusterFile, run_dir: Path, info: Callable[[str], None]) -> Path | None:
    """Merge the tasks' traces into the run's timeline file (when one was asked for) and say
    where it is through ``info``; returns its path. Traces of killed tasks are merged as far
    as they were written."""
    from cluster.timeline import merge_traces  # only when the run ends

    merged = _merged_path(spec, run_dir, os.environ)
    if merged is None:
        return None
    tasks = [f"{job}:{i}" for job, i in spec.tasks()]
    sources = [(t, trace_path(run_dir, t)) for t in tasks]
    try:
        events = _membership.trace_events(_membership.load(run_dir))
        if events:  # restarts and losses of an elastic run, on clusterctl's own track
            own = trace_path(run_dir, "clusterctl")
            own.parent.mkdir(parents=True, exist_ok=True)
            own.write_text(json.dumps(events) + "\n")
            sources.append(("clusterctl", own))
        count = merge_traces(sources, merged)
    except OSError as e:
        info(f"timeline: cannot write {merged}: {e}")
        return None
    info(f"timeline: {merged} ({count} events; open it in https://ui.perfetto.dev or "
         "chrome://tracing)")
    return merged
