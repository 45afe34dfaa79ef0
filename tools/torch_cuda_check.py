"""Check ``cluster.torch`` on a CUDA GPU: two tasks train a small CUDA model exactly as one
process does.

Usage (from the repository root, torch with CUDA in the environment)::

    uv run python tools/torch_cuda_check.py [--steps 8] [--device cuda|cpu]

Two tasks (a chief and a worker, each ``python -m worker`` with its own ``TF_CONFIG`` on
loopback) take their device from :func:`cluster.torch.device`, broadcast rank 0's model, and
train it for ``--steps`` SGD steps with :class:`cluster.torch.DistributedGradients`, each on
its half of every global batch; then this process trains the same model on the whole batches
alone and compares. Prints one verdict line and exits 0 (``PASS ...`` or ``SKIP no CUDA ...``)
or 1 (``FAIL ...``)::

    PASS torch CUDA: 2 tasks on cuda:0, cuda:0 (staged: ranks 0 and 1 share GPU 0 ...) equal
    one process after 8 steps (max |diff| 3.7e-09 <= 1e-05), replicas bitwise equal, 4/5
    buckets started during backward

``--device cpu`` runs the same check on the CPU (what a machine without a GPU can check of
this script). Finishes in well under a minute on a GPU machine (most of it importing torch).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TOLERANCE = 1e-5
"""Largest |difference| allowed between the tasks' parameters and one process's (float32: the
two split each batch's sum differently, so the last bits may differ)."""
ROWS, FEATURES, CLASSES = 64, 32, 10
TIMEOUT = 240.0


def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)  # the tasks overwrite rank 1's values by the broadcast anyway
    # The middle weight (512 KiB) is large enough to travel by itself, the rest in buckets.
    return nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 512), nn.ReLU(),
                         nn.Linear(512, CLASSES))


def _batch(step: int):
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(ROWS, FEATURES, generator=gen), torch.randint(CLASSES, (ROWS,),
                                                                     generator=gen)


def _train(model, device, steps: int, rows: slice, grads=None) -> list[int]:
    """SGD with momentum on ``rows`` of every global batch; the buckets started per step."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    started = []
    for step in range(steps):
        x, y = _batch(step)
        loss = F.cross_entropy(model(x[rows].to(device)), y[rows].to(device))
        loss.backward()
        if grads is not None:
            started.append(grads.started)
            grads.synchronize()
        optimizer.step()
        optimizer.zero_grad()
    return started


def task(out_dir: Path, steps: int, kind: str) -> None:
    """One task's part (run under ``python -m worker``): train, then write what it holds."""
    import numpy as np
    import torch

    import cluster
    import cluster.torch as ct

    strategy = cluster.MultiWorkerMirroredStrategy()
    rank, world = strategy.extended.worker_index, strategy.extended.num_workers
    device = ct.device(strategy) if kind == "cuda" else torch.device("cpu")
    torch.manual_seed(rank)
    model = _model().to(device)
    ct.broadcast_module(model, strategy)
    grads = ct.DistributedGradients(model, strategy, bucket_cap_mb=0.25, first_bucket_mb=0.02)
    half = ROWS // world
    started = _train(model, device, steps, slice(rank * half, (rank + 1) * half), grads)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    meta = {"device": str(device), "transfer": grads.placement.transfer.value,
            "reason": grads.placement.reason, "started": min(started),
            "buckets": len(grads.buckets)}
    params = {f"p{i}": p.detach().cpu().numpy() for i, p in enumerate(model.parameters())}
    np.savez(out_dir / f"rank{rank}.npz", meta=np.array(json.dumps(meta)), **params)


def check(steps: int, kind: str) -> tuple[int, str]:
    """``(exit code, verdict line)``."""
    try:
        import torch
    except ImportError:
        return 0, "SKIP no CUDA (torch is not installed)"
    if kind == "cuda" and not torch.cuda.is_available():
        return 0, f"SKIP no CUDA (torch {torch.__version__} sees no GPU)"
    import numpy as np

    from cluster.testing import TaskProcesses, loopback_cluster, tf_config

    spec = loopback_cluster(chief=1, worker=1)
    env = {"CLUSTER_TOKEN": secrets.token_hex(16)}
    with tempfile.TemporaryDirectory() as tmp, TaskProcesses() as tasks:
        argv = ["-m", "worker", __file__, "--task", tmp, "--steps", str(steps), "--device", kind]
        started = [tasks.python(*argv, env=env, cwd=REPO, tf_config=tf_config(spec, job, 0),
                                name=f"{job}:0") for job in ("chief", "worker")]
        for process in started:
            code, output = process.finish(TIMEOUT)
            if code != 0:
                tail = " | ".join(output.strip().splitlines()[-3:])
                return 1, f"FAIL torch {kind}: task {process.name} exited {code}: {tail}"
        results = []
        for rank in range(2):
            with np.load(Path(tmp) / f"rank{rank}.npz") as data:
                meta = json.loads(str(data["meta"]))
                results.append((meta, [data[f"p{i}"] for i in range(len(data.files) - 1)]))
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    model = _model().to(device)
    _train(model, device, steps, slice(0, ROWS))
    expected = [p.detach().cpu().numpy() for p in model.parameters()]
    (meta0, params0), (meta1, params1) = results
    where = (f"2 tasks on {meta0['device']}, {meta1['device']} "
             f"({meta0['transfer']}: {meta0['reason']})")
    if not all(np.array_equal(a, b) for a, b in zip(params0, params1, strict=True)):
        return 1, f"FAIL torch {kind}: {where}: the replicas differ"
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(params0, expected, strict=True))
    if not diff <= TOLERANCE:
        return 1, (f"FAIL torch {kind}: {where}: {diff:.3g} away from one process after "
                   f"{steps} steps (> {TOLERANCE:g})")
    if meta0["started"] < 1:
        return 1, f"FAIL torch {kind}: {where}: no bucket started during backward"
    return 0, (f"PASS torch {kind.upper() if kind == 'cuda' else kind}: {where} equal one "
               f"process after {steps} steps (max |diff| {diff:.2g} <= {TOLERANCE:g}), "
               f"replicas bitwise equal, {meta0['started']}/{meta0['buckets']} buckets started "
               "during backward")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--task", type=Path, help=argparse.SUPPRESS)  # a task's own run
    args = parser.parse_args(argv)
    if args.task is not None:
        task(args.task, args.steps, args.device)
        return 0
    try:
        code, verdict = check(args.steps, args.device)
    except Exception as e:  # the verdict line is the contract: say what failed, in one line
        code, verdict = 1, f"FAIL torch {args.device}: {type(e).__name__}: {e}"
    print(verdict.replace("\n", " "), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
