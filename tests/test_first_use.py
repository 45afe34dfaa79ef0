"""Every public name works as the first thing a fresh interpreter uses, whatever was imported.

For each name in ``__all__`` of the public modules, a new Python process (spawned, with a
timeout) imports only that module and uses the name first, as a user would: outside every
strategy, so the default strategy (``tf.distribute.get_strategy()``'s) is what it meets. The
table below holds one such use per name; :func:`test_the_table_covers_every_public_name` keeps
it in step with ``__all__``.

Then plain variables trained by ``cluster.optimizers`` outside any strategy, checked against
Keras' update rules computed by hand, and ``ReplicaContext.all_reduce``'s ops, which are
``tf.distribute.ReduceOp``'s: SUM and MEAN only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import cluster
from tests._requires import require

REPO = Path(__file__).resolve().parents[1]

# Seconds one fresh interpreter may take: imports alone take 1-2 s on a loaded 2-core machine.
_CHILD_TIMEOUT = 90

# Each snippet runs in a fresh interpreter after `import numpy as np`, with `tmp` a new empty
# directory and no TF_CONFIG, CLUSTER_TOKEN or Slurm variables in the environment. It imports
# its module itself and touches the name under test before any other public name.
_USES: dict[str, dict[str, str]] = {
    "cluster": {
        "CentralStorageStrategy": """
            import cluster
            s = cluster.CentralStorageStrategy(["/cpu:0"])  # no devices: every visible GPU
            assert s.num_replicas_in_sync == 1
            assert float(s.reduce("SUM", s.run(lambda: np.float32(2.0)), axis=None)) == 2.0
        """,
        "CommunicationImplementation": """
            import cluster
            ring = cluster.CommunicationImplementation.RING
            assert ring.name == "RING"
            assert cluster.CommunicationOptions(implementation=ring).implementation is ring
        """,
        "CommunicationOptions": """
            import cluster
            options = cluster.CommunicationOptions()
            assert (options.bytes_per_pack, options.timeout_seconds) == (0, None)
            assert options.implementation.name == "AUTO"
        """,
        "InputContext": """
            import cluster
            context = cluster.InputContext()
            assert (context.num_input_pipelines, context.input_pipeline_id,
                    context.num_replicas_in_sync) == (1, 0, 1)
            assert context.get_per_replica_batch_size(8) == 8
        """,
        "InputReplicationMode": """
            import cluster
            assert cluster.InputReplicationMode.PER_WORKER.value == "PER_WORKER"
        """,
        "MirroredStrategy": """
            import cluster
            s = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
            with s.scope():
                w = cluster.Variable(1.0)
            assert float(s.reduce("SUM", s.run(lambda: w * 2.0), axis=None)) == 4.0
        """,
        "Mirrored": """
            import cluster
            assert cluster.Mirrored([1.0, 1.0]).values == (1.0, 1.0)
        """,
        "MultiWorkerMirroredStrategy": """
            import cluster
            s = cluster.MultiWorkerMirroredStrategy()  # no TF_CONFIG: one local worker
            assert s.num_replicas_in_sync == 1
            assert float(s.reduce("SUM", s.run(lambda: np.float32(3.0)), axis=None)) == 3.0
        """,
        "OneDeviceStrategy": """
            import cluster
            s = cluster.OneDeviceStrategy("/cpu:0")
            assert s.run(lambda: cluster.get_replica_context().num_replicas_in_sync) == 1
        """,
        "ParameterServerStrategy": """
            import cluster
            import resolver
            try:
                cluster.ParameterServerStrategy(resolver.TFConfigClusterResolver())
            except ValueError as e:  # TF too needs a cluster with parameter servers
                assert "TF_CONFIG" in str(e), e
            else:
                raise AssertionError("ParameterServerStrategy without a cluster did not raise")
        """,
        "PerReplica": """
            import cluster
            assert cluster.PerReplica((1.0, 2.0)).values == (1.0, 2.0)
        """,
        "ReduceOp": """
            import cluster
            op = cluster.ReduceOp.SUM
            assert op is cluster.ReduceOp("SUM") and cluster.ReduceOp.MEAN.value == "MEAN"
            assert cluster.get_replica_context().all_reduce(op, 3.0) == 3.0
        """,
        "ReplicaContext": """
            import cluster
            kind = cluster.ReplicaContext
            context = cluster.get_replica_context()
            assert isinstance(context, kind)
            assert (context.replica_id_in_sync_group, context.num_replicas_in_sync) == (0, 1)
        """,
        "Strategy": """
            import cluster
            kind = cluster.Strategy
            s = cluster.get_strategy()
            assert isinstance(s, kind) and s.num_replicas_in_sync == 1
        """,
        "StrategyExtended": """
            import cluster
            kind = cluster.StrategyExtended
            assert isinstance(cluster.get_strategy().extended, kind)
        """,
        "Variable": """
            import cluster
            v = cluster.Variable(np.zeros(4))
            v.assign_add(np.ones(4))
            assert v.numpy().tolist() == [1.0] * 4 and v.dtype == np.float64 and v.shape == (4,)
            assert cluster.Variable(1.0).dtype == np.float32  # as TF: Python floats
        """,
        "VariableAggregation": """
            import cluster
            aggregation = cluster.VariableAggregation.SUM
            assert cluster.Variable(1.0, aggregation=aggregation).aggregation is aggregation
        """,
        "VariableSynchronization": """
            import cluster
            sync = cluster.VariableSynchronization.AUTO
            assert cluster.Variable(1.0, synchronization=sync).synchronization is sync
        """,
        "get_replica_context": """
            import cluster
            context = cluster.get_replica_context()
            assert context is not None and context is cluster.get_replica_context()
            assert context.replica_id_in_sync_group == 0
            assert context.all_reduce("SUM", 2.0) == 2.0
            assert context.merge_call(lambda s: s is cluster.get_strategy())
        """,
        "get_strategy": """
            import cluster
            s = cluster.get_strategy()
            assert s is cluster.get_strategy() and s.num_replicas_in_sync == 1
            assert float(s.reduce("MEAN", s.run(lambda: 2.0), axis=None)) == 2.0
            with s.scope():
                assert cluster.get_strategy() is s
        """,
        "has_strategy": """
            import cluster
            assert cluster.has_strategy() is False
            with cluster.OneDeviceStrategy("/cpu:0").scope():
                assert cluster.has_strategy() is True
        """,
        "in_cross_replica_context": """
            import cluster
            assert cluster.in_cross_replica_context() is False
            with cluster.OneDeviceStrategy("/cpu:0").scope():
                assert cluster.in_cross_replica_context() is True
        """,
        "metrics": """
            import cluster
            mean = cluster.metrics.Mean()
            mean.update_state(np.array([1.0, 3.0]))
            assert float(mean.result()) == 2.0
        """,
        "coordinator": """
            import cluster
            try:
                cluster.coordinator.ClusterCoordinator(cluster.get_strategy())
            except ValueError as e:  # as TF: only ParameterServerStrategy
                assert "ParameterServerStrategy" in str(e), e
            else:
                raise AssertionError("ClusterCoordinator(default strategy) did not raise")
        """,
        "runtime": """
            import cluster
            assert cluster.runtime.current() is None  # nothing started by importing
        """,
        "optimizers": """
            import cluster
            sgd = cluster.optimizers.SGD(0.1)
            v = cluster.Variable(np.ones(2))
            assert sgd.apply_gradients([(np.array([1.0, -2.0]), v)]) == 1
            assert v.numpy().tolist() == [0.9, 1.2]
        """,
    },
    "resolver": {
        "ClusterConfigError": """
            import os
            import resolver
            error = resolver.ClusterConfigError
            os.environ["TF_CONFIG"] = '{"cluster": {"worker": [42]}}'
            try:
                resolver.TFConfigClusterResolver().cluster_spec()
            except error as e:
                assert isinstance(e, ValueError) and "TF_CONFIG" in str(e), e
            else:
                raise AssertionError("a bad TF_CONFIG did not raise")
        """,
        "ClusterResolver": """
            import resolver
            base = resolver.ClusterResolver
            assert issubclass(resolver.TFConfigClusterResolver, base)
        """,
        "ClusterSpec": """
            import resolver
            spec = resolver.ClusterSpec({"worker": ["a:1", "b:2"]})
            assert spec.num_tasks("worker") == 2 and spec.task_address("worker", 1) == "b:2"
            assert spec.as_dict() == {"worker": ["a:1", "b:2"]}
        """,
        "SimpleClusterResolver": """
            import resolver
            r = resolver.SimpleClusterResolver(resolver.ClusterSpec({"worker": ["a:1"]}),
                                               task_type="worker", task_id=0)
            assert r.cluster_spec().as_dict() == {"worker": ["a:1"]}
            assert (r.task_type, r.task_id) == ("worker", 0)
        """,
        "SlurmClusterResolver": """
            import resolver
            try:
                resolver.SlurmClusterResolver()
            except RuntimeError as e:  # TF's error outside a Slurm step
                assert "SLURM_PROCID" in str(e), e
            else:
                raise AssertionError("SlurmClusterResolver outside Slurm did not raise")
        """,
        "TFConfigClusterResolver": """
            import json
            import os
            import resolver
            r = resolver.TFConfigClusterResolver()
            assert r.cluster_spec().as_dict() == {}  # no TF_CONFIG at all
            os.environ["TF_CONFIG"] = json.dumps(
                {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})
            assert r.cluster_spec().as_dict() == {"worker": ["a:1"]}  # read on each call
        """,
        "UnionClusterResolver": """
            import resolver
            union = resolver.UnionClusterResolver
            assert union is resolver.UnionResolver
        """,
        "UnionResolver": """
            import resolver
            def simple(job):
                return resolver.SimpleClusterResolver(resolver.ClusterSpec({job: ["h:1"]}))
            union = resolver.UnionResolver(simple("worker"), simple("ps"))
            assert union.cluster_spec().as_dict() == {"worker": ["h:1"], "ps": ["h:1"]}
        """,
    },
    "cluster.checkpoint": {
        "Checkpoint": """
            import cluster.checkpoint
            import cluster
            Checkpoint = cluster.checkpoint.Checkpoint
            v = cluster.Variable(np.arange(3.0))
            path = Checkpoint(v=v).write(f"{tmp}/c")
            v.assign(np.zeros(3))
            Checkpoint(v=v).read(path)
            assert v.numpy().tolist() == [0.0, 1.0, 2.0]
        """,
        "CheckpointCorruptError": """
            import os
            import cluster.checkpoint
            import cluster
            error = cluster.checkpoint.CheckpointCorruptError
            v = cluster.Variable(np.arange(3.0))
            path = cluster.checkpoint.Checkpoint(v=v).write(f"{tmp}/c")
            index = os.path.join(path, "index.json")
            with open(index, "r+b") as f:
                f.write(b"{not json")
            try:
                cluster.checkpoint.Checkpoint(v=v).read(path)
            except error as e:
                assert "corrupt" in str(e), e
            else:
                raise AssertionError("a corrupt checkpoint was read")
        """,
        "CheckpointManager": """
            import cluster.checkpoint
            import cluster
            Manager = cluster.checkpoint.CheckpointManager
            v = cluster.Variable(np.ones(2))
            manager = Manager(cluster.checkpoint.Checkpoint(v=v), tmp, max_to_keep=2)
            assert manager.restore_or_initialize() is None
            saved = manager.save()
            v.assign(np.zeros(2))
            assert manager.restore_or_initialize() == saved == manager.latest_checkpoint
            assert v.numpy().tolist() == [1.0, 1.0]
        """,
        "PreemptionCheckpointHandler": """
            import cluster.checkpoint
            import cluster
            import resolver
            Handler = cluster.checkpoint.PreemptionCheckpointHandler
            v = cluster.Variable(0.0)
            manager = cluster.checkpoint.CheckpointManager(cluster.checkpoint.Checkpoint(v=v),
                                                           tmp)
            handler = Handler(resolver.TFConfigClusterResolver(), manager)
            handler.run(lambda: v.assign_add(1.0))
            assert handler.total_run_calls == 1 and float(v.numpy()) == 1.0
        """,
        "latest_checkpoint": """
            import cluster.checkpoint
            assert cluster.checkpoint.latest_checkpoint(tmp) is None
        """,
    },
    "cluster.coordinator": {
        # Made by a ClusterCoordinator of a ParameterServerStrategy (tested with parameter
        # servers in tests/coordinator): here, the classes TF's users name.
        "ClusterCoordinator": """
            import cluster.coordinator
            import cluster
            try:
                cluster.coordinator.ClusterCoordinator(cluster.OneDeviceStrategy("/cpu:0"))
            except ValueError as e:
                assert "ParameterServerStrategy" in str(e), e
            else:
                raise AssertionError("ClusterCoordinator(OneDeviceStrategy) did not raise")
        """,
        "PerWorkerDataset": """
            import cluster.coordinator
            assert isinstance(cluster.coordinator.PerWorkerDataset, type)
        """,
        "PerWorkerIterator": """
            import cluster.coordinator
            assert isinstance(cluster.coordinator.PerWorkerIterator, type)
        """,
        "PerWorkerValues": """
            import cluster.coordinator
            assert isinstance(cluster.coordinator.PerWorkerValues, type)
        """,
        "RemoteValue": """
            import cluster.coordinator
            kind = cluster.coordinator.RemoteValue
            assert callable(kind.fetch) and callable(kind.get)
        """,
    },
    "cluster.optimizers": {
        "SGD": """
            import cluster.optimizers
            import cluster
            sgd = cluster.optimizers.SGD(0.5, momentum=0.5)
            v = cluster.Variable(np.ones(2))
            sgd.apply_gradients([(np.ones(2), v)])
            sgd.apply_gradients([(np.ones(2), v)])  # velocity -0.5, then -0.75
            assert v.numpy().tolist() == [-0.25, -0.25]
        """,
        "Adam": """
            import cluster.optimizers
            import cluster
            adam = cluster.optimizers.Adam(0.1)
            v = cluster.Variable(np.ones(2))
            adam.apply_gradients([(np.array([1.0, -1.0]), v)])
            # First Keras Adam step: lr * m_hat / (sqrt(v_hat) + eps) = 0.1 * g / (|g| + eps)
            np.testing.assert_allclose(v.numpy(), [0.9, 1.1], rtol=1e-6)
        """,
        "Optimizer": """
            import cluster.optimizers
            base = cluster.optimizers.Optimizer
            assert isinstance(cluster.optimizers.SGD(), base)
        """,
    },
    "cluster.metrics": {
        "Accuracy": """
            import cluster.metrics
            accuracy = cluster.metrics.Accuracy()
            accuracy.update_state(np.array([1, 2, 3]), np.array([1, 2, 0]))
            np.testing.assert_allclose(accuracy.result(), 2 / 3, rtol=1e-6)
        """,
        "Mean": """
            import cluster.metrics
            mean = cluster.metrics.Mean()
            mean.update_state(np.array([1.0, 2.0, 6.0]))
            assert float(mean.result()) == 3.0
        """,
        "Metric": """
            import cluster.metrics
            base = cluster.metrics.Metric
            assert isinstance(cluster.metrics.Sum(), base)
        """,
        "Sum": """
            import cluster.metrics
            total = cluster.metrics.Sum()
            total.update_state(np.array([1.0, 2.0]))
            total.update_state(4.0)
            assert float(total.result()) == 7.0
        """,
    },
    "cluster.torch": {
        "device": """
            import torch
            import cluster.torch
            chosen = cluster.torch.device()  # the default strategy: one task, local rank 0
            assert chosen == (torch.device("cuda", 0) if torch.cuda.is_available()
                              else torch.device("cpu"))
        """,
        "Placement": """
            import torch
            import cluster.torch
            placement = cluster.torch.Placement(torch.device("cpu"), cluster.torch.Transfer.HOST,
                                                "CPU")
            assert placement.for_dtype(torch.bfloat16) is cluster.torch.Transfer.HOST
        """,
        "Transfer": """
            import cluster.torch
            assert cluster.torch.Transfer("staged") is cluster.torch.Transfer.STAGED
        """,
        "DistributedGradients": """
            import torch
            import cluster.torch
            torch.manual_seed(0)
            model = torch.nn.Linear(2, 1)
            hooks = cluster.torch.DistributedGradients(model)  # default strategy: one replica
            model(torch.ones(4, 2)).sum().backward()
            hooks.wait()
            assert model.weight.grad.tolist() == [[4.0, 4.0]] and model.bias.grad.tolist() == [4.0]
        """,
        "StateDict": """
            import torch
            import cluster.torch
            import cluster.checkpoint
            model = torch.nn.Linear(2, 1)
            state = cluster.torch.StateDict(model)
            path = cluster.checkpoint.Checkpoint(model=state).write(f"{tmp}/t")
            before = model.weight.detach().clone()
            with torch.no_grad():
                model.weight.zero_()
            cluster.checkpoint.Checkpoint(model=state).read(path)
            assert torch.equal(model.weight, before)
        """,
        "broadcast_module": """
            import torch
            import cluster.torch
            model = torch.nn.Linear(2, 1)
            before = [p.detach().clone() for p in model.parameters()]
            cluster.torch.broadcast_module(model)  # one worker: its own parameters
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        """,
        "broadcast_optimizer_state": """
            import torch
            import cluster.torch
            model = torch.nn.Linear(2, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            cluster.torch.broadcast_optimizer_state(optimizer)
            assert optimizer.param_groups[0]["lr"] == 0.1
        """,
        "load_state_dict": """
            import torch
            import cluster.torch
            import cluster.checkpoint
            load = cluster.torch.load_state_dict
            model = torch.nn.Linear(2, 1)
            path = cluster.checkpoint.Checkpoint(
                model=cluster.torch.StateDict(model)).write(f"{tmp}/t")
            state = load(path, "model")
            assert sorted(state) == ["bias", "weight"]
            assert torch.equal(torch.as_tensor(state["weight"]), model.weight.detach())
        """,
    },
    "cluster.jax": {
        "all_reduce_tree": """
            import jax.numpy as jnp
            import cluster.jax
            out = cluster.jax.all_reduce_tree({"w": jnp.arange(3.0)})  # the default strategy
            assert out["w"].tolist() == [0.0, 1.0, 2.0]
        """,
        "broadcast_tree": """
            import jax.numpy as jnp
            import cluster.jax
            out = cluster.jax.broadcast_tree({"w": jnp.arange(3.0), "n": jnp.array(2)})
            assert out["w"].tolist() == [0.0, 1.0, 2.0] and int(out["n"]) == 2
        """,
    },
}

# The framework a module needs: its tests skip, with the reason, where it is not installed.
_NEEDS = {"cluster.torch": "torch", "cluster.jax": "jax"}

_CASES = [(module, name) for module, uses in _USES.items() for name in uses]
_FIRST_USE_TEST = "test_public_name_works_as_the_first_use_in_a_fresh_interpreter"


def _child_env() -> dict[str, str]:
    """This environment less what would put a child in a cluster (as a user's shell would be)."""
    drop = ("TF_CONFIG", "CLUSTER_TOKEN", "CLUSTER_ALLOW_INSECURE")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}


def _source(code: str, tmp: Path) -> str:
    return f"import numpy as np\ntmp = {str(tmp)!r}\n" + textwrap.dedent(code)


def _check(returncode: int | None, source: str, stderr: str) -> None:
    assert returncode == 0, (
        f"fresh interpreter {'timed out' if returncode is None else f'exited {returncode}'}:"
        f"\n{source}\n--- stderr:\n{stderr}")


class FreshInterpreters:
    """Runs snippets each in a new interpreter (``sys.executable``), ``parallel`` at a time in
    the order submitted, each killed after ``_CHILD_TIMEOUT`` s; :meth:`close` kills the running
    ones and drops the rest. A fresh interpreter per name costs 1-2 s of CPU (numpy and the
    strategies imported anew; torch several seconds), so they overlap on every core."""

    def __init__(self, parallel: int) -> None:
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="first-use")
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._closed = False

    def submit(self, source: str) -> Future:
        """A future of ``(returncode or None when it timed out, source, stderr)``."""
        return self._pool.submit(self._run, source)

    def _run(self, source: str) -> tuple[int | None, str, str]:
        with self._lock:
            if self._closed:
                return None, source, "not run: the test module was torn down"
            child = subprocess.Popen([sys.executable, "-c", source], cwd=REPO, env=_child_env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
            self._running.add(child)
        try:
            _, stderr = child.communicate(timeout=_CHILD_TIMEOUT)
            return child.returncode, source, stderr
        except subprocess.TimeoutExpired:
            child.kill()
            _, stderr = child.communicate()
            return None, source, stderr
        finally:
            with self._lock:
                self._running.discard(child)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            running = list(self._running)
        for child in running:
            child.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def first_uses(request, tmp_path_factory):
    """``{(module, name): future}`` for the selected cases of the first-use test, all started
    at once (the frameworks' cases only where the framework is installed)."""
    selected = [item.callspec.params for item in request.session.items
                if getattr(item, "originalname", None) == _FIRST_USE_TEST]
    runner = FreshInterpreters(parallel=min(4, os.cpu_count() or 1))
    futures = {}
    try:
        for params in selected:
            module, name = params["module"], params["name"]
            if module in _NEEDS and importlib.util.find_spec(_NEEDS[module]) is None:
                continue
            tmp = tmp_path_factory.mktemp(f"{module}.{name}")
            futures[module, name] = runner.submit(_source(_USES[module][name], tmp))
        yield futures
    finally:
        runner.close()


@pytest.mark.parametrize(("module", "name"), _CASES, ids=[f"{m}.{n}" for m, n in _CASES])
def test_public_name_works_as_the_first_use_in_a_fresh_interpreter(module, name, first_uses):
    if module in _NEEDS:
        require(_NEEDS[module])
    _check(*first_uses[module, name].result(timeout=_CHILD_TIMEOUT * 2))


@pytest.mark.parametrize("module", sorted(_USES))
def test_the_table_covers_every_public_name(module):
    if module in _NEEDS:
        require(_NEEDS[module])
    public = importlib.import_module(module).__all__
    assert sorted(public) == sorted(_USES[module]), (
        f"{module}.__all__ and the first-use table differ: add a use for each new public name")


def run_fresh(code: str, tmp_path: Path) -> None:
    """``code`` alone in a new interpreter; fails the test with its stderr unless it exits 0."""
    source = _source(code, tmp_path)
    try:
        child = subprocess.run([sys.executable, "-c", source], cwd=REPO, env=_child_env(),
                               capture_output=True, text=True, timeout=_CHILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:  # run() has killed and reaped the child
        _check(None, source, str(e.stderr or ""))
    else:
        _check(child.returncode, source, child.stderr)


def test_plain_variables_train_with_sgd_outside_any_strategy(tmp_path):
    # Least squares y = X w: Keras' SGD (w -= lr * g), then with momentum (velocity = m *
    # velocity - lr * g; w += velocity), each step checked against the same rule by hand; the
    # loss falls at every step.
    run_fresh("""
        import cluster
        rng = np.random.default_rng(0)
        x = rng.normal(size=(16, 3))
        y = x @ np.array([1.0, -2.0, 0.5])

        def loss_and_grad(w):
            error = x @ w - y
            return float(np.mean(error ** 2)), 2.0 * x.T @ error / len(y)

        for momentum in (0.0, 0.5):
            w = cluster.Variable(np.zeros(3), name="w")
            sgd = cluster.optimizers.SGD(learning_rate=0.1, momentum=momentum)
            expected, velocity = np.zeros(3), np.zeros(3)
            losses = []
            for step in range(1, 11):
                loss, grad = loss_and_grad(w.numpy())
                losses.append(loss)
                assert sgd.apply_gradients([(grad, w)]) == step
                velocity = momentum * velocity - 0.1 * grad
                expected = expected + velocity if momentum else expected - 0.1 * grad
                np.testing.assert_allclose(w.numpy(), expected, rtol=1e-12, atol=1e-15)
            losses.append(loss_and_grad(w.numpy())[0])
            assert all(b < a for a, b in zip(losses, losses[1:])), losses
            assert losses[-1] < 0.25 * losses[0], losses
            assert not cluster.has_strategy() and w.dtype == np.float64
    """, tmp_path)


# -- ReplicaContext.all_reduce takes tf.distribute.ReduceOp's ops: SUM and MEAN ----------------

_NOT_TF_OPS = ["MAX", "min", "PRODUCT", cluster.ReduceOp.MAX, cluster.ReduceOp.MIN]


def _two():
    return cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _rid():
    return np.float64(cluster.get_replica_context().replica_id_in_sync_group)


@pytest.mark.parametrize("op", _NOT_TF_OPS, ids=str)
def test_all_reduce_of_an_op_tf_lacks_raises_value_error_naming_sum_mean(op):
    with pytest.raises(ValueError, match="SUM and ReduceOp.MEAN") as default_error:
        cluster.get_replica_context().all_reduce(op, 1.0)
    assert "cluster.collectives" in str(default_error.value)
    assert "collective_group.all_reduce" in str(default_error.value)
    with pytest.raises(ValueError, match="SUM and ReduceOp.MEAN"):
        _two().run(lambda: cluster.get_replica_context().all_reduce(op, _rid()))


@pytest.mark.parametrize("op", ["MAX", cluster.ReduceOp.MIN], ids=str)
def test_strategy_reduce_of_an_op_tf_lacks_raises_value_error(op):
    with pytest.raises(ValueError, match="SUM and MEAN"):
        _two().reduce(op, 1.0, axis=None)


def test_all_reduce_sum_and_mean_still_work():
    context = cluster.get_replica_context()
    assert context.all_reduce("sum", 2.0) == 2.0 and context.all_reduce("MEAN", 2.0) == 2.0
    two = _two()
    for op, expected in [("SUM", 1.0), (cluster.ReduceOp.SUM, 1.0), ("mean", 0.5),
                         (cluster.ReduceOp.MEAN, 0.5)]:
        results = two.experimental_local_results(
            two.run(lambda op=op: cluster.get_replica_context().all_reduce(op, _rid())))
        assert results == (expected, expected), (op, results)


def test_max_and_min_where_the_error_points():
    # Outside strategy.run: the strategy's collective group (cluster.collectives).
    group = cluster.OneDeviceStrategy("/cpu:0").extended.collective_group
    assert group.all_reduce(np.array([1.0, 5.0]), "MAX").tolist() == [1.0, 5.0]
    # Inside it: all_gather, then the maximum.
    two = _two()
    gathered = two.run(lambda: cluster.get_replica_context().all_gather(
        np.array([_rid(), -_rid()])[None], axis=0).max(axis=0))
    assert [g.tolist() for g in two.experimental_local_results(gathered)] == [[1.0, 0.0]] * 2
    # The package's own callers keep MAX/MIN inside run.
    from cluster.strategies.replica import all_reduce_any_op

    maxed = two.run(lambda: all_reduce_any_op(cluster.get_replica_context(), "MAX", _rid()))
    assert two.experimental_local_results(maxed) == (1.0, 1.0)
