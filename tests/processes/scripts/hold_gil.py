"""Test task: all-reduce, then the task named by ``argv[1]`` holds the GIL for ``argv[2]``
seconds in one C call (``usleep`` through ``ctypes.PyDLL``, which keeps the GIL), then everyone
all-reduces again and prints ``DONE <sum>``. ``argv[3]``, when given, is ``before`` (the default:
hold before the next collective, with the peers waiting in it) or ``join`` (hold right after
``MultiWorkerMirroredStrategy()``, like a slow ``import torch, jax``)."""

import ctypes
import json
import os
import sys

import numpy as np

import cluster

holder, seconds = sys.argv[1], float(sys.argv[2])
when = sys.argv[3] if len(sys.argv) > 3 else "before"
config = json.loads(os.environ["TF_CONFIG"])["task"]
me = f"{config['type']}:{config['index']}"


def hold() -> None:
    if me == holder:
        print(f"HOLDING {seconds:g} s", flush=True)
        ctypes.PyDLL(None).usleep(int(seconds * 1e6))


strategy = cluster.MultiWorkerMirroredStrategy()
if when == "join":
    hold()
x = np.ones(4, np.float32)


def step() -> float:
    reduced = strategy.run(lambda: cluster.get_replica_context().all_reduce(
        cluster.ReduceOp.SUM, x))
    return float(np.asarray(reduced).sum())


for _ in range(3):
    step()
print("ready", flush=True)
if when == "before":
    hold()
total = sum(step() for _ in range(3))
print(f"DONE {total:g}", flush=True)
