"""``cluster.elastic.State`` with ``cluster.torch.StateDict``: a torch module's and optimizer's
state rolls back exactly (optimizer state made after the commit included) and a fresh joiner
receives both."""

from __future__ import annotations

import numpy as np
import pytest

import cluster
from cluster.elastic import State
from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy
from cluster.transport.inproc import InProcessHub
from tests.elastic._double import in_threads

torch = pytest.importorskip("torch")
StateDict = pytest.importorskip("cluster.torch").StateDict

pytestmark = pytest.mark.timeout(180)  # the first torch use is slow on a loaded machine


def _model(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    return model.double()


def _steps(model, optimizer, first: int, n: int) -> None:
    for step in range(first, first + n):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 3, generator=g, dtype=torch.float64)
        loss = (model(x) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _flat(model, optimizer) -> list[bytes]:
    params = [p.detach().numpy().tobytes() for p in model.parameters()]
    saved = optimizer.state_dict()["state"]   # by parameter index: an order that load keeps
    state = [saved[i][k].numpy().tobytes() for i in sorted(saved) for k in sorted(saved[i])]
    return params + state


@pytest.mark.parametrize("make", [lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                                  lambda p: torch.optim.Adam(p, lr=0.01)])
def test_torch_state_rolls_back_exactly(make):
    model = _model(0)
    optimizer = make(model.parameters())
    state = State(model=StateDict(model), optimizer=StateDict(optimizer), step=0)
    _steps(model, optimizer, 0, 3)       # the optimizer's state is made after the commit
    first = _flat(model, optimizer)
    state.restore()
    assert optimizer.state_dict()["state"] == {}
    _steps(model, optimizer, 0, 3)
    assert _flat(model, optimizer) == first

    state.commit()
    _steps(model, optimizer, 3, 2)
    later = _flat(model, optimizer)
    _steps(model, optimizer, 5, 1)
    state.restore()
    _steps(model, optimizer, 3, 2)
    assert _flat(model, optimizer) == later


def test_a_fresh_joiner_receives_the_module_and_optimizer_state():
    hub = InProcessHub(2)
    strategies = [MultiWorkerMirroredStrategy._from_transport(
        t, devices=["/cpu:0"], communication_options=cluster.CommunicationOptions(
            timeout_seconds=20)) for t in hub.transports]

    def task(rank):
        model = _model(seed=rank)                 # different initial weights
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        state = State(model=StateDict(model, strategies[rank]),
                      optimizer=StateDict(optimizer, strategies[rank]), step=0)
        if rank == 1:                             # trained and committed; rank 0 is fresh
            _steps(model, optimizer, 0, 2)
            state.step = 2
            state.commit()
        state.sync(strategies[rank])
        return state.step, _flat(model, optimizer)

    out = in_threads({0: lambda: task(0), 1: lambda: task(1)})
    assert not isinstance(out[0], BaseException), out[0]
    assert out[0] == out[1] and out[0][0] == 2
    assert len(out[0][1]) > len(list(_model(0).parameters()))   # the Adam state came too
    assert np.frombuffer(out[0][1][0], np.float64).size == 12
