"""The fake GPU machine as processes see it: CuPy importable, the GPUs the environment asks
for, ``CUDA_VISIBLE_DEVICES`` read as the driver reads it, the CuPy version's NCCL ids."""

from __future__ import annotations

import re

import pytest

from tests._fakegpu import fake_gpu_env, run_on_fake_gpu
from tests._fakegpu.fakecuda import visible_devices

pytestmark = pytest.mark.timeout(60)

PROBE = """
import cupy, cupyx
from cupy.cuda import nccl
n = cupy.cuda.runtime.getDeviceCount()
with cupy.cuda.Device(n - 1):
    x = cupy.arange(3.0)
pinned = cupyx.empty_pinned((3,), dtype=x.dtype)
x.get(out=pinned)
print(cupy.__version__, n, x.device.id, type(nccl.get_unique_id()).__name__, pinned.tolist())
"""


@pytest.mark.parametrize(("gpus", "cupy", "visible", "want"), [
    (1, "14", None, "14.2.0 1 0 bytes [0.0, 1.0, 2.0]"),
    (4, "13", None, "13.6.0 4 3 tuple [0.0, 1.0, 2.0]"),
    (4, "14", "2,0", "14.2.0 2 1 bytes [0.0, 1.0, 2.0]"),
])
def test_a_process_sees_cupy_and_the_gpus_asked_for(gpus, cupy, visible, want) -> None:
    done = run_on_fake_gpu("-c", PROBE, gpus=gpus, cupy=cupy, visible=visible, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == want


def test_a_task_process_runs_on_the_machine(fake_gpu) -> None:
    task = fake_gpu.python("-c", "import cupy; print(cupy.cuda.runtime.getDeviceCount())",
                           gpus=3, visible="1,2")
    assert task.wait(50) == 0, task.output
    assert task.output.strip() == "2"


def test_no_visible_gpu_is_cudas_error() -> None:
    done = run_on_fake_gpu("-c", "import cupy; cupy.cuda.runtime.getDeviceCount()", gpus=2,
                           visible="", timeout=50)
    assert done.returncode == 1 and "cudaErrorNoDevice" in done.stderr


def test_the_environment_puts_the_fake_first() -> None:
    env = fake_gpu_env(2, "13", base={"PYTHONPATH": "/elsewhere", "CUDA_VISIBLE_DEVICES": "0"})
    assert env["PYTHONPATH"].split(":") == [str(fake_gpu_env.__globals__["PATH"]), "/elsewhere"]
    assert (env["CLUSTER_FAKE_GPUS"], env["CLUSTER_FAKE_CUPY"]) == ("2", "13")
    assert "CUDA_VISIBLE_DEVICES" not in env


@pytest.mark.parametrize(("visible", "want"), [
    (None, [0, 1, 2, 3]), ("", []), ("-1", []), ("2,0", [2, 0]), ("1,7,2", [1]),
    ("1,1", [1]), ("GPU-8a3c", []), (" 3 , 1", [3, 1]),
])
def test_cuda_visible_devices_is_cut_at_the_first_bad_entry(visible, want) -> None:
    assert visible_devices(4, visible) == want


RANK = """
import sys
import cupy
from cluster.collectives.nccl import NcclComm, unique_id
rank = int(sys.argv[1])
if rank == 0:
    uid = unique_id()
    print(f"uid={uid.hex()}=uid", flush=True)
else:
    uid = bytes.fromhex(sys.argv[2])
with NcclComm(2, uid, rank, 0, timeout_seconds=30) as comm, cupy.cuda.Device(0):
    x = cupy.arange(4, dtype=cupy.float32) * (rank + 1)
    total = comm.all_reduce(x, "SUM")
    first = comm.broadcast(cupy.full(2, rank, dtype=cupy.int64), root=1)
    print("result", cupy.cuda.Device(0).pci_bus_id, total.get().tolist(), first.get().tolist())
"""


@pytest.mark.parametrize("cupy", ["13", "14"])
def test_nccl_ranks_in_two_processes_meet_through_the_unique_id(fake_gpu, cupy) -> None:
    """One process per GPU, as torchrun or Slurm start them: each task sees its own GPU as
    device 0 (``CUDA_VISIBLE_DEVICES``), rank 0 makes the id, the other joins with it."""
    first = fake_gpu.python("-c", RANK, "0", gpus=2, visible="0", cupy=cupy)
    second = fake_gpu.python("-c", RANK, "1", _uid(first), gpus=2, visible="1", cupy=cupy)
    assert (first.wait(60), second.wait(60)) == (0, 0), first.output + second.output
    assert "result 0000:10:00.0 [0.0, 3.0, 6.0, 9.0] [1, 1]" in first.output
    assert "result 0000:11:00.0 [0.0, 3.0, 6.0, 9.0] [1, 1]" in second.output


def test_a_rank_that_leaves_fails_the_others_call(fake_gpu) -> None:
    leaving = RANK.replace("    total = comm", "    sys.exit(3)\n    total = comm")
    first = fake_gpu.python("-c", RANK, "0", gpus=2, visible="0")
    second = fake_gpu.python("-c", leaving, "1", _uid(first), gpus=2, visible="1")
    assert second.wait(60) == 3, second.output
    assert first.wait(60) == 1 and "a remote rank left" in first.output, first.output


def _uid(task) -> str:
    """The unique id rank 0's process printed (waiting for its end: output comes in chunks)."""
    found = re.search(r"uid=([0-9a-f]{256})=uid", task.read_until("=uid", timeout=60))
    assert found, task.output
    return found.group(1)
