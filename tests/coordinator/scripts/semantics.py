"""Chief script: coordinator semantics on a real cluster; prints ``RESULT {json}`` of checks.

The error checks hold under any interleaving: a function's error is raised once, by whichever
of ``schedule``/``join``/``done`` comes first after it arrived (TF's contract), so the script
orders events with gate files (the loopback workers share this host) instead of hoping that
workers are slower than the chief.
"""

import json
import os
import shutil
import tempfile
import threading
import time

import numpy as np

import cluster
import cluster.runtime
from cluster.coordinator import ClusterCoordinator
from cluster.errors import FunctionCancelledError, OutOfRangeError
from cluster.ps import FixedShardsPartitioner
from cluster.transport.ps_client import PsClient

rt = cluster.runtime.current()
strategy = cluster.ParameterServerStrategy(rt.resolver,
                                           variable_partitioner=FixedShardsPartitioner(3))
coordinator = ClusterCoordinator(strategy)
out = {}
GATES = tempfile.mkdtemp(prefix="semantics-gates-")


def gate(name):
    return os.path.join(GATES, name)


def open_gate(path):
    open(path, "w").close()


def wait_for_gate(path, seconds=60.0):
    """On a worker: block until the chief opened ``path`` (a deadline, so nothing hangs)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was not opened within {seconds:g} s")
        time.sleep(0.01)


def boom_at(fire):
    wait_for_gate(fire)
    raise ValueError("boom from a worker")


def one_at(release):
    wait_for_gate(release)
    return 1


# -- a partitioned variable round-trips exactly ------------------------------------------------
init = np.arange(30, dtype=np.float64).reshape(10, 3) / 7.0
counts = np.arange(5, dtype=np.int32)
with strategy.scope():
    table = cluster.Variable(init, name="table")
    ints = cluster.Variable(counts, name="ints")
    scalar = cluster.Variable(2.5, name="scalar")
out["roundtrip"] = bool(np.array_equal(table.numpy(), init) and table.dtype == np.float64)
out["shards"] = [(v.shape, v.device) for v in table.variables]
stored = {}
for task, address in strategy._config.ps_tasks:
    with PsClient(address, rt.token, task=task) as client:
        for name in ("table/part_0", "table/part_1", "table/part_2"):
            try:
                stored[name] = (task, client.pull([name])[0].value.tolist())
            except cluster.errors.VariableNotFoundError:
                pass
out["stored"] = stored
table.assign(init * 2)
out["assigned"] = bool(np.array_equal(table.numpy(), init * 2))
table.assign_add(np.ones_like(init))
out["assign_add"] = bool(np.array_equal(table.numpy(), init * 2 + 1))
ints.assign_sub(np.ones(5, np.int32))
out["ints"] = ints.numpy().tolist()
out["ints_dtype"] = str(ints.dtype)
on_worker = coordinator.schedule(lambda: (table.numpy(), scalar.numpy())).fetch()
out["worker_reads"] = bool(np.array_equal(on_worker[0], init * 2 + 1)) and \
    float(on_worker[1]) == 2.5


# -- per-worker datasets: each worker iterates its own copy, in order --------------------------
def dataset_fn():
    def pieces(ctx):
        return [(ctx.input_pipeline_id, ctx.num_input_pipelines, k) for k in range(20)]
    return strategy.distribute_datasets_from_function(pieces)


iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


def take(it):
    return next(it), cluster.runtime.current().task


values = [coordinator.schedule(take, args=(iterator,)) for _ in range(8)]
coordinator.join()
seen = {}
for value in values:
    (pipeline, pipelines, k), task = value.fetch()
    seen.setdefault(task, []).append((pipeline, pipelines, k))
out["per_worker"] = seen

# -- running out of data: OutOfRangeError from join, then usable again --------------------------
small = iter(coordinator.create_per_worker_dataset(lambda: [1]))
data_gate = gate("data")


def next_at(it, release):
    wait_for_gate(release)
    return next(it)


# Gated, so no function can fail while these are scheduled (schedule would raise it instead).
for _ in range(6):
    coordinator.schedule(next_at, args=(small, data_gate))
open_gate(data_gate)
try:
    coordinator.join()
    out["out_of_range"] = "no error"
except OutOfRangeError as e:
    out["out_of_range"] = type(e).__name__

# -- a failing function: join raises its error once, the queued functions are cancelled --------
# One worker runs `first` and the other at most one of `rest`, each held at a gate; so when
# `first` fails (once `fire` opens) at least 19 of `rest` still wait in the queue and are
# cancelled, at the moment the error is recorded. The last of `rest` failing tells the chief
# that moment has passed; only then may the running one finish.
fire, release = gate("fire"), gate("release")
first = coordinator.schedule(boom_at, args=(fire,))
rest = [coordinator.schedule(one_at, args=(release,)) for _ in range(20)]
open_gate(fire)
try:
    rest[-1].fetch()
    out["last_cancelled"] = False
except FunctionCancelledError:
    out["last_cancelled"] = True
open_gate(release)
try:
    coordinator.join()
    out["error"] = "no error"
except ValueError as e:
    out["error"] = str(e)
    out["error_note"] = any("raised on worker:" in n for n in getattr(e, "__notes__", []))
out["done_after_join_raised"] = coordinator.done()  # raised once: neither raises again
coordinator.join()
outcomes = []
for value in rest:
    try:
        outcomes.append(value.fetch())
    except FunctionCancelledError:
        outcomes.append("cancelled")
out["cancelled"] = outcomes.count("cancelled")
out["ran"] = outcomes.count(1)
try:
    first.fetch()
except ValueError:
    out["first_raises"] = True

# -- schedule raises an earlier function's error (once), if it comes before join ---------------
fire2, release2 = gate("fire2"), gate("release2")
coordinator.schedule(boom_at, args=(fire2,))
held = [coordinator.schedule(one_at, args=(release2,)) for _ in range(2)]
open_gate(fire2)
try:  # one worker fails, the other holds at most one of `held`: the last one was queued
    held[-1].fetch()
    out["held_cancelled"] = False
except FunctionCancelledError:
    out["held_cancelled"] = True
try:
    coordinator.schedule(lambda: 0)
    out["schedule_raises"] = "no error"
except ValueError as e:
    out["schedule_raises"] = str(e)
open_gate(release2)
try:
    coordinator.join()
    out["join_after_schedule_raised"] = "no error"
except ValueError as e:
    out["join_after_schedule_raised"] = str(e)
out["after_error"] = coordinator.schedule(lambda: 41 + 1).fetch()

# -- RemoteValues as arguments, fetch of a structure ------------------------------------------
a = coordinator.schedule(lambda: np.arange(3))
b = coordinator.schedule(lambda x: x * 2, args=(a,))
out["chained"] = coordinator.fetch({"b": b})["b"].tolist()

# -- schedule refuses what cannot travel, at once -----------------------------------------------
lock = threading.Lock()
try:
    coordinator.schedule(lambda: lock)
    out["unpicklable"] = "accepted"
except TypeError as e:
    out["unpicklable"] = type(e).__name__
# -- metrics: state on the parameter servers, updated by every worker --------------------------
with strategy.scope():
    mean = cluster.metrics.Mean()
for k in range(10):
    coordinator.schedule(lambda k: mean.update_state(np.array([k, k], np.float32)), args=(k,))
coordinator.join()
out["metric"] = float(mean.result())
out["done"] = coordinator.done()
shutil.rmtree(GATES, ignore_errors=True)
print("RESULT " + json.dumps(out), flush=True)
