"""One task of ``bench/timeline.py``: ``python -m worker bench/_timeline_task.py OUT_DIR``.

Under ``cluster.MultiWorkerMirroredStrategy`` (one replica per task), times blocks of
``--steps`` steps of ``strategy.run(lambda: get_replica_context().all_reduce(SUM, x))`` with
``x`` 4 KiB of float32, with the timeline in three states, interleaved round by round so that
load on the machine hits them alike: ``off`` (no recorder), ``steps`` (step records only),
``trace`` (step records and the Chrome trace), each recorder writing into OUT_DIR, in an order
that rotates from round to round. Every task
switches at the same step (the switch itself is outside the timed blocks). Prints one line
``TIMELINE_BENCH {json}``: ``{"task", "times": {state: [seconds per step, one per block]}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import cluster
from cluster import timeline

STATES = ("off", "steps", "trace")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    strategy = cluster.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_type + str(strategy.cluster_resolver.task_id)
    x = np.ones(args.size // 4, np.float32)

    def step():
        return cluster.get_replica_context().all_reduce(cluster.ReduceOp.SUM, x)

    times: dict[str, list[float]] = {s: [] for s in STATES}
    for r in range(args.rounds + 1):  # round 0 warms up and is dropped
        for state in STATES[r % 3:] + STATES[:r % 3]:  # each state first in some rounds
            recorder = None
            if state != "off":
                base = args.out / f"{task}-{state}-{r}"
                recorder = timeline.Recorder(
                    task, steps=f"{base}.steps.jsonl",
                    trace=f"{base}.trace.json" if state == "trace" else None)
            timeline.install(recorder)
            strategy.run(step)  # in step with the peers before the clock starts
            start = time.perf_counter()
            for _ in range(args.steps):
                out = strategy.run(step)
            elapsed = time.perf_counter() - start
            if recorder is not None:
                recorder.close()
            if r:
                times[state].append(elapsed / args.steps)
    world = strategy.num_replicas_in_sync
    if float(np.asarray(out).flat[0]) != world:
        raise AssertionError(f"all-reduce gave {np.asarray(out).flat[0]}, expected {world}")
    print("TIMELINE_BENCH " + json.dumps({"task": task, "times": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
