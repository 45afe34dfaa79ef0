"""Elastic training is exact: tasks in threads over in-process hubs, float64, a fixed global batch
split among the replicas of the current group and the loss scaled by the global batch. A run
that loses a task, then gets a new one, ends with the weights of the run that lost nothing
(<= 1e-12), and every step is applied exactly once although some were computed twice."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cluster
from cluster.elastic import MembershipChanged, State
from tests.elastic._double import ElasticDouble, Membership, in_threads

pytestmark = pytest.mark.timeout(120)

STEPS, D, B = 15, 4, 12
COMMIT_EVERY = 3   # steps since the last commit are recomputed after a loss


class Died(Exception):
    """The simulated death of a task (its thread ends with it)."""


def _global_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The same rows whatever the membership."""
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((B, D))
    return x, x @ np.arange(1.0, D + 1) + 0.1 * rng.standard_normal(B)


class NumpyModel:
    """``w`` and a ``cluster.optimizers`` optimizer: a linear least-squares model."""

    def __init__(self, make_optimizer) -> None:
        self.w = cluster.Variable(np.zeros(D))
        self.optimizer = make_optimizer()
        self.values = {"w": self.w, "optimizer": self.optimizer}

    def gradient(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x.T @ (x @ self.w.numpy() - y) / B   # the loss scaled by the global batch

    def apply(self, g: np.ndarray) -> None:
        self.optimizer.apply_gradients([(g, self.w)])

    def weights(self) -> np.ndarray:
        return self.w.numpy()


class TorchModel:
    """A ``torch.nn.Linear`` and a torch optimizer, tracked as ``cluster.torch.StateDict``."""

    def __init__(self, make_optimizer) -> None:
        import torch

        from cluster.torch import StateDict

        self.torch = torch
        self.model = torch.nn.Linear(D, 1).double()
        with torch.no_grad():
            for p in self.model.parameters():
                p.zero_()
        self.optimizer = make_optimizer(self.model.parameters())
        self.values = {"model": StateDict(self.model), "optimizer": StateDict(self.optimizer)}

    def gradient(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        torch = self.torch
        self.model.zero_grad()
        out = self.model(torch.from_numpy(x)).reshape(-1)
        loss = ((out - torch.from_numpy(y)) ** 2).sum() / (2 * B)   # scaled by the global batch
        loss.backward()
        return np.concatenate([p.grad.numpy().reshape(-1) for p in self.model.parameters()])

    def apply(self, g: np.ndarray) -> None:
        offset = 0
        for p in self.model.parameters():
            p.grad = self.torch.from_numpy(g[offset:offset + p.numel()].copy()).reshape(p.shape)
            offset += p.numel()
        self.optimizer.step()

    def weights(self) -> np.ndarray:
        return np.concatenate([p.detach().numpy().reshape(-1) for p in self.model.parameters()])


def _train(strategy: ElasticDouble, make_model, script=lambda name, step, where: None):
    model = make_model()
    state = State(**model.values, step=0, applied=[])
    computed: list[int] = []

    def replica_step(x, y):
        ctx = cluster.get_replica_context()
        rows = np.array_split(np.arange(B), ctx.num_replicas_in_sync)[
            ctx.replica_id_in_sync_group]
        return ctx.all_reduce("SUM", model.gradient(x[rows], y[rows]))

    @cluster.elastic.run(strategy, state)
    def train(state):
        while state.step < STEPS:
            script(strategy.name, state.step, "before")
            g = strategy.experimental_local_results(
                strategy.run(replica_step, args=_global_batch(state.step)))[0]
            model.apply(np.asarray(g))
            computed.append(state.step)
            state.applied.append(state.step)
            state.step += 1
            script(strategy.name, state.step - 1, "after")
            if state.step % COMMIT_EVERY == 0 or state.step == STEPS:
                state.commit()

    train(state)
    return {"w": model.weights(), "applied": list(state.applied), "computed": computed,
            "replicas": strategy.num_replicas_in_sync, "regroups": strategy.regroups}


def _torch_model(make_optimizer):
    pytest.importorskip("torch")
    return lambda: TorchModel(make_optimizer)


MODELS = {
    "sgd-momentum": lambda: lambda: NumpyModel(
        lambda: cluster.optimizers.SGD(0.05, momentum=0.9)),
    "adam": lambda: lambda: NumpyModel(lambda: cluster.optimizers.Adam(0.05)),
    "torch-sgd-momentum": lambda: _torch_model(
        lambda p: __import__("torch").optim.SGD(p, lr=0.05, momentum=0.9)),
    "torch-adam": lambda: _torch_model(lambda p: __import__("torch").optim.Adam(p, lr=0.05)),
}


def _uninterrupted(make_model) -> np.ndarray:
    names = ["a", "b", "c"]
    membership = Membership(names)
    doubles = {n: ElasticDouble(membership, n) for n in names}
    out = in_threads({n: (lambda n=n: _train(doubles[n], make_model)) for n in names})
    for n in names:
        assert not isinstance(out[n], BaseException), out[n]
        assert np.array_equal(out[n]["w"], out["a"]["w"])
        assert out[n]["applied"] == list(range(STEPS)) and out[n]["regroups"] == 0
    return out["a"]["w"]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_losing_a_task_and_gaining_one_gives_the_uninterrupted_weights(model):
    make = MODELS[model]()
    reference = _uninterrupted(make)

    names = ["a", "b", "c"]
    membership = Membership(names, minimum=2)
    doubles = {n: ElasticDouble(membership, n) for n in names}
    joiner: dict[str, object] = {}
    joined = threading.Event()

    def join_d():
        try:
            joiner["d"] = _train(ElasticDouble(membership, "d", joining=True), make)
        except BaseException as error:  # handed to the test
            joiner["d"] = error

    def script(name, step, where):
        if name == "c" and step == 4 and where == "after":
            # c dies after it took part in step 4's all-reduce, before the commit at step 6:
            # the survivors fail at step 5 and roll back to the commit at step 3.
            membership.leave("c")
            raise Died("c")
        if name == "a" and step == 10 and where == "before" and not joined.is_set():
            joined.set()   # a new task starts and waits to join at the next commit (step 12)
            membership.ask_to_join("d")
            thread = threading.Thread(target=join_d, name="d", daemon=True)
            joiner["thread"] = thread
            thread.start()

    out = in_threads({n: (lambda n=n: _train(doubles[n], make, script)) for n in names})
    joiner["thread"].join(60)
    assert isinstance(out["c"], Died)
    results = {"a": out["a"], "b": out["b"], "d": joiner["d"]}
    for name, result in results.items():
        assert not isinstance(result, BaseException), (name, result)
        assert result["applied"] == list(range(STEPS)), (name, result["applied"])
        assert result["replicas"] == 3
        np.testing.assert_allclose(result["w"], reference, rtol=0, atol=1e-12)
        assert np.array_equal(result["w"], results["a"]["w"])  # identical on every task
    assert membership.history == [["a", "b", "c"], ["a", "b"], ["d", "a", "b"]]
    # Steps 3 and 4 were computed twice by the survivors (rolled back once), applied once.
    assert results["a"]["computed"].count(3) == 2 and results["a"]["computed"].count(4) == 2
    # The joiner computed only the steps after it joined: it got steps 0..11 from a survivor.
    assert results["d"]["computed"] == list(range(12, STEPS))
    assert results["a"]["regroups"] == 2 and results["d"]["regroups"] == 1


def test_membership_changed_is_raised_on_every_task_at_the_same_commit():
    names = ["a", "b", "c"]
    membership = Membership(names)
    doubles = {n: ElasticDouble(membership, n) for n in names}
    raised: dict[str, tuple[int, int]] = {}
    joiner: dict[str, object] = {}

    def task(name, joining=False):
        strategy = ElasticDouble(membership, name, joining=True) if joining else doubles[name]
        state = State(step=0)

        @cluster.elastic.run(strategy, state)
        def train(state):
            while state.step < 8:
                state.step += 1
                if name == "b" and state.step == 3 and "thread" not in joiner:
                    # Only b hears of the joiner: the agreement makes every task stop here.
                    membership.ask_to_join("d", heard_by={"b"})
                    joiner["thread"] = threading.Thread(
                        target=lambda: joiner.update(d=task("d", joining=True)), daemon=True)
                    joiner["thread"].start()
                try:
                    state.commit()
                except MembershipChanged as e:
                    raised[name] = (state.step, e.commits)
                    raise
            return state.step, strategy.num_replicas_in_sync

        return train(state)

    out = in_threads({n: (lambda n=n: task(n)) for n in names})
    joiner["thread"].join(30)
    assert sorted(raised) == names
    assert len(set(raised.values())) == 1 and raised["a"][0] == 3, raised
    for result in [*out.values(), joiner["d"]]:
        assert result == (8, 4), result
