"""``cluster.torch`` with a CUDA model in two tasks against one process (a check of
``tools/gpu_check.sh``).

    uv run --no-sync python tools/gpu_torch_check.py [--steps 12]

Trains examples/torch's CNN on CUDA for ``--steps`` SGD-with-momentum steps of 64 digits: once
in this process on each whole global batch, then in two tasks (``clusterctl launch -n 2``, this
file with ``--task``), each on its half of every batch, with ``broadcast_module`` and
``DistributedGradients``. Passes when both tasks end with bitwise-identical parameters, equal
to the single process's to float32 rounding (the gradient sums run in another order). A task's
error (e.g. ``cluster.torch`` refusing a CUDA model) fails the check with that error's line.

Exit status: 0 passed, 1 failed, 77 not run here (torch or CUDA missing; the last line says).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples" / "torch"))
SKIP = 77
BATCH = 64
TOLERANCE = 1e-5  # float32 rounding of sums taken in another order, after --steps steps


def _setup():
    import torch

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_num_threads(1)
    return torch


def single_process(steps: int) -> dict[str, np.ndarray]:
    """The same training in plain torch on CUDA: one process, each global batch's mean loss."""
    import torch.nn.functional as F
    from model import global_batches, load_digits, make_model

    torch = _setup()
    device = torch.device("cuda", 0)
    x_train, y_train, _, _ = (t.to(device) for t in load_digits())
    model = make_model("small", seed=0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for rows in global_batches(len(x_train), BATCH, 0, 1)[:steps]:
        rows = rows.to(device)
        F.cross_entropy(model(x_train[rows]), y_train[rows]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach().cpu().numpy().copy() for n, p in model.named_parameters()}


def task(steps: int, out: Path) -> int:
    """One task of the launched pair (``--task``): examples/torch's loop on a CUDA model."""
    import torch.nn.functional as F
    from model import global_batches, load_digits, make_model

    import cluster
    import cluster.torch

    torch = _setup()
    strategy = cluster.MultiWorkerMirroredStrategy()
    rank, world = strategy.extended.worker_index, strategy.extended.num_workers
    device = torch.device("cuda", rank % torch.cuda.device_count())
    x_train, y_train, _, _ = (t.to(device) for t in load_digits())
    model = make_model("small", seed=rank).to(device)  # rank 1's differs: the broadcast fixes it
    cluster.torch.broadcast_module(model, strategy)
    grads = cluster.torch.DistributedGradients(model, strategy, bucket_cap_mb=0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for rows in global_batches(len(x_train), BATCH, 0, 1)[:steps]:
        mine = torch.from_numpy(np.array_split(rows.numpy(), world)[rank]).to(device)
        loss = F.cross_entropy(model(x_train[mine]), y_train[mine], reduction="sum")
        (loss * world / len(rows)).backward()
        grads.synchronize()
        optimizer.step()
        optimizer.zero_grad()
    params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
    if any(p.device.type != "cuda" for p in model.parameters()):
        raise AssertionError("the model left the GPU")
    np.savez(out / f"params-{rank}.npz", **params)
    grads.remove()
    return 0


def check(steps: int) -> int:
    try:
        torch = _setup()
    except ImportError:
        print("torch is not installed (uv sync --inexact --extra torch)", flush=True)
        return SKIP
    if not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device (a CPU-only torch, or no driver)", flush=True)
        return SKIP
    started = time.monotonic()
    want = single_process(steps)
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            [sys.executable, "-m", "cluster.ctl.cli", "launch", "-n", "2", __file__, "--",
             "--task", "--steps", str(steps), "--out", tmp],
            cwd=REPO, capture_output=True, text=True, timeout=240)
        if run.returncode:
            lines = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.strip()]
            errors = [ln for ln in lines if "Error" in ln or "error" in ln]
            print((errors or lines or ["no output"])[-1], flush=True)
            print(f"failed: the two tasks exited {run.returncode}", flush=True)
            return 1
        got = [dict(np.load(Path(tmp) / f"params-{r}.npz")) for r in range(2)]
    if any(got[0][n].tobytes() != got[1][n].tobytes() for n in want):
        print("failed: the two tasks' parameters differ", flush=True)
        return 1
    worst = max(float(np.max(np.abs(got[0][n] - want[n]))) for n in want)
    verdict = "" if worst <= TOLERANCE else "failed: "
    print(f"{verdict}2 CUDA tasks bitwise identical; max |diff| vs one process {worst:.1e} "
          f"(<= {TOLERANCE:.0e}), {steps} steps, {time.monotonic() - started:.1f} s", flush=True)
    return 0 if worst <= TOLERANCE else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--task", action="store_true", help="run as one launched task")
    parser.add_argument("--out", type=Path, help="with --task: where to write params-<rank>")
    args = parser.parse_args(argv)
    if args.task:
        return task(args.steps, args.out)
    return check(args.steps)


if __name__ == "__main__":
    sys.exit(main())
