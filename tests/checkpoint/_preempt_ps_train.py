"""Chief script of test_ps_preemption (``mode: coordinator``)::

    _preempt_ps_train.py --dir CKPT_DIR --out OUT.npy --steps N --optimizer momentum|adam
                         --notice ps:1|worker:0 --notice-at K

The training of ``_resume_ps_train`` (``ParameterServerStrategy(synchronous=True)``, a
:class:`~cluster.coordinator.ClusterCoordinator`, one round per step, the same data and the same
reference), driven by a :class:`~cluster.checkpoint.PreemptionCheckpointHandler`: one ``run``
call per step, which schedules the round and joins it; ``total_run_calls`` is the step.

On the first attempt (``CLUSTER_RESTART_COUNT`` 0), during step ``K`` (after its round was
scheduled), the chief sends SIGTERM to the task ``--notice`` names (found by its ``TF_CONFIG``
and this run's token), as a node drain would, then waits (bounded) until its runtime has heard
that task's preemption notice, so the save comes at the next ``run`` call: step ``K + 1``.
The chief prints ``resumed at <step>``, ``step <k>`` after each step, and writes the final
parameters to OUT (``w`` then ``b``, flattened).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import _resume_ps_train
import cloudpickle
import numpy as np
from _resume_ps_train import WORKERS, _initial, _optimizer, contribution

# The workers cannot import this directory's modules: send the training math by value.
cloudpickle.register_pickle_by_value(_resume_ps_train)

NOTICE_WAIT = 60.0  # s: bounded; on a loaded machine the notice still comes in well under this


def _say(line: str) -> None:
    # One write: the runtime logs the notice on stderr at this very moment, and an unbuffered
    # print writes the line and its newline separately (another line could land between).
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def _signal(task: str) -> None:
    from cluster.settings import ENV_TOKEN
    from cluster.testing import processes_with

    job, index = task.split(":")
    pids = processes_with(os.environ[ENV_TOKEN], f'"task":{{"type":"{job}","index":{index}}}')
    if not pids:
        raise RuntimeError(f"{task} not found")
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    _say(f"sent SIGTERM to {task}")


def main() -> None:
    import cluster.runtime
    from cluster.checkpoint import Checkpoint, CheckpointManager, PreemptionCheckpointHandler
    from cluster.coordinator import ClusterCoordinator
    from cluster.deadline import Deadline
    from cluster.ps import FixedShardsPartitioner

    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--optimizer", choices=("momentum", "adam"), required=True)
    parser.add_argument("--notice", required=True)
    parser.add_argument("--notice-at", type=int, required=True)
    args = parser.parse_args()

    rt = cluster.runtime.current()
    jobs = rt.resolver.cluster_spec().as_dict()
    assert len(jobs["worker"]) == WORKERS, jobs
    strategy = cluster.ParameterServerStrategy(
        rt.resolver, variable_partitioner=FixedShardsPartitioner(len(jobs["ps"])),
        synchronous=True)
    coordinator = ClusterCoordinator(strategy)
    w0, b0 = _initial()
    with strategy.scope():
        w = cluster.Variable(w0, name="w")
        b = cluster.Variable(b0, name="b")
    optimizer = _optimizer(args.optimizer)

    def train(k: int, j: int) -> None:
        def replica_fn() -> None:
            gw, gb = contribution(w.numpy(), b.numpy(), k, j)
            optimizer.apply_gradients([(gw, w), (gb, b)])

        strategy.run(replica_fn)

    manager = CheckpointManager(Checkpoint(model={"w": w, "b": b}, optimizer=optimizer),
                                args.dir, max_to_keep=2)
    handler = PreemptionCheckpointHandler(strategy.cluster_resolver, manager,
                                          coordinator=coordinator)
    print(f"resumed at {handler.total_run_calls}", flush=True)
    first_attempt = os.environ.get("CLUSTER_RESTART_COUNT", "0") == "0"

    def one_step(k: int) -> None:
        for j in range(WORKERS):
            coordinator.schedule(train, args=(k, j))
        if first_attempt and k == args.notice_at:
            _signal(args.notice)  # while the round runs: the task must still serve it
            heard = rt.wait_for_preemption_notice(Deadline.after(NOTICE_WAIT))
            _say(f"preemption notices heard: {', '.join(heard) or 'none'}")
        coordinator.join()

    while (k := handler.total_run_calls) < args.steps:
        handler.run(one_step, k)
        print(f"step {k}", flush=True)
    handler.close()
    np.save(args.out, np.concatenate([w.numpy().ravel(), b.numpy().ravel()]))
    print("done", flush=True)


if __name__ == "__main__":
    main()
