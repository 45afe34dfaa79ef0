"""What the timeline costs (``cluster.timeline``): a 4 KiB all-reduce step with it off and on.

    uv run python bench/timeline.py                 # 2 tasks, 7 rounds of 300 steps per state
    uv run python bench/timeline.py --nprocs 3 --rounds 11

Two measurements:

1. End to end: N ``python -m worker bench/_timeline_task.py`` tasks on loopback under
   ``MultiWorkerMirroredStrategy`` time ``strategy.run(lambda: ctx.all_reduce(SUM, 4 KiB))``
   steps with the timeline ``off``, with ``steps`` records only (what clusterctl always turns
   on) and with the ``trace`` too, interleaved round by round. Per state: the median over rounds
   of the slowest task's mean step time, and the difference to ``off``.
2. The hooks alone, in this process (no transport): one collective span and one
   ``strategy.run`` step span, entered and left, off and on, in CPU time (``thread_time``) per
   call: the part of (1) that is ours, with less of the noise of a loaded machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._results import task_result  # noqa: E402
from cluster.testing import TaskProcesses, loopback_cluster, tf_config  # noqa: E402

TASK = Path(__file__).resolve().parent / "_timeline_task.py"
LINE = "TIMELINE_BENCH "
STATES = ("off", "steps", "trace")


def end_to_end(n: int, rounds: int, steps: int, timeout: float) -> dict[str, list[float]]:
    """``{state: [slowest task's seconds per step, one per round]}``."""
    spec = loopback_cluster(worker=n)
    env = {"CLUSTER_TOKEN": os.urandom(16).hex(), "OMP_NUM_THREADS": "1"}
    reports = []
    with tempfile.TemporaryDirectory() as out, TaskProcesses() as tasks:
        started = [tasks.python("-m", "worker", TASK, out, "--rounds", str(rounds), "--steps",
                                str(steps), cwd=REPO, env=env,
                                tf_config=tf_config(spec, "worker", i), name=f"worker:{i}")
                   for i in range(n)]
        for task in started:
            reports.append(task_result(task, timeout, LINE, f"N={n}")["times"])
    return {s: [max(r[s][i] for r in reports) for i in range(rounds)] for s in STATES}


def hooks(calls: int) -> dict[str, float]:
    """Nanoseconds per hook call (enter + exit), off and on."""
    from cluster import timeline
    from cluster.collectives._call import Call
    from cluster.collectives.options import CommunicationOptions
    from cluster.deadline import Deadline

    call = Call("all_reduce", 118, Deadline.after(None), CommunicationOptions())
    import numpy as np

    value = np.ones(1024, np.float32)
    args = (value,)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for state in STATES:
            recorder = None
            if state != "off":
                recorder = timeline.Recorder("bench", steps=f"{tmp}/{state}.jsonl",
                                             trace=f"{tmp}/{state}.json" if state == "trace"
                                             else None)
            timeline.install(recorder)
            start = time.thread_time_ns()
            for _ in range(calls):
                with timeline.collective(call, "default", value):
                    pass
            out[f"collective span, {state}"] = (time.thread_time_ns() - start) / calls
            start = time.thread_time_ns()
            for _ in range(calls):
                with timeline.run_step(args):
                    pass
            out[f"step span, {state}"] = (time.thread_time_ns() - start) / calls
            if recorder is not None:
                recorder.close()
        timeline.install(None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}")
    for name, ns in hooks(args.calls).items():
        print(f"  {name:<26} {ns / 1000:7.2f} us CPU per call")
    times = end_to_end(args.nprocs, args.rounds, args.steps, args.timeout)
    off = statistics.median(times["off"])
    print(f"\n{args.nprocs} tasks, strategy.run + ctx.all_reduce of 4 KiB, {args.rounds} rounds "
          f"x {args.steps} steps per state (median of the rounds' slowest task):")
    print("| timeline | us per step | rounds' range | vs off |")
    print("|---|---|---|---|")
    for state in STATES:
        median = statistics.median(times[state])
        delta = (median - off) * 1e6
        spread = f"{min(times[state]) * 1e6:.0f}-{max(times[state]) * 1e6:.0f}"
        print(f"| {state} | {median * 1e6:.1f} | {spread} | {delta:+.1f} us "
              f"({100 * delta / 1e6 / off:+.1f}%) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
