"""cluster.torch over two real processes (MultiWorkerMirroredStrategy, one replica each):
broadcast of the initial state, bucketed gradient averaging overlapped with backward, unused
parameters, no_sync accumulation, the optimizer-state broadcast, and a checkpoint written by the
chief that every task restores and plain torch loads.

One process group does every check (each spawned process imports torch: seconds per process on
a loaded machine)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cluster.testing import run_group
from tests._requires import require

torch = require("torch")

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _net():
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # Registered first, so reduced last (buckets go in reverse order): the buckets of
            # the used layers can start during backward.
            self.never = nn.Linear(6, 4)  # no rank uses it
            self.branch = nn.Linear(16, 4)  # only rank 1 uses it
            self.fc1 = nn.Linear(6, 16)
            self.norm = nn.BatchNorm1d(16)  # buffers: running stats, an int64 counter
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x, use_branch: bool):
            h = torch.relu(self.norm(self.fc1(x)))
            out = self.fc2(h)
            return out + self.branch(h) if use_branch else out

    return Net()


def _grads(model):
    return [None if p.grad is None else p.grad.detach().clone().numpy()
            for p in model.parameters()]


def _ranks(transport, directory: str):
    import torch

    import cluster
    import cluster.torch as ct
    from cluster.checkpoint import Checkpoint
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    torch.set_num_threads(1)
    rank = transport.rank
    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, devices=["/cpu:0"],
        communication_options=cluster.CommunicationOptions(timeout_seconds=60))
    out: dict = {"rank": rank}
    torch.manual_seed(rank)  # every rank starts from different values...
    model = _net()
    ct.broadcast_module(model, strategy)  # ...and the broadcast makes them rank 0's
    out["initial"] = [t.detach().clone().numpy() for t in model.state_dict().values()]
    # Gradients of >= 96 bytes travel direct (the collective reads p.grad), smaller ones are
    # packed into the bucket: both kinds, used, unused everywhere (never.weight is direct,
    # never.bias packed) and used on one rank only (branch.*).
    from cluster.torch import _gradients
    _gradients.DIRECT_BYTES = 96
    grads = ct.DistributedGradients(model, strategy, bucket_cap_mb=0.0003, first_bucket_mb=0.0002)
    out["direct"] = sum(len(b.direct) for b in grads._buckets)
    out["buckets"] = len(grads.buckets)

    gen = torch.Generator().manual_seed(100 + rank)
    x1, x2 = torch.randn(8, 6, generator=gen), torch.randn(8, 6, generator=gen)
    use_branch = rank == 1

    # This rank's own gradients (no collective inside no_sync), then the averaged ones.
    with grads.no_sync():
        model(x1, use_branch).square().mean().backward()
    out["local"] = _grads(model)
    model.zero_grad()  # grads None: the averaged ones are new tensors, then written in place
    model(x1, use_branch).square().mean().backward()
    out["started_in_backward"] = grads.started
    pointers = [None if p.grad is None else p.grad.data_ptr() for p in model.parameters()]
    grads.synchronize()
    out["in_place"] = all(ptr is None or p.grad.data_ptr() == ptr  # None: made by synchronize
                          for ptr, p in zip(pointers, model.parameters(), strict=True))
    out["synced"] = _grads(model)

    # Accumulation: two micro-batches, one synchronize.
    model.zero_grad()
    with grads.no_sync():
        model(x1, use_branch).square().mean().backward()
    model(x2, use_branch).square().mean().backward()
    grads.synchronize()
    out["accumulated"] = _grads(model)
    model.zero_grad()
    with grads.no_sync():
        model(x1, use_branch).square().mean().backward()
        model(x2, use_branch).square().mean().backward()
    out["local_accumulated"] = _grads(model)

    # Optimizer state: rank 0 has stepped, rank 1 is fresh (another lr): rank 0's everywhere.
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 if rank == 0 else 0.5)
    if rank == 0:  # e.g. resumed alone: its model and optimizer state go to every rank
        optimizer.step()
    ct.broadcast_module(model, strategy)
    ct.broadcast_optimizer_state(optimizer, strategy)
    state = optimizer.state_dict()
    out["lr"] = state["param_groups"][0]["lr"]
    out["opt_state"] = {f"{i}/{k}": v.clone().numpy() for i, s in state["state"].items()
                        for k, v in s.items()}

    out["final"] = [t.detach().clone().numpy() for t in model.state_dict().values()]

    # Checkpoint: every task saves (the chief writes), every task restores into fresh objects.
    path = os.path.join(directory, "ckpt")
    Checkpoint(model=ct.StateDict(model, strategy),
               optimizer=ct.StateDict(optimizer, strategy)).write(path)
    fresh = _net()
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1.0)
    Checkpoint(model=ct.StateDict(fresh, strategy),
               optimizer=ct.StateDict(fresh_opt, strategy)).read(path)
    out["restored_model"] = all(torch.equal(a, b) for a, b in
                                zip(model.state_dict().values(), fresh.state_dict().values(),
                                    strict=True))
    restored = fresh_opt.state_dict()
    out["restored_optimizer"] = (
        restored["param_groups"][0]["lr"] == 0.01
        and all(torch.equal(restored["state"][i][k], v)
                for i, s in state["state"].items() for k, v in s.items()))

    # A second backward before synchronize is refused (the hook raises through backward)
    # before torch adds into p.grad: synchronize still gives the first backward's mean.
    probe = _net()
    probe.load_state_dict(model.state_dict())
    probe(x1, use_branch).square().mean().backward()
    out["probe_local"] = _grads(probe)
    optimizer.zero_grad()
    model(x1, use_branch).square().mean().backward()
    try:
        model(x1, use_branch).square().mean().backward()
        out["twice"] = None
    except RuntimeError as e:
        out["twice"] = str(e)
    grads.synchronize()  # every rank alike: the group goes on
    out["after_twice"] = _grads(model)
    grads.remove()
    return out


def test_two_processes_train_like_ddp(tmp_path):
    outcomes = run_group(_ranks, 2, args=(os.fspath(tmp_path),), timeout=240)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    r0, r1 = (o.result for o in outcomes)

    for a, b in zip(r0["initial"], r1["initial"], strict=True):  # broadcast: bitwise rank 0's
        assert np.array_equal(a, b)
    assert r0["buckets"] >= 3
    assert r0["direct"] == 4  # the four weights of >= 96 bytes
    assert r0["started_in_backward"] >= 1  # overlap: buckets started before synchronize
    assert r0["in_place"] and r1["in_place"]

    names = [n for n, _ in _net().named_parameters()]
    for i, name in enumerate(names):
        s0, s1 = r0["synced"][i], r1["synced"][i]
        if name.startswith("never"):  # no rank had a gradient: left None everywhere
            assert s0 is None and s1 is None
            continue
        assert np.array_equal(s0, s1), name  # bitwise identical replicas
        l0 = r0["local"][i] if r0["local"][i] is not None else np.zeros_like(s0)
        l1 = r1["local"][i]
        np.testing.assert_allclose(s0, (l0 + l1) / 2, rtol=0, atol=1e-7, err_msg=name)
        if name.startswith("branch"):  # rank 0 had none: it counts as zero, as in DDP
            assert r0["local"][i] is None
            np.testing.assert_allclose(s0, l1 / 2, rtol=0, atol=1e-7)
        a0, a1 = r0["accumulated"][i], r1["accumulated"][i]
        assert np.array_equal(a0, a1), name
        la0 = r0["local_accumulated"][i]
        la0 = np.zeros_like(a0) if la0 is None else la0
        np.testing.assert_allclose(a0, (la0 + r1["local_accumulated"][i]) / 2, rtol=0,
                                   atol=1e-6, err_msg=name)

    assert r0["lr"] == r1["lr"] == 0.01
    assert r0["opt_state"] and r0["opt_state"].keys() == r1["opt_state"].keys()
    for key, value in r0["opt_state"].items():
        assert np.array_equal(value, r1["opt_state"][key]), key
    assert r0["restored_model"] and r1["restored_model"]
    assert r0["restored_optimizer"] and r1["restored_optimizer"]
    assert "no_sync" in r0["twice"] and "no_sync" in r1["twice"]
    for i, name in enumerate(names):  # the refused backward left the first one's gradients
        s0, s1 = r0["after_twice"][i], r1["after_twice"][i]
        if name.startswith("never"):
            assert s0 is None and s1 is None
            continue
        assert np.array_equal(s0, s1), name
        l0 = r0["probe_local"][i]
        l0 = np.zeros_like(s0) if l0 is None else l0
        np.testing.assert_allclose(s0, (l0 + r1["probe_local"][i]) / 2, rtol=0, atol=1e-6,
                                   err_msg=name)

    # The chief wrote one checkpoint; plain torch loads the model from it.
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tensors = safetensors_torch.load_file(os.fspath(tmp_path / "ckpt" / "tensors.safetensors"))
    model = _net()
    model.load_state_dict({k.removeprefix("model/"): v for k, v in tensors.items()
                           if k.startswith("model/")})
    for value, a, b in zip(model.state_dict().values(), r0["final"], r1["final"], strict=True):
        assert np.array_equal(a, b) and np.array_equal(value.numpy(), a)


def _twice_ranks(transport):
    import torch

    import cluster
    import cluster.torch as ct
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    torch.set_num_threads(1)
    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, devices=["/cpu:0"],
        communication_options=cluster.CommunicationOptions(timeout_seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 512, bias=False)  # 512 KiB: reduced in place, in p.grad
    grads = ct.DistributedGradients(model, strategy)
    assert sum(len(b.direct) for b in grads._buckets) == 1
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(transport.rank))
    model(x).square().mean().backward()
    local = model.weight.grad.detach().clone().numpy()
    grads.synchronize()
    model.zero_grad()
    model(x).square().mean().backward()
    try:
        model(x * 3).square().mean().backward()  # refused before torch adds into p.grad
        refused = None
    except RuntimeError as e:
        refused = str(e)
    grads.synchronize()
    grads.remove()
    return local, model.weight.grad.detach().clone().numpy(), refused


def test_a_second_backward_is_refused_before_it_touches_a_gradient_being_reduced():
    outcomes = run_group(_twice_ranks, 2, timeout=120)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    (l0, g0, e0), (l1, g1, e1) = (o.result for o in outcomes)
    assert e0 and "synchronize()" in e0 and e1 and "synchronize()" in e1
    assert np.array_equal(g0, g1)
    np.testing.assert_allclose(g0, (l0 + l1) / 2, rtol=0, atol=1e-6)  # the first backward's


def _plain_net():
    from torch import nn

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.never = nn.Linear(6, 4)  # no rank uses it
            self.branch = nn.Linear(16, 4)  # only rank 1 uses it
            self.fc1 = nn.Linear(6, 16)
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x, use_branch: bool):
            h = torch.tanh(self.fc1(x))
            return self.fc2(h) + self.branch(h) if use_branch else self.fc2(h)

    return Plain()


STEPS, ROWS = 4, 16


def _global_batch(step: int):
    return torch.randn(ROWS, 6, generator=torch.Generator().manual_seed(1000 + step))


def _transfer_ranks(transport):
    import torch

    import cluster
    import cluster.torch as ct
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy
    from cluster.torch import _gradients, _transfer
    from cluster.torch._transfer import Placement, Transfer

    torch.set_num_threads(1)
    rank = transport.rank
    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, devices=["/cpu:0"],
        communication_options=cluster.CommunicationOptions(timeout_seconds=60))
    group = strategy.extended.collective_group
    out: dict = {"local": ct._device.local_rank(group), "on": str(ct.device(strategy))}

    # The decision for a CUDA model, on device descriptions (no GPU needed): each is a
    # collective that gathers every rank's GPU and NCCL, with the hosts the group found.
    def decide(index: int, nccl: bool) -> tuple[str, str]:
        _transfer._nccl_available = lambda: nccl
        placement = _transfer.plan(torch.device("cuda", index), group)
        return placement.transfer.value, placement.reason

    out["no_nccl"] = decide(rank, False)
    out["own_gpus"] = decide(rank, True)
    out["one_gpu"] = decide(0, True)

    # Every transfer's bucket code on CPU tensors (forced), trained like one process.
    _gradients.DIRECT_BYTES = 96  # the four weights travel direct, the biases packed
    for transfer in Transfer:
        _transfer.plan = lambda device, group, t=transfer: Placement(device, t, "forced")
        torch.manual_seed(rank)  # different everywhere: the broadcast makes them rank 0's
        model = _plain_net()
        ct.broadcast_module(model, strategy)
        grads = ct.DistributedGradients(model, strategy, bucket_cap_mb=0.0003,
                                        first_bucket_mb=0.0002)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        started = []
        for step in range(STEPS):
            x = _global_batch(step)[rank * ROWS // 2:(rank + 1) * ROWS // 2]
            model(x, rank == 1).square().mean().backward()
            started.append(grads.started)
            grads.synchronize()
            optimizer.step()
            optimizer.zero_grad()
        grads.remove()
        out[transfer.value] = {
            "started": min(started), "buckets": len(grads.buckets),
            "direct": sum(len(b.direct) for b in grads._buckets),
            "params": [p.detach().clone().numpy() for p in model.parameters()],
        }
    return out


def test_every_transfer_trains_two_processes_like_one():
    outcomes = run_group(_transfer_ranks, 2, timeout=240)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    r0, r1 = (o.result for o in outcomes)
    assert (r0["local"], r1["local"]) == ((0, 2), (1, 2))  # one host: local ranks 0 and 1
    assert r0["on"] == r1["on"] == "cpu"
    for key, transfer, reason in [("no_nccl", "staged", "rank(s) 0, 1"),
                                  ("own_gpus", "device", "NCCL among each host's GPUs"),
                                  ("one_gpu", "staged", "ranks 0 and 1 share GPU 0")]:
        assert r0[key] == r1[key], key  # every rank decides alike
        assert r0[key][0] == transfer and reason in r0[key][1], (key, r0[key])

    # One plain torch process on the global batches (rank 1's rows use the branch).
    torch.manual_seed(0)
    model = _plain_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x = _global_batch(step)
        half = ROWS // 2
        loss = (model(x[:half], False).square().mean()
                + model(x[half:], True).square().mean()) / 2
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = [p.detach().numpy() for p in model.parameters()]

    host = r0["host"]["params"]
    for transfer in ("host", "staged", "device"):
        a, b = r0[transfer], r1[transfer]
        assert a["started"] >= 1, transfer  # buckets start during backward
        assert a["direct"] == (0 if transfer == "staged" else 4), transfer
        for name, p0, p1, want, h in zip(("never.w", "never.b", "branch.w", "branch.b",
                                          "fc1.w", "fc1.b", "fc2.w", "fc2.b"),
                                         a["params"], b["params"], expected, host,
                                         strict=True):
            assert np.array_equal(p0, p1), (transfer, name)  # bitwise identical replicas
            assert np.array_equal(p0, h), (transfer, name)  # every transfer: the same bytes
            np.testing.assert_allclose(p0, want, rtol=0, atol=1e-6,
                                       err_msg=f"{transfer} {name}")
