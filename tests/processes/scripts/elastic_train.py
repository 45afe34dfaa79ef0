"""The elastic contract's program (tests/processes/test_elastic.py): linear regression in float64
on a fixed global batch per step, split among the current replicas, loss scaled by the global
batch, SGD with momentum, a commit per step.

``ELASTIC_KILL`` = ``task@step[,task@step...]``: that task SIGKILLs itself when it reaches that
step, once per run (a marker file under ``ELASTIC_DIR`` remembers it across its restart).
``ELASTIC_REPORT=1`` prints ``STEP <n> <unix time> <replicas>`` after each commit;
``ELASTIC_STEP_SLEEP`` sleeps that long after each step (a step that takes time).
``ELASTIC_GIL`` = ``task@step@seconds``: that task holds the GIL that long at that step.
``ELASTIC_HOLD`` = ``step@size``: at that step the group commits and waits (60 s at most) until
it has ``size`` replicas again, so a restarted task rejoins before training ends whatever the
machine's speed (every member runs the same loop: each commit is a collective). Every start
appends its PID to ``ELASTIC_DIR/pids-<task>``. At the end each task prints ``FINAL <task>
<json>``: its weights, the steps its state applied (in order), its PID and the replica counts it
trained with; the chief also prints the weights of the same training done in one process
(``REFERENCE``).
"""

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import cluster

D, B, STEPS = 8, 12, int(os.environ.get("ELASTIC_STEPS", "60"))
LR, MOMENTUM = 0.05, 0.9
DIR = Path(os.environ["ELASTIC_DIR"])
KILLS = dict(item.split("@") for item in os.environ.get("ELASTIC_KILL", "").split(",") if item)
GIL_TASK, GIL_STEP, GIL_SECONDS = (os.environ.get("ELASTIC_GIL") or "@-1@0").split("@")
REPORT = os.environ.get("ELASTIC_REPORT") == "1"
STEP_SLEEP = float(os.environ.get("ELASTIC_STEP_SLEEP") or 0)
HOLD_STEP, HOLD_SIZE = map(int, (os.environ.get("ELASTIC_HOLD") or "-1@0").split("@"))


def global_batch(step: int):
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((B, D))
    y = x @ np.linspace(-1.0, 1.0, D) + 0.1 * rng.standard_normal(B)
    return x, y


def gradient(w, x, y):
    return 2.0 * x.T @ (x @ w - y) / B  # scaled by the global batch, whatever the split


def reference():
    w, v = np.zeros(D), np.zeros(D)
    for step in range(STEPS):
        v = MOMENTUM * v - LR * gradient(w, *global_batch(step))
        w = w + v
    return w


strategy = cluster.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
me = f"{resolver.task_type}:{resolver.task_id}"
with open(DIR / f"pids-{me}", "a") as pids:
    pids.write(f"{os.getpid()}\n")
with strategy.scope():
    w = cluster.Variable(np.zeros(D))
    optimizer = cluster.optimizers.SGD(LR, momentum=MOMENTUM)
state = cluster.elastic.State(w=w, optimizer=optimizer, step=0, applied=[])
sizes = []


def replica_step(x, y):
    ctx = cluster.get_replica_context()
    rows = np.array_split(np.arange(B), ctx.num_replicas_in_sync)[ctx.replica_id_in_sync_group]
    grad = gradient(w.numpy(), x[rows], y[rows])  # this replica's share of the global gradient
    optimizer.apply_gradients([(grad, w)])  # summed across replicas


@cluster.elastic.run(strategy, state)
def train(state):
    while state.step < STEPS:
        held = time.monotonic()
        while (state.step == HOLD_STEP and strategy.num_replicas_in_sync < HOLD_SIZE
               and time.monotonic() - held < 60):
            state.commit()  # a collective: every member loops alike, and a joiner enters here
            time.sleep(0.05)
        if me == GIL_TASK and state.step == int(GIL_STEP):
            # One C call that keeps the GIL (as a long import or unpickle does): no heartbeat
            # leaves this process meanwhile, but its kernel still answers for it.
            ctypes.PyDLL(None).usleep(int(float(GIL_SECONDS) * 1e6))
        if KILLS.get(me) == str(state.step):
            marker = DIR / f"killed-{me}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
        sizes.append(strategy.num_replicas_in_sync)
        strategy.run(replica_step, args=global_batch(state.step))
        state.applied = [*state.applied, state.step]
        state.step += 1
        state.commit()
        if REPORT:
            print(f"STEP {state.step} {time.time():.3f} {strategy.num_replicas_in_sync}",
                  flush=True)
        time.sleep(STEP_SLEEP)


train(state)
result = {"w": w.numpy().tolist(), "applied": state.applied, "pid": os.getpid(),
          "sizes": sorted(set(sizes))}
if resolver.task_type == "chief":
    result["reference"] = reference().tolist()
print(f"FINAL {me} {json.dumps(result)}", flush=True)
sys.exit(0)
