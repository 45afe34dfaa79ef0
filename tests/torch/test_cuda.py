"""cluster.torch with CUDA models: two tasks train like one process (tools/torch_cuda_check.py),
the broadcasts of a CUDA module and optimizer, a checkpoint round trip on the GPU, and the
device each task takes. Skipped, with the reason, where torch sees no GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cluster.testing import run_group
from tests._requires import require

torch = require("torch")

import cluster.torch as ct  # noqa: E402
from cluster.checkpoint import Checkpoint  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason=f"torch {torch.__version__} sees no CUDA device"),
]

TOOL = Path(__file__).resolve().parents[2] / "tools" / "torch_cuda_check.py"


@pytest.mark.multiprocess
def test_two_tasks_train_a_cuda_model_like_one_process():
    out = subprocess.run([sys.executable, str(TOOL), "--steps", "6"], capture_output=True,
                         text=True, timeout=280)
    assert out.returncode == 0 and out.stdout.startswith("PASS torch CUDA"), (out.stdout,
                                                                              out.stderr)


def _broadcast_ranks(transport):
    import torch

    import cluster
    import cluster.torch as ct
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, devices=["/cpu:0"],
        communication_options=cluster.CommunicationOptions(timeout_seconds=60))
    rank = transport.rank
    device = ct.device(strategy)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 if rank == 0 else 0.5)
    if rank == 0:  # only rank 0 has optimizer state
        model(torch.randn(4, 5, device=device)).sum().backward()
        optimizer.step()
    ct.broadcast_module(model, strategy)
    ct.broadcast_optimizer_state(optimizer, strategy)
    state = optimizer.state_dict()
    return {
        "device": str(device),
        "local": ct._device.local_rank(strategy.extended.collective_group),
        "count": torch.cuda.device_count(),
        "on_gpu": all(t.is_cuda for t in model.state_dict().values()),
        "module": [t.cpu().numpy() for t in model.state_dict().values()],
        "lr": state["param_groups"][0]["lr"],
        "optimizer": {f"{i}/{k}": v.cpu().numpy() for i, s in state["state"].items()
                      for k, v in s.items()},
    }


@pytest.mark.multiprocess
def test_broadcasts_of_a_cuda_module_and_its_optimizer_are_bitwise_rank_0s():
    outcomes = run_group(_broadcast_ranks, 2, timeout=240)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    r0, r1 = (o.result for o in outcomes)
    for r in (r0, r1):  # one task per GPU by default: local rank r takes GPU r (mod the count)
        local, _ = r["local"]
        assert r["device"] == f"cuda:{local % r['count']}" and r["on_gpu"]
    for a, b in zip(r0["module"], r1["module"], strict=True):
        assert np.array_equal(a, b)
    assert r0["lr"] == r1["lr"] == 0.01
    assert r0["optimizer"] and r0["optimizer"].keys() == r1["optimizer"].keys()
    for key, value in r0["optimizer"].items():
        assert np.array_equal(value, r1["optimizer"][key]), key


def test_one_cuda_process_gets_its_own_gradients_through_pinned_buffers():
    device = ct.device()
    model = torch.nn.Sequential(torch.nn.Linear(3, 400), torch.nn.Linear(400, 300)).to(device)
    grads = ct.DistributedGradients(model, bucket_cap_mb=0.01, first_bucket_mb=0.001)
    assert grads.placement.transfer is ct.Transfer.STAGED  # one task: nothing to NCCL
    assert all(b.flat.is_pinned() for b in grads._buckets)
    model(torch.ones(4, 3, device=device)).sum().backward()
    before = [(p.grad.data_ptr(), p.grad.clone()) for p in model.parameters()]
    grads.synchronize()
    for (ptr, value), p in zip(before, model.parameters(), strict=True):
        assert p.grad.data_ptr() == ptr and torch.equal(p.grad, value)
    model.zero_grad()
    model(torch.ones(4, 3, device=device)).sum().backward()
    grads.synchronize()  # new gradients: copied onto the GPU from the pinned buffers
    assert all(p.grad.is_cuda and torch.equal(p.grad, v) for (_, v), p
               in zip(before, model.parameters(), strict=True))


def test_state_dict_round_trip_on_cuda(tmp_path):
    device = ct.device()
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to(device)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(6, 3, device=device)).sum().backward()
    adam.step()
    path = Checkpoint(model=ct.StateDict(model), optimizer=ct.StateDict(adam)).write(
        tmp_path / "ckpt")
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to(device)
    fresh_adam = torch.optim.Adam(fresh.parameters(), lr=1.0)
    Checkpoint(model=ct.StateDict(fresh), optimizer=ct.StateDict(fresh_adam)).read(path)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert b.device == a.device and torch.equal(a, b)
    got, want = fresh_adam.state_dict(), adam.state_dict()
    assert got["param_groups"][0]["lr"] == 0.01
    for i, state in want["state"].items():
        for key, value in state.items():
            assert got["state"][i][key].device == value.device, key
            assert torch.equal(got["state"][i][key], value), key
    plain = ct.load_state_dict(path, "model")  # plain torch: host tensors
    assert all(torch.equal(plain[k], v.cpu()) for k, v in model.state_dict().items())
