"""NCCL among the co-located ranks of one host (``cluster.collectives.host_nccl.HostNccl``).

Threads stand in for the ranks of one host (their groups share a shared-memory arena) and the
fake CuPy of ``_fake_cupy`` stands in for the GPUs, so the set-up (gather of devices, broadcast
of the unique id) runs for real over shared memory and the NCCL calls are checked end to end.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest

from cluster.collectives import host_nccl as host_nccl_mod
from cluster.collectives.host_nccl import HostNccl, nccl_decision
from cluster.collectives.ops import ReduceOp, finalize
from cluster.deadline import Deadline
from cluster.errors import CollectiveTimeoutError

from . import _threads
from ._fake_cupy import FakeCuda, assert_same_bits, host
from ._threads import make_groups, run_ranks

pytestmark = [pytest.mark.timeout(60), pytest.mark.shm_path]

SIG = "test host nccl"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda(gpus=4).install(monkeypatch)


def _hosts(n: int, **kwargs: Any) -> list[HostNccl]:
    """``n`` ranks on one host, their arenas mapped (a first collective sets them up)."""
    _, groups = make_groups(n)
    run_ranks(lambda r: groups[r].barrier(), n)
    locals_ = [g._engine.shm for g in groups]
    assert all(loc is not None for loc in locals_), "the shared-memory path was not taken"
    return [HostNccl(loc, **kwargs) for loc in locals_]  # type: ignore[arg-type]


def _ready(hosts: list[HostNccl], devices: list[int], seq: int = 1) -> list[bool]:
    return run_ranks(
        lambda r: hosts[r].ready(seq, SIG, devices[r], Deadline.after(20)), len(hosts)
    )


def test_ready_with_distinct_devices(fake: FakeCuda) -> None:
    hosts = _hosts(3, timeout_seconds=10)
    assert _ready(hosts, [2, 0, 1]) == [True, True, True]
    comms = [h.comm for h in hosts]
    assert all(c is not None for c in comms)
    assert [(c.rank, c.size, c.device) for c in comms] == [(0, 3, 2), (1, 3, 0), (2, 3, 1)]
    assert len(fake.worlds) == 1  # one unique id, shared by all ranks
    assert [c._comm.world for c in comms] == [next(iter(fake.worlds.values()))] * 3
    assert all(c.timeout_seconds == 10 for c in comms)


def test_not_ready_when_two_ranks_share_a_device(fake: FakeCuda) -> None:
    hosts = _hosts(3)
    assert _ready(hosts, [0, 1, 0]) == [False, False, False]
    assert all(h.comm is None for h in hosts) and fake.worlds == {}
    with pytest.raises(RuntimeError, match=r"call ready\(\) on every local rank first"):
        hosts[0].all_reduce(fake.array([1.0], 0), "SUM")


def test_not_ready_when_one_rank_lacks_nccl(fake: FakeCuda, monkeypatch) -> None:
    real = host_nccl_mod.nccl.available
    monkeypatch.setattr(host_nccl_mod.nccl, "available",
                        lambda: threading.current_thread().name != "rank-1" and real())
    hosts = _hosts(3)
    assert _ready(hosts, [0, 1, 2]) == [False, False, False]
    assert all(h.comm is None for h in hosts) and fake.worlds == {}


def test_each_task_seeing_its_own_gpu_as_device_0_is_ready(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CUDA_VISIBLE_DEVICES`` set per task (Kubernetes, Slurm): every task's device 0 is
    another GPU, which the PCI address tells (each thread stands in for such a task)."""
    def pci_bus_id(device: Any) -> str:
        return f"0000:{0x3B + int(threading.current_thread().name[-1]):02X}:00.0"

    monkeypatch.setattr(fake.cuda.Device, "pci_bus_id", property(pci_bus_id))
    hosts = _hosts(2)
    assert _ready(hosts, [0, 0]) == [True, True]
    assert [h.comm.device for h in hosts] == [0, 0]  # type: ignore[union-attr]


# -- the decision, logged once ---------------------------------------------------------------

OFF_SHARED = ("NCCL off among 2 local ranks: local ranks 0 and 1 both on GPU 0 at 0000:10:00.0 "
              "(one GPU per task needed); the host path carries GPU values")


@pytest.mark.parametrize(("devices", "want"), [
    ([0, 0], (False, OFF_SHARED)),
    ([0, 1], (True, "NCCL on among 2 local ranks, one GPU each (local rank 0 on GPU 0 at "
                    "0000:10:00.0, local rank 1 on GPU 1 at 0000:11:00.0)")),
    ([1, 0, 1, 1], (False, "NCCL off among 4 local ranks: local ranks 0, 2 and 3 all on GPU 1 at "
                           "0000:11:00.0 (one GPU per task needed); the host path carries GPU "
                           "values")),
])
def test_the_decision_and_its_reason_are_logged_once_by_local_rank_0(
    fake: FakeCuda, caplog: pytest.LogCaptureFixture, devices: list[int], want: tuple
) -> None:
    hosts = _hosts(len(devices))
    with caplog.at_level(logging.INFO, logger="cluster.collectives.host_nccl"):
        assert _ready(hosts, devices) == [want[0]] * len(devices)
        assert _ready(hosts, devices, seq=2) == [want[0]] * len(devices)  # cached: no log
    lines = [(r.levelno, r.getMessage()) for r in caplog.records
             if r.name == "cluster.collectives.host_nccl"]
    assert lines == [(logging.INFO, want[1])]


def test_ranks_without_nccl_are_named() -> None:
    usable, reason = nccl_decision([0, 1, 1], [True, False, False], [None, None, None])
    assert not usable
    assert reason == ("NCCL off among 3 local ranks: NCCL unavailable on local ranks 1 and 2 "
                      "(CuPy, its NCCL library or a visible GPU is missing there); local ranks "
                      "1 and 2 both on GPU 1 (one GPU per task needed); the host path carries "
                      "GPU values")


def test_the_pci_address_decides_over_the_device_id() -> None:
    assert nccl_decision([0, 0], [True, True], [0x3B0000, 0x3C0000])[0] is True
    assert nccl_decision([0, 1], [True, True], [0x3B0000, 0x3B0000]) == (
        False, OFF_SHARED.replace("GPU 0 at 0000:10:00.0", "one GPU (devices 0, 1 of their tasks)"))


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_all_reduce(fake: FakeCuda, op: str, dtype: str) -> None:
    n = 3
    hosts = _hosts(n)
    assert _ready(hosts, [0, 1, 2]) == [True] * n
    rng = np.random.default_rng(5)
    inputs = [(rng.standard_normal((4, 5)) * 100).astype(dtype) for _ in range(n)]

    def rank(r: int) -> Any:
        x = fake.array(inputs[r], device=r)
        out = hosts[r].all_reduce(x, op)
        assert out.device.id == r and host(x).tobytes() == inputs[r].tobytes()
        return host(out)

    results = run_ranks(rank, n)
    want = inputs[0].copy()
    ufunc = np.maximum if op == "MAX" else np.add
    for other in inputs[1:]:
        ufunc(want, other, out=want)
    finalize(ReduceOp.parse(op), want, n)
    assert_same_bits(results, want)  # the right values, the same bytes on every rank


def test_broadcast(fake: FakeCuda) -> None:
    hosts = _hosts(3)
    assert _ready(hosts, [1, 2, 0]) == [True] * 3

    def rank(r: int) -> Any:
        x = fake.array([[r, r + 10]], device=[1, 2, 0][r], dtype="int32")
        return host(hosts[r].broadcast(x, root=2))

    assert_same_bits(run_ranks(rank, 3), np.array([[2, 12]], np.int32))


def test_later_calls_return_the_cached_answer_without_communicating(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = _hosts(2)
    assert _ready(hosts, [0, 1]) == [True, True]
    comms = [h.comm for h in hosts]

    def no_communication(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ready() communicated after its first call")

    for h in hosts:
        for name in ["all_gather", "broadcast", "all_reduce", "barrier"]:
            monkeypatch.setattr(h._local, name, no_communication)
    monkeypatch.setattr(host_nccl_mod.nccl, "NcclComm", no_communication)
    # One rank alone: a collective would also hang, waiting for the other.
    assert hosts[1].ready(2, "another signature", 1, Deadline.after(1)) is True
    assert hosts[0].ready(7, SIG, 0, Deadline.after(1)) is True
    assert [h.comm for h in hosts] == comms
    assert len(fake.worlds) == 1


def test_a_cached_false_is_cached_too(fake: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = _hosts(2)
    assert _ready(hosts, [0, 0]) == [False, False]
    monkeypatch.setattr(hosts[0]._local, "all_gather", None)  # would fail if called
    assert hosts[0].ready(2, SIG, 0, Deadline.after(1)) is False


def test_a_rank_whose_device_changed_gets_a_clear_error(fake: FakeCuda) -> None:
    hosts = _hosts(2)
    assert _ready(hosts, [0, 1]) == [True, True]
    with pytest.raises(ValueError, match=r"set up for GPU 1 and cannot move to GPU 3"):
        hosts[1].ready(2, SIG, 3, Deadline.after(1))
    assert hosts[0].ready(2, SIG, 0, Deadline.after(1)) is True


def test_bad_devices_are_refused_before_communicating(fake: FakeCuda) -> None:
    hosts = _hosts(2)
    with pytest.raises(TypeError, match="device must be a GPU id"):
        hosts[0].ready(1, SIG, "0", Deadline.after(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device must be a GPU id >= 0, got -1"):
        hosts[0].ready(1, SIG, -1, Deadline.after(1))
    assert _ready(hosts, [0, 1]) == [True, True]  # the bad calls left the ranks in step


def test_rank_0_failing_to_make_an_id_fails_every_rank(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> tuple:
        raise RuntimeError("ncclGetUniqueId failed")

    fake.nccl.get_unique_id = broken
    hosts = _hosts(2)
    errors = run_ranks(lambda r: hosts[r].ready(1, SIG, r, Deadline.after(20)), 2,
                       return_exceptions=True)
    assert isinstance(errors[0], RuntimeError) and "ncclGetUniqueId failed" in str(errors[0])
    assert isinstance(errors[1], RuntimeError) and "rank 0 could not create" in str(errors[1])
    with pytest.raises(RuntimeError, match="set-up failed earlier .* not retried"):
        hosts[1].ready(2, SIG, 1, Deadline.after(1))


def test_close(fake: FakeCuda) -> None:
    hosts = _hosts(2)
    assert _ready(hosts, [0, 1]) == [True, True]
    raws = [h.comm._comm for h in hosts]  # type: ignore[union-attr]
    for h in hosts:
        h.close()
        h.close()
    assert [r.state for r in raws] == ["destroyed", "destroyed"]
    with pytest.raises(ValueError, match="all_reduce on a closed HostNccl"):
        hosts[0].all_reduce(fake.array([1.0], 0), "SUM")
    with pytest.raises(ValueError, match=r"ready\(\) on a closed HostNccl"):
        hosts[0].ready(2, SIG, 0, Deadline.after(1))


def test_an_aborted_communicator_is_reported_by_ready(fake: FakeCuda) -> None:
    hosts = _hosts(2, timeout_seconds=0.05)
    assert _ready(hosts, [0, 1]) == [True, True]
    fake.hung = True
    errors = run_ranks(lambda r: hosts[r].all_reduce(fake.array([1.0], r), "SUM"), 2,
                       return_exceptions=True)
    assert all(isinstance(e, CollectiveTimeoutError) for e in errors), errors
    with pytest.raises(ValueError, match="was aborted"):
        hosts[0].ready(2, SIG, 0, Deadline.after(1))


# -- through CollectiveGroup.all_reduce ------------------------------------------------------------


@pytest.mark.parametrize("hosts", [[0, 0, 0], [0, 0, 1, 1]], ids=["one host", "two hosts"])
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_group_all_reduce_of_gpu_arrays_runs_nccl_inside_the_host(
        fake: FakeCuda, hosts: list[int], op: str, mode: str) -> None:
    """CuPy in, CuPy out on the caller's GPU; NCCL among the host's GPUs; across hosts only the
    leaders' copies touch host memory. The same through ``all_reduce_async`` (the group's
    stream thread runs it)."""
    from cluster.transport.inproc import InProcessHub

    world = len(hosts)
    hub = InProcessHub(world)
    groups = [_threads.new_group(t, host_id=f"h{hosts[r]}") for r, t in enumerate(hub.transports)]
    devices = [r % 2 if len(set(hosts)) > 1 else r for r in range(world)]  # distinct per host
    inputs = [np.arange(6, dtype=np.float32) * (r + 1) for r in range(world)]

    def rank(r: int) -> Any:
        x = fake.array(inputs[r], devices[r])
        if mode == "async":
            return groups[r].all_reduce_async(x, op).wait(timeout=30)
        return groups[r].all_reduce(x, op)

    results = run_ranks(rank, world, transports=hub.transports)
    want = sum(inputs)
    if op == "MEAN":
        want = want / world
    assert_same_bits(results, want.astype(np.float32))
    assert [r.device.id for r in results] == devices
    reductions = [(rank, device) for kind, rank, device in fake.calls if kind == "allReduce"]
    assert len(reductions) == world  # every rank's GPU took part in one NCCL all-reduce
    broadcasts = [call for call in fake.calls if call[0] in ("broadcast", "bcast")]
    assert len(broadcasts) == (world if len(set(hosts)) > 1 else 0)  # the leaders' result


# -- tasks on the fake GPU machine -----------------------------------------------------------------

TASK = """
import logging

import cupy

import cluster.runtime
from cluster.collectives import CollectiveGroup

logging.getLogger("cluster.collectives.host_nccl").setLevel(logging.INFO)
rt = cluster.runtime.current() or cluster.runtime.start()
group = CollectiveGroup(rt.collective_transport(), settings=rt.settings.collectives)
with cupy.cuda.Device(0):
    total = group.all_reduce(cupy.arange(4, dtype=cupy.float32) * (rt.task_id + 1), "SUM")
print("total", type(total).__name__, total.device.id, total.get().tolist(), flush=True)
group.barrier()
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", ["a GPU per task", "one GPU shared"])
def test_two_tasks_decide_by_their_gpus_and_rank_0_says_why(fake_gpu, tmp_path, layout) -> None:
    """Two ``python -m worker`` tasks on one fake GPU host. Each seeing its own GPU as device 0
    (``CUDA_VISIBLE_DEVICES`` per task, as Kubernetes and Slurm set it): NCCL between the two
    processes. Both on the one GPU: the host path. Either way the result is exact, on the GPU."""
    from cluster.testing import loopback_cluster, tf_config

    script = tmp_path / "task.py"
    script.write_text(TASK)
    spec = loopback_cluster(worker=2)
    own = layout == "a GPU per task"
    tasks = [fake_gpu.python("-m", "worker", script, tf_config=tf_config(spec, "worker", i),
                             gpus=2 if own else 1, visible=str(i) if own else None)
             for i in range(2)]
    assert [t.wait(90) for t in tasks] == [0, 0], [t.output for t in tasks]
    for t in tasks:
        assert "total FakeArray 0 [0.0, 3.0, 6.0, 9.0]" in t.output
    want = ("NCCL on among 2 local ranks, one GPU each (local rank 0 on GPU 0 at 0000:10:00.0, "
            "local rank 1 on GPU 0 at 0000:11:00.0)" if own else OFF_SHARED)
    assert want in tasks[0].output and "host_nccl" not in tasks[1].output
