"""The elastic contract with cluster.torch (tests/processes/test_elastic.py): a torch linear model
in float64, gradients averaged by cluster.torch.DistributedGradients, torch's SGD with momentum,
model and optimizer in the elastic State as cluster.torch.StateDict. A fixed global batch of 12
rows per step is split evenly among 2, 3 or 4 replicas, so the mean of the replicas' mean
gradients is the global batch's. ``ELASTIC_DIR``, ``ELASTIC_KILL``, ``ELASTIC_HOLD`` and the
``FINAL`` line are elastic_train.py's."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

import cluster
import cluster.torch

D, B, STEPS = 6, 12, int(os.environ.get("ELASTIC_STEPS", "40"))
DIR = Path(os.environ["ELASTIC_DIR"])
KILLS = dict(item.split("@") for item in os.environ.get("ELASTIC_KILL", "").split(",") if item)
HOLD_STEP, HOLD_SIZE = map(int, (os.environ.get("ELASTIC_HOLD") or "-1@0").split("@"))
torch.set_default_dtype(torch.float64)


def global_batch(step: int):
    rng = np.random.default_rng(500 + step)
    x = rng.standard_normal((B, D))
    y = x @ np.linspace(-1.0, 1.0, D)[:, None] + 0.1 * rng.standard_normal((B, 1))
    return torch.from_numpy(x), torch.from_numpy(y)


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(D, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def reference():
    model, optimizer = make()
    for step in range(STEPS):
        x, y = global_batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.weight.detach().numpy().ravel().tolist()


strategy = cluster.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
me = f"{resolver.task_type}:{resolver.task_id}"
with open(DIR / f"pids-{me}", "a") as pids:
    pids.write(f"{os.getpid()}\n")
model, optimizer = make()
cluster.torch.broadcast_module(model, strategy)
grads = cluster.torch.DistributedGradients(model, strategy)
state = cluster.elastic.State(model=cluster.torch.StateDict(model),
                              optimizer=cluster.torch.StateDict(optimizer), step=0, applied=[])
sizes = []


@cluster.elastic.run(strategy, state)
def train(state):
    while state.step < STEPS:
        held = time.monotonic()
        while (state.step == HOLD_STEP and strategy.num_replicas_in_sync < HOLD_SIZE
               and time.monotonic() - held < 60):
            state.commit()
            time.sleep(0.05)
        if KILLS.get(me) == str(state.step) and not (DIR / f"killed-{me}").exists():
            (DIR / f"killed-{me}").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        n = strategy.num_replicas_in_sync
        sizes.append(n)
        x, y = global_batch(state.step)
        rows = np.array_split(np.arange(B), n)[strategy.extended.worker_index]
        optimizer.zero_grad()  # first: a step cut short by a loss left its gradients
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        grads.synchronize()  # the mean over the replicas: the global batch's gradient
        optimizer.step()
        state.applied = [*state.applied, state.step]
        state.step += 1
        state.commit()


train(state)
result = {"w": model.weight.detach().numpy().ravel().tolist(), "applied": state.applied,
          "pid": os.getpid(), "sizes": sorted(set(sizes))}
if resolver.task_type == "chief":
    result["reference"] = reference()
print(f"FINAL {me} {json.dumps(result)}", flush=True)
sys.exit(0)
