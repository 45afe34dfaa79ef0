"""The torch side of ``bench/strategy.py``: ``torch.distributed`` gloo and DDP, N processes.

Cases, on the same shapes as ours (:mod:`bench._strategy_task`):

- ``all_reduce:SIZE``: ``dist.all_reduce`` (SUM) of SIZE bytes of float32, after a barrier.
- ``ddp_backward:MODEL`` and ``local_backward:MODEL``: a module holding one ``nn.Parameter`` per
  tensor of the model (:mod:`bench._model_shapes`), whose forward is
  ``loss = sum((p * g).sum())`` with fixed random ``g`` of each shape, so every parameter's
  gradient is ``g`` (a full tensor, as in training). The timed call is ``loss.backward()``
  (the forward runs before the barrier): under ``DistributedDataParallel`` (gloo, default
  25 MiB buckets) it includes DDP's bucketed all-reduce, overlapped with the backward pass as
  in training, and returns once the last bucket is reduced; on the bare module (same
  parameters, same process) it is the local backward alone. ``ddp_backward - local_backward``
  (of the medians) is DDP's all-reduce time as a user feels it: the part of the step that
  communication adds. Gradients are reset to ``None`` before each forward, both ways.
- ``bucket_all_reduce:MODEL``: gloo's all-reduce of DDP's buckets for the model (reverse
  order, 1 MiB then 25 MiB), all started at once and awaited, with no backward: the same
  communication with nothing to hide behind (DDP's copies into its buckets left out).
- ``sgd_step:MODEL``: ``torch.optim.SGD(lr=0.5).step()`` over the same parameters with their
  gradients set: the update that DDP's figure leaves out and our ``apply_gradients`` includes.

Run as ``python bench/_strategy_torch.py RANK N PORT CONFIG_JSON``, a rank prints its times as
one ``TORCH_BENCH {json}`` line (with ``cpu:all_reduce:SIZE`` and
``cpu:bucket_all_reduce:MODEL``: the process's CPU seconds per timed call, gloo's threads
included). Every iteration's time is each rank's ``perf_counter`` around the call; the harness
takes the slowest rank per iteration. One thread per process
(``torch.set_num_threads(1)``), as ours.
torch is a benchmark-only dependency (never a runtime one): without it :func:`bench_torch`
returns ``None``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._model_shapes import MODELS  # noqa: E402
from bench._results import task_result  # noqa: E402
from cluster.ctl.ports import pick_free_ports  # noqa: E402
from cluster.deadline import Deadline  # noqa: E402
from cluster.testing import TaskProcesses  # noqa: E402

__all__ = ["TorchBenchError", "bench_torch", "torch_version"]

_LINE = "TORCH_BENCH "  # a rank's result line: the protocol with bench_torch


class TorchBenchError(RuntimeError):
    """A gloo rank failed or the group did not finish in time; names N and the rank."""


def torch_version() -> str | None:
    """torch's version, or ``None`` where it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def _timed(dist, call, iters: int, warmup: int, before=None,
           cpu: list[float] | None = None) -> list[float]:
    """As ``bench._strategy_task.timed``: seconds per call, and with ``cpu`` the CPU seconds
    of this process (gloo's threads included) per call appended to it."""
    times = []
    for i in range(warmup + iters):
        if before is not None:
            before()
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
        if i >= warmup:
            times.append(elapsed)
            if cpu is not None:
                cpu.append(used)
    return times


def _all_reduce_case(dist, torch, size: int, iters: int, warmup: int,
                     cpu: list[float]) -> list[float]:
    x = torch.ones(size // 4, dtype=torch.float32)
    y = [x]

    def reset() -> None:  # all_reduce works in place: every iteration starts from ones
        y[0] = x.clone()

    times = _timed(dist, lambda: dist.all_reduce(y[0], op=dist.ReduceOp.SUM), iters, warmup,
                   reset, cpu)
    if not torch.all(y[0] == dist.get_world_size()):
        raise AssertionError(f"gloo all_reduce of {size} bytes of ones: not the world size")
    return times


def _model_cases(dist, torch, model: str, iters: int, warmup: int) -> dict[str, list[float]]:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    shapes = MODELS[model]()
    generator = torch.Generator().manual_seed(0)

    class Shapes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.params = nn.ParameterList(nn.Parameter(torch.zeros(s)) for _, s in shapes)
            self.g = [torch.randn(s, generator=generator) for _, s in shapes]

        def forward(self):
            return sum((p * g).sum() for p, g in zip(self.params, self.g, strict=True))

    module = Shapes()
    ddp = DistributedDataParallel(module)
    loss = []

    def forward(m):
        def run() -> None:
            for p in module.params:
                p.grad = None
            loss[:] = [m()]
        return run

    out = {
        f"local_backward:{model}": _timed(dist, lambda: loss[0].backward(), iters, warmup,
                                          forward(module)),
        f"ddp_backward:{model}": _timed(dist, lambda: loss[0].backward(), iters, warmup,
                                        forward(ddp)),
    }
    # DDP averages over ranks: every rank's gradient is g, so is the mean.
    if not torch.allclose(module.params[-1].grad, module.g[-1]):
        raise AssertionError(f"DDP over {model}: the gradient is not the ranks' mean")
    # gloo alone on DDP's buckets: the same all-reduces with no backward to hide behind.
    buckets = [torch.ones(n) for n in _ddp_buckets([math.prod(s) for _, s in shapes])]

    def reduce_buckets() -> None:
        for work in [dist.all_reduce(b, async_op=True) for b in buckets]:
            work.wait()

    out[f"bucket_all_reduce:{model}"] = _timed(
        dist, reduce_buckets, iters, warmup, cpu=out.setdefault(f"cpu:bucket_all_reduce:{model}",
                                                                []))
    # The update DDP's figure leaves out and ours includes: torch's own SGD step over the same
    # parameters, gradients in place (torch's default, the multi-tensor "foreach" kernel).
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    out[f"sgd_step:{model}"] = _timed(dist, optimizer.step, iters, warmup)
    return out


def _ddp_buckets(sizes: list[int], first_cap: int = 1 << 20, cap: int = 25 << 20) -> list[int]:
    """Element counts of DDP's gradient buckets for float32 parameters of ``sizes`` (in
    registration order): DDP fills buckets in reverse order (the order backward produces
    gradients); a bucket closes with the tensor that brings it to 1 MiB (the first) or 25 MiB (the
    others), DDP's defaults."""
    buckets: list[int] = []
    current, limit = 0, first_cap
    for n in reversed(sizes):
        current += n
        if current * 4 >= limit:  # as DDP: the tensor that reaches the limit closes its bucket
            buckets.append(current)
            current, limit = 0, cap
    if current:
        buckets.append(current)
    return buckets


def _rank(rank: int, n: int, port: int, config: dict) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    times: dict[str, list[float]] = {}
    for size in config["sizes"]:
        times[f"all_reduce:{size}"] = _all_reduce_case(
            dist, torch, size, config["iters"], config["warmup"],
            times.setdefault(f"cpu:all_reduce:{size}", []))
    for model in config["models"]:
        times.update(_model_cases(dist, torch, model, config["model_iters"],
                                  config["model_warmup"]))
    dist.barrier()
    dist.destroy_process_group()
    return times


def bench_torch(n: int, sizes: list[int], models: list[str], iters: int, warmup: int,
                model_iters: int, model_warmup: int, timeout: float = 1200.0
                ) -> list[dict[str, list[float]]] | None:
    """Per rank, ``{case: [seconds per timed iteration]}`` of N gloo processes on loopback (see
    the module docstring for the cases); ``None`` without torch.

    The ranks are fresh ``python bench/_strategy_torch.py`` processes (spawn semantics, reaped
    however this ends, no multiprocessing helper process left behind), each printing one
    ``TORCH_BENCH {json}`` line.

    Raises:
        TorchBenchError: a rank exited non-zero or without a result, or not every rank was done
            within ``timeout`` s (every process is killed and reaped first).
    """
    if torch_version() is None:
        return None
    (port,) = pick_free_ports("127.0.0.1", 1)
    config = json.dumps({"sizes": sizes, "models": models, "iters": iters, "warmup": warmup,
                         "model_iters": model_iters, "model_warmup": model_warmup})
    deadline = Deadline.after(timeout)
    results = []
    with TaskProcesses() as ranks:
        started = [ranks.python(__file__, str(r), str(n), str(port), config, name=f"gloo rank {r}")
                   for r in range(n)]
        for rank in started:
            results.append(task_result(rank, deadline.remaining(), _LINE, f"gloo N={n}",
                                       TorchBenchError))
    return results


if __name__ == "__main__":
    _times = _rank(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))
    print(_LINE + json.dumps(_times), flush=True)
