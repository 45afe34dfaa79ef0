"""Chief script: coordinator semantics on a real cluster; prints ``RESULT {json}`` of checks."""

import json
import threading

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
for _ in range(6):
    coordinator.schedule(lambda it: next(it), args=(small,))
try:
    coordinator.join()
    out["out_of_range"] = "no error"
except OutOfRangeError as e:
    out["out_of_range"] = type(e).__name__

# -- a failing function: its error from join, later ones cancelled, coordinator usable ----------
def boom():
    raise ValueError("boom from a worker")


first = coordinator.schedule(boom)
rest = [coordinator.schedule(lambda: 1) for _ in range(20)]
try:
    coordinator.join()
    out["error"] = "no error"
except ValueError as e:
    out["error"] = str(e)
    out["error_note"] = any("raised on worker:" in n for n in getattr(e, "__notes__", []))
cancelled = 0
for value in rest:
    try:
        value.fetch()
    except FunctionCancelledError:
        cancelled += 1
out["cancelled_some"] = cancelled
try:
    first.fetch()
except ValueError:
    out["first_raises"] = True
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
print("RESULT " + json.dumps(out), flush=True)
