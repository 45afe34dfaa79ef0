"""PyTorch example: a CNN on handwritten digits, trained DistributedDataParallel's way with
``cluster.torch`` under MultiWorkerMirroredStrategy (one replica per task).

Run it on a chief and two workers with ``uv run clusterctl launch examples/torch/cluster.yaml``,
or alone (``uv run python examples/torch/train.py``: one task). Every task:

1. builds the model (any seed) and takes rank 0's parameters (``broadcast_module``);
2. takes its rows of each global batch (``np.array_split`` of the batch over the tasks);
3. runs forward and backward; ``DistributedGradients`` starts bucketed all-reduces from the
   autograd hooks while backward goes on, and ``synchronize()`` writes the mean into ``p.grad``;
4. steps its own optimizer: the replicas stay bitwise identical.

The local loss is ``sum of this task's losses * num_workers / global batch rows``, so the mean
over the tasks is the global batch's mean loss even when the batch does not split evenly: the
run computes what one process computes on the same global batches (to float32 rounding).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import cluster
import cluster.torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import SIZES, global_batches, load_digits, make_model  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, help="stop after this many steps")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--save-dir", type=Path,
                        help="every task writes its final parameters to params-<rank>.npz here")
    return parser.parse_args(argv)


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # tasks share the cores
    strategy = cluster.MultiWorkerMirroredStrategy()
    rank, world = strategy.extended.worker_index, strategy.extended.num_workers
    chief = strategy.extended.is_chief
    x_train, y_train, x_test, y_test = load_digits()

    model = make_model(args.size, seed=args.seed + rank)  # different on purpose: the broadcast
    cluster.torch.broadcast_module(model, strategy)        # gives every task rank 0's
    grads = cluster.torch.DistributedGradients(model, strategy, bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate,
                                momentum=args.momentum)
    if chief:
        count = sum(p.numel() for p in model.parameters())
        print(f"training a {count:,}-parameter CNN on {len(x_train)} digits: {world} task(s), "
              f"global batch {args.batch_size}", flush=True)

    started, step = time.monotonic(), 0
    for epoch in range(1, args.epochs + 1):
        for rows in global_batches(len(x_train), args.batch_size, args.seed, epoch):
            mine = np.array_split(rows.numpy(), world)[rank]
            x, y = x_train[mine], y_train[mine]
            loss = F.cross_entropy(model(x), y, reduction="sum") * world / len(rows)
            loss.backward()  # the buckets' all-reduces start here, as gradients come
            grads.synchronize()  # p.grad = the mean over the tasks = the global batch's
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == args.steps:
                break
        if chief:
            print(f"epoch {epoch}/{args.epochs}  train accuracy "
                  f"{accuracy(model, x_train, y_train):.4f}", flush=True)
        if step == args.steps:
            break
    test_accuracy = accuracy(model, x_test, y_test)
    if chief:
        print(f"test accuracy {test_accuracy:.4f} on {len(x_test)} held-out digits "
              f"({time.monotonic() - started:.1f} s, {step} steps)", flush=True)
    if args.save_dir:
        args.save_dir.mkdir(parents=True, exist_ok=True)
        params = {name: p.detach().numpy() for name, p in model.named_parameters()}
        np.savez(args.save_dir / f"params-{rank}.npz", test_accuracy=test_accuracy, **params)
    grads.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
