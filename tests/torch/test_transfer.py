"""How gradients travel (cluster.torch._transfer) in one process: the decision table, and every
transfer's bucket code on CPU tensors (the staging and NCCL paths of a CUDA model run the same
code; only the pinned allocation and the stream waits are CUDA's, and they are no-ops here)."""

from __future__ import annotations

import pytest

from tests._requires import require

torch = require("torch")

import cluster.torch as ct  # noqa: E402
from cluster.torch import _gradients, _transfer  # noqa: E402
from cluster.torch._transfer import Placement, Transfer, choose_transfer  # noqa: E402

pytestmark = pytest.mark.timeout(120)

DEVICE, STAGED, HOST = Transfer.DEVICE, Transfer.STAGED, Transfer.HOST


@pytest.mark.parametrize(("args", "expected", "reason"), [
    (("cpu", 4, [], [], None, False), HOST, "CPU tensors"),
    (("cuda", 1, [], [], None, False), STAGED, "one task"),
    (("cuda", 2, [0, 1], [True, True], [(0, 1)], False), DEVICE, "NCCL among"),
    (("cuda", 2, [0, 0], [True, True], [(0, 1)], False), STAGED, "ranks 0 and 1 share GPU 0"),
    (("cuda", 2, [0, 1], [True, False], [(0, 1)], False), STAGED, "rank(s) 1"),
    (("cuda", 2, [0, 1], [True, True], [(0, 1)], True), STAGED, "network path"),
    (("cuda", 2, [0, 1], [True, True], None, False), STAGED, "network path"),
    (("cuda", 2, [0, 0], [True, True], [(0,), (1,)], False), STAGED, "no two tasks share"),
    # Two hosts of two: GPU 0 and 1 on each host, distinct inside each host.
    (("cuda", 4, [0, 1, 0, 1], [True] * 4, [(0, 1), (2, 3)], False), DEVICE, "NCCL"),
    (("cuda", 4, [0, 1, 1, 1], [True] * 4, [(0, 1), (2, 3)], False), STAGED,
     "ranks 2 and 3 share GPU 1"),
    # A rank alone on its host next to a host of two: the group stages that rank's values.
    (("cuda", 3, [0, 1, 0], [True] * 3, [(0, 1), (2,)], False), DEVICE, "NCCL"),
])
def test_choose_transfer(args, expected, reason) -> None:
    transfer, why = choose_transfer(*args)
    assert transfer is expected and reason in why


def test_bfloat16_buckets_are_staged_where_the_rest_goes_to_nccl() -> None:
    cuda = torch.device("cuda", 0)  # a device description: no GPU needed
    placement = Placement(cuda, DEVICE, "test")
    assert placement.for_dtype(torch.bfloat16) is STAGED
    assert placement.for_dtype(torch.float32) is DEVICE
    assert Placement(cuda, STAGED, "test").for_dtype(torch.float32) is STAGED


def test_host_view_is_a_view_for_every_dtype() -> None:
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        buffer = _transfer.host_buffer(4, dtype, torch.device("cpu"))
        view = _transfer.host_view(buffer)
        view[1] = 3
        assert buffer[1].item() == 3 and buffer.sum().item() == 3, dtype


def test_a_cpu_model_is_reduced_on_the_host_with_no_collective_to_decide() -> None:
    grads = ct.DistributedGradients(torch.nn.Linear(2, 2))
    assert grads.placement == Placement(torch.device("cpu"), HOST, grads.placement.reason)


def test_parameters_on_another_device_are_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="one device, the CPU or one CUDA GPU.*meta.*device"):
        ct.DistributedGradients(torch.nn.Linear(2, 2, device="meta"))


def test_device_is_the_cpu_without_cuda_and_the_local_rank_is_zero_alone() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/torch/test_cuda.py checks device() there")
    assert ct.device() == torch.device("cpu")
    assert ct._device.local_rank(cluster_group()) == (0, 1)


def cluster_group():
    import cluster

    return cluster.get_strategy().extended.collective_group


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(3, 40), torch.nn.Tanh(), torch.nn.Linear(40, 2))


@pytest.mark.parametrize("transfer", [HOST, STAGED, DEVICE])
def test_one_process_gets_its_own_gradients_back_in_place(monkeypatch, transfer) -> None:
    monkeypatch.setattr(_gradients, "DIRECT_BYTES", 300)  # the 40x3 and 2x40 weights: direct
    monkeypatch.setattr(_transfer, "plan",
                        lambda device, group: Placement(device, transfer, "test"))
    model = _model()
    grads = ct.DistributedGradients(model, bucket_cap_mb=1e-4, first_bucket_mb=1e-4)
    assert grads.placement.transfer is transfer
    direct = sum(len(b.direct) for b in grads._buckets)
    assert direct == (0 if transfer is STAGED else 2)  # staged: every gradient is copied
    model(torch.ones(4, 3)).sum().backward()
    assert grads.started == len(grads.buckets)  # every bucket started from the hooks
    before = [(p.grad.data_ptr(), p.grad.clone()) for p in model.parameters()]
    grads.synchronize()
    for (ptr, value), p in zip(before, model.parameters(), strict=True):
        assert p.grad.data_ptr() == ptr and torch.equal(p.grad, value)
    # An unused parameter (no gradient anywhere) stays None; a new gradient is a new tensor.
    model.zero_grad()
    model[2](torch.ones(4, 40)).sum().backward()
    grads.synchronize()
    assert model[0].weight.grad is None and model[0].bias.grad is None
    assert torch.equal(model[2].bias.grad, torch.full((2,), 4.0))
