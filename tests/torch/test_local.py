"""cluster.torch in one process: the bucket plan, what each strategy supports, strict checkpoint
restores, and that ``import cluster`` does not import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._requires import require

torch = require("torch")

import cluster  # noqa: E402
import cluster.torch as ct  # noqa: E402
from cluster.checkpoint import Checkpoint  # noqa: E402
from cluster.torch import _gradients  # noqa: E402
from cluster.torch._gradients import bucket_plan  # noqa: E402

pytestmark = pytest.mark.timeout(120)

F32, F16 = torch.float32, torch.float16


@pytest.mark.parametrize(("sizes", "cap", "first", "expected"), [
    ([(F32, 40)] * 3, 80, 40, [[2], [1, 0]]),  # reverse order, a small first bucket
    ([(F32, 40)] * 3, 1000, 1000, [[2, 1, 0]]),
    ([(F32, 400), (F32, 4)], 100, 100, [[1], [0]]),  # larger than the cap: alone
    ([(F32, 4), (F16, 2), (F32, 4)], 100, 100, [[2], [1], [0]]),  # one dtype per bucket
])
def test_bucket_plan(sizes, cap, first, expected) -> None:
    assert bucket_plan(sizes, cap, first) == expected


@pytest.mark.parametrize("direct_bytes", [1, 1 << 30])  # every gradient direct / packed
def test_one_process_averages_to_its_own_gradients_in_place(monkeypatch, direct_bytes) -> None:
    monkeypatch.setattr(_gradients, "DIRECT_BYTES", direct_bytes)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    grads = ct.DistributedGradients(model, bucket_cap_mb=1e-5, first_bucket_mb=1e-5)
    assert sum(len(b.direct) for b in grads._buckets) == (4 if direct_bytes == 1 else 0)
    model(torch.ones(4, 3)).sum().backward()
    assert grads.started == len(grads.buckets) == 4  # all started from the hooks
    before = [(p.grad.data_ptr(), p.grad.clone()) for p in model.parameters()]
    grads.synchronize()
    for (ptr, value), p in zip(before, model.parameters(), strict=True):
        assert p.grad.data_ptr() == ptr and torch.equal(p.grad, value)


def test_replica_threads_are_refused_with_what_to_do() -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="one replica per process.*get_replica_context"):
        ct.DistributedGradients(model, strategy)
    with pytest.raises(ValueError, match="one replica per process"):
        ct.broadcast_module(model, strategy)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ct.DistributedGradients(torch.ones(2))
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        ct.DistributedGradients(torch.nn.Linear(2, 2), bucket_cap_mb=0)
    with pytest.raises(TypeError, match="Module or a torch.optim.Optimizer"):
        ct.StateDict({"w": torch.ones(2)})


def test_a_restore_that_does_not_match_changes_nothing(tmp_path) -> None:
    model = torch.nn.Linear(3, 2)
    path = Checkpoint(model=ct.StateDict(model)).write(tmp_path / "a")
    other = torch.nn.Sequential(torch.nn.Linear(3, 2))  # names "0.weight", "0.bias"
    with pytest.raises(ValueError, match="missing.*0.weight"):
        Checkpoint(model=ct.StateDict(other)).read(path)
    wider = torch.nn.Linear(3, 4)
    kept = [t.clone() for t in wider.state_dict().values()]
    with pytest.raises(ValueError, match="float32"):
        Checkpoint(model=ct.StateDict(wider)).read(path)
    assert all(torch.equal(a, b) for a, b in zip(kept, wider.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="no optimizer state"):
        Checkpoint(model=ct.StateDict(torch.optim.SGD(model.parameters(), 0.1))).read(path)


def test_optimizer_state_round_trips_before_its_first_step(tmp_path) -> None:
    model = torch.nn.Linear(3, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    sgd.step()
    path = Checkpoint(optimizer=ct.StateDict(sgd)).write(tmp_path / "a")
    fresh = torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.5, momentum=0.5)
    Checkpoint(optimizer=ct.StateDict(fresh)).read(path)
    got, want = fresh.state_dict(), sgd.state_dict()
    assert got["param_groups"][0]["lr"] == 0.1 and got["param_groups"][0]["momentum"] == 0.9
    for i, state in want["state"].items():
        assert torch.equal(got["state"][i]["momentum_buffer"], state["momentum_buffer"])
    assert ct.load_state_dict(path, "optimizer")["param_groups"][0]["lr"] == 0.1


def test_import_cluster_does_not_import_torch() -> None:
    code = "import sys, cluster, cluster.checkpoint; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=90, check=True)
    assert out.stdout.strip() == "False"
