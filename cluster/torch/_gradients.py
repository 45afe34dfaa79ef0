"""``DistributedGradients``: DDP-style gradient averaging that overlaps backward.

How a step goes (the protocol every rank follows, so every rank issues the same collectives in
the same order):

1. At construction the trainable parameters (``requires_grad``, each once) are split into
   buckets in *reverse* registration order (DDP's order: the last layers' gradients are ready
   first in backward), each of one dtype and at most ``bucket_cap_mb`` (the first bucket at
   most ``first_bucket_mb``, so communication starts early). A bucket owns one flat buffer with
   one slot per *small* parameter (under :data:`DIRECT_BYTES`) plus one *usage flag* per
   parameter; larger parameters' gradients travel *direct*.
2. During ``loss.backward()`` a post-accumulate-grad hook takes each parameter's gradient: a
   small one is copied into its slot, a large one is not copied at all (the collective reduces
   ``p.grad`` in place, where torch left it: no copy in and none out, as with DDP's
   ``gradient_as_bucket_view``), and its flag is set to 1. When a bucket is complete, it and
   every complete bucket after the last one started are started in bucket order (never out of
   order: a rank whose hooks fire in another order still issues the same sequence), one
   ``all_reduce_many_async(MEAN, in_place=True)`` of ``[flat, direct gradients...]`` per
   bucket. The all-reduces run in the group's stream while backward goes on.
3. :meth:`DistributedGradients.synchronize` (alias ``wait``) starts the buckets still waiting
   (unused parameters: their slots are zeros and their flags 0), waits for every bucket, and
   copies each small parameter's mean from its slot into ``p.grad`` *in place*; a large one's
   mean is already there.

Unused parameters (no gradient on this rank at ``synchronize``): they contribute zeros, so every
rank's buckets have the same layout and the same collectives run everywhere. The reduced flag
says whether *any* rank had a gradient: if so ``p.grad`` is set to the mean over all ranks
(ranks without a gradient count as zero, as in DDP's ``find_unused_parameters=True``); if no
rank had one, ``p.grad`` is left as it was (``None`` after ``zero_grad()``), so optimizers skip
the parameter on every rank alike. This costs nothing extra: the flags travel in the buckets.

Gradient accumulation: inside :meth:`no_sync` the hooks do nothing, gradients accumulate in
``p.grad`` locally; the first backward outside it carries the accumulated sums.

CUDA models: how a bucket travels is decided once, at construction
(:mod:`cluster.torch._transfer`): CPU tensors are reduced in place as above (``HOST``); CUDA
tensors go to the group as they are where each task has its own GPU and NCCL (``DEVICE``: the
bucket's flat buffer lives on the GPU, results are copied into ``p.grad``), else through one
pinned host buffer per bucket (``STAGED``: every gradient is copied into it asynchronously by
its hook, the bucket waits for those copies when it starts, is reduced in place on the host,
and :meth:`DistributedGradients.synchronize` copies the means back onto the GPU).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from cluster.collectives.ops import ReduceOp
from cluster.collectives.work import Work
from cluster.torch import _transfer
from cluster.torch._transfer import Placement, Transfer

__all__ = ["DistributedGradients", "bucket_plan", "group_of"]

_MB = 1024 * 1024


def group_of(strategy: Any, what: str) -> Any:
    """The collective group of ``strategy`` (one rank per process) for ``what``.

    Raises ``ValueError`` when the strategy's replicas are threads of one process (several
    local replicas: ``MirroredStrategy`` with several devices, or ``MultiWorkerMirroredStrategy``
    with several devices per task) or it has no collectives (``ParameterServerStrategy``).
    """
    if strategy is None:
        import cluster  # the current strategy, as tf.distribute.get_strategy()

        strategy = cluster.get_strategy()
    extended = strategy.extended
    group = getattr(extended, "collective_group", None)
    if group is None or extended.num_local_replicas != 1:
        raise ValueError(
            f"{what} needs one replica per process, but {type(strategy).__name__} has "
            f"{extended.num_local_replicas} local replica(s) and "
            f"{'no' if group is None else 'a'} collective group: use "
            "MultiWorkerMirroredStrategy with one device per task (the default on a CPU host), "
            "or a single-replica strategy. With replica threads in one process "
            "(MirroredStrategy), give each replica its own model and average its gradients "
            "with get_replica_context().all_reduce inside strategy.run"
        )
    return group


def bucket_plan(sizes: list[tuple[torch.dtype, int]], cap_bytes: int,
                first_cap_bytes: int) -> list[list[int]]:
    """Buckets of parameter indices: reverse index order, one dtype per bucket, a new bucket
    when the next parameter would pass the cap (a parameter larger than the cap is alone).

    ``sizes`` is ``(dtype, nbytes)`` per parameter in registration order. Pure, so tested
    alone.

    >>> bucket_plan([(torch.float32, 40), (torch.float32, 40), (torch.float32, 40)], 80, 40)
    [[2], [1, 0]]
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0
    for index in reversed(range(len(sizes))):
        dtype, nbytes = sizes[index]
        cap = first_cap_bytes if not buckets else cap_bytes
        if current and (sizes[current[0]][0] != dtype or used + nbytes > cap):
            buckets.append(current)
            current, used = [], 0
        current.append(index)
        used += nbytes
    if current:
        buckets.append(current)
    return buckets


DIRECT_BYTES = 256 * 1024
"""Gradients of at least this many bytes travel as themselves (the collective reads ``p.grad``
where it lies: no copy into the bucket); smaller ones are packed into the bucket's flat buffer
(one collective value for many small tensors: less per-value overhead than the copy saves)."""


@dataclass
class _Bucket:
    """One bucket: its parameters, where each one's gradient travels, and this step's state.

    A parameter either has a slot in ``flat`` (``offsets[i] >= 0``: its gradient is copied there)
    or travels *direct* (``offsets[i] == -1``: ``p.grad`` itself is a value of the bucket's
    all-reduce). ``flat`` ends with one usage flag per parameter (so it always exists).
    """

    params: list[torch.nn.Parameter]
    offsets: list[int]
    flat: torch.Tensor  # packed gradients, then one usage flag per parameter
    flags_at: int
    direct: list[int]  # positions (in params) of the direct parameters, in order
    transfer: Transfer  # HOST/DEVICE: flat on the parameters' device; STAGED: pinned host
    sent: list[torch.Tensor | None] = field(default_factory=list)  # per direct: what travels
    ready: int = 0
    work: Work | None = None
    filled: set[int] = field(default_factory=set)  # indices (in params) with a gradient
    streams: set[Any] = field(default_factory=set)  # STAGED: streams of this step's copies


class DistributedGradients:
    """Averages a module's gradients over every process of a strategy, overlapping backward.

    In each task of a launched cluster (not a doctest: it needs the cluster)::

        grads = DistributedGradients(model, strategy)
        broadcast_module(model, strategy)                      # same start everywhere
        loss_fn(model(x), y).backward()                        # buckets start as grads are ready
        grads.synchronize()                                    # p.grad = the mean, in place
        optimizer.step(); optimizer.zero_grad()

    Contract:

    - ``strategy`` (default: the current one) must have one replica per process (see
      :func:`group_of`); the collectives run on ``strategy.extended.collective_group`` and keep
      one order with the strategy's own calls. Every rank must build it over the same module
      structure and run the same steps (same backward/synchronize sequence).
    - One ``synchronize()`` per backward (outside :meth:`no_sync`). A second backward before
      ``synchronize()`` raises ``RuntimeError`` from a hook that runs before torch accumulates,
      so ``p.grad`` keeps the first backward's gradient being reduced, and ``synchronize()``
      still gives its mean (use :meth:`no_sync` to accumulate); ``synchronize()`` without a
      backward averages whatever ``p.grad`` holds.
    - Results are bitwise identical on every rank (the collectives' contract), written into the
      existing ``p.grad`` tensors; the module's parameters are never touched.
    - Between ``backward()`` and ``synchronize()`` leave ``p.grad`` alone: the all-reduces of
      large gradients read ``p.grad`` itself while they run (as ``torch.distributed``'s
      ``async_op`` works read their tensors).
    - ``synchronize(timeout)`` waits at most ``timeout`` seconds per bucket
      (:class:`~cluster.errors.CollectiveTimeoutError`); each collective also has the group's
      deadline (``CommunicationOptions.timeout_seconds``). A failed collective raises the
      group's typed error (naming the peer and the call).
    - Unused parameters and accumulation: see the module docstring.
    - Parameters on one device: the CPU, or one CUDA GPU (:func:`cluster.torch.device` gives a
      task its own). For a CUDA model in several tasks the constructor is a collective (it
      learns every task's GPU): build it at the same point on every task. How gradients travel
      (NCCL, or pinned host staging) is :attr:`placement`; results are the same either way.
    - Between ``backward()`` and ``synchronize()`` issue no other collective on the strategy's
      group: buckets still waiting (unused parameters) start in ``synchronize()``, and every
      rank must issue them at the same point of the group's order.
    - :meth:`remove` takes the hooks off (also on leaving a ``with`` block).
    """

    def __init__(self, module: torch.nn.Module, strategy: Any = None, *,
                 bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"DistributedGradients takes a torch.nn.Module, got "
                            f"{type(module).__name__}")
        for name, value in (("bucket_cap_mb", bucket_cap_mb),
                            ("first_bucket_mb", first_bucket_mb)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"DistributedGradients: {name} must be > 0, got {value!r}")
        if strategy is None:
            import cluster  # the current strategy, as tf.distribute.get_strategy()

            strategy = cluster.get_strategy()
        self._strategy = strategy
        self._params = [p for p in module.parameters() if p.requires_grad]  # shared ones once
        if not self._params:
            raise ValueError("DistributedGradients: the module has no parameter that requires "
                             "grad")
        self._bucket_caps = (int(bucket_cap_mb * _MB), int(first_bucket_mb * _MB))
        self._build(group_of(strategy, "DistributedGradients"))
        self._next = 0  # the first bucket not started this step
        self._syncing = True
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                         for p in self._params]
        # Before accumulation too: a second backward must be refused before torch adds into a
        # p.grad that a collective may still be reducing in place.
        self._handles += [p.register_hook(functools.partial(self._before_grad, id(p)))
                          for p in self._params]

    def _build(self, group: Any) -> None:
        """Placement and buckets over ``group`` (at construction, and when an elastic regroup
        gave the strategy a new one: :meth:`_follow_group`)."""
        params = self._params
        self._group = group
        self._placement = _transfer.plan(_one_device(params), group)
        plan = bucket_plan([(p.dtype, p.numel() * p.element_size()) for p in params],
                           *self._bucket_caps)
        self._buckets: list[_Bucket] = []
        self._where: dict[int, tuple[int, int]] = {}  # id(param) -> (bucket, position)
        for b, indices in enumerate(plan):
            members = [params[i] for i in indices]
            self._buckets.append(self._bucket(members, self._placement.for_dtype(members[0].dtype)))
            for position, p in enumerate(members):
                self._where[id(p)] = (b, position)

    def _follow_group(self) -> None:
        """Between steps: an elastic regroup (``cluster.elastic``) swapped the strategy's
        collective group; rebuild over the new one, at the same point of the step on every
        rank (the step's first gradient, or ``synchronize``)."""
        group = self._strategy.extended.collective_group
        if group is not self._group and group is not None:
            self._build(group)

    # -- public ----------------------------------------------------------------------------------

    @property
    def placement(self) -> Placement:
        """The parameters' device and how their gradients travel (``placement.transfer``:
        ``HOST``, ``DEVICE`` (NCCL) or ``STAGED`` (pinned host buffers)), with the reason."""
        return self._placement

    @property
    def buckets(self) -> list[list[torch.nn.Parameter]]:
        """The parameters of each bucket, in the order the buckets are reduced."""
        return [list(b.params) for b in self._buckets]

    @property
    def started(self) -> int:
        """How many buckets of the current step have started their all-reduce (during backward,
        before :meth:`synchronize`: the overlap)."""
        return self._next

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally and start no collective."""
        previous, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = previous

    def synchronize(self, timeout: float | None = None) -> None:
        """Start the buckets not started yet, wait for all, write the means into ``p.grad``.

        Raises the collective's error (the group's typed errors), or
        :class:`~cluster.errors.CollectiveTimeoutError` after ``timeout`` seconds on a bucket.
        """
        if self._next == 0 and not any(b.filled for b in self._buckets):
            self._follow_group()  # no backward reached a bucket this step
        try:
            for bucket in self._buckets[self._next:]:
                for position, p in enumerate(bucket.params):
                    if position not in bucket.filled:
                        self._fill(bucket, position, p.grad)
            self._start_ready()
            for bucket in self._buckets:
                assert bucket.work is not None
                self._write_back(bucket, bucket.work.wait(timeout))
            if any(b.transfer is Transfer.STAGED for b in self._buckets):
                # The means are copied out of the pinned buffers asynchronously; the next
                # step's copies (or zeros) may overwrite them only once that is done.
                _transfer.finish_copies(self._placement.device)
        finally:
            self._reset()

    wait = synchronize

    def remove(self) -> None:
        """Take the hooks off the parameters (the object is unusable afterwards)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> DistributedGradients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- the hooks and the buckets ---------------------------------------------------------------

    def _bucket(self, members: list[torch.nn.Parameter], transfer: Transfer) -> _Bucket:
        """A bucket of ``members``: a slot in its flat buffer for each small gradient (every
        gradient when staged: all of them cross to the host), the large ones direct."""
        offsets, direct, total = [], [], 0
        for position, p in enumerate(members):
            if transfer is not Transfer.STAGED and p.numel() * p.element_size() >= DIRECT_BYTES:
                offsets.append(-1)
                direct.append(position)
            else:
                offsets.append(total)
                total += p.numel()
        size, dtype, device = total + len(members), members[0].dtype, self._placement.device
        flat = (_transfer.host_buffer(size, dtype, device) if transfer is Transfer.STAGED
                else torch.zeros(size, dtype=dtype, device=device))
        return _Bucket(members, offsets, flat, total, direct, transfer, [None] * len(direct))

    def _before_grad(self, key: int, grad: torch.Tensor) -> None:
        """A gradient about to be accumulated into ``p.grad`` (``key`` = ``id(p)``): refused
        while the last one is still in a bucket, so ``p.grad`` is left untouched."""
        if self._syncing:
            self._refuse_twice(key)

    def _refuse_twice(self, key: int) -> None:
        b, position = self._where[key]
        if position in self._buckets[b].filled:
            raise RuntimeError(
                "DistributedGradients: a second backward reached a parameter before "
                "synchronize(); call synchronize() after every backward, or accumulate "
                "gradients inside no_sync()")

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._syncing:
            return
        if self._next == 0 and not any(b.filled for b in self._buckets):
            self._follow_group()  # the step's first gradient
        self._refuse_twice(id(p))
        b, position = self._where[id(p)]
        bucket = self._buckets[b]
        self._fill(bucket, position, p.grad)
        if bucket.ready == len(bucket.params):
            self._start_ready()

    def _fill(self, bucket: _Bucket, position: int, grad: torch.Tensor | None) -> None:
        """Put ``grad`` (zeros when None) in the bucket; its flag says whether it existed.

        A direct parameter's gradient is not copied: the collective reads ``p.grad`` itself
        (torch does not write it again before the next backward, which :meth:`_on_grad` refuses
        before :meth:`synchronize`)."""
        p = bucket.params[position]
        start = bucket.offsets[position]
        with torch.no_grad():
            if start < 0:
                # Reduced in place (``in_place=True``): into p.grad itself when it is
                # contiguous, else into a contiguous copy that _write_back copies from.
                bucket.sent[bucket.direct.index(position)] = (
                    torch.zeros_like(p, memory_format=torch.contiguous_format)
                    if grad is None else grad.detach().contiguous())
            elif grad is None:
                bucket.flat[start:start + p.numel()].zero_()
            else:
                # Staged: a copy off the GPU into pinned memory, asynchronous on the current
                # stream; the bucket waits for it when it starts (_start_ready).
                bucket.flat[start:start + p.numel()].copy_(grad.reshape(-1), non_blocking=True)
                if bucket.transfer is Transfer.STAGED:
                    stream = _transfer.copy_stream(grad.device)
                    if stream is not None:
                        bucket.streams.add(stream)
            bucket.flat[bucket.flags_at + position] = 0 if grad is None else 1
        bucket.filled.add(position)
        bucket.ready += 1

    def _start_ready(self) -> None:
        """Start every complete bucket from ``_next`` on, in bucket order: one collective per
        bucket, of its flat buffer and its direct gradients."""
        while self._next < len(self._buckets):
            bucket = self._buckets[self._next]
            if bucket.ready < len(bucket.params):
                return
            values: list[Any] = [bucket.flat, *bucket.sent]
            if bucket.transfer is Transfer.STAGED:
                _transfer.wait_for(bucket.streams)  # the gradients' copies have landed
                values = [_transfer.host_view(bucket.flat)]
            # DEVICE: the group takes CUDA tensors as they are and returns new ones (NCCL
            # writes fresh buffers), so the means are copied into p.grad by _write_back.
            bucket.work = self._group.all_reduce_many_async(
                values, ReduceOp.MEAN, in_place=bucket.transfer is not Transfer.DEVICE)
            self._next += 1

    def _write_back(self, bucket: _Bucket, means: list[Any]) -> None:
        # HOST and STAGED buckets were reduced in place (in flat, and the direct gradients);
        # a DEVICE bucket's means are new tensors on the GPU.
        flat = means[0] if bucket.transfer is Transfer.DEVICE else bucket.flat
        direct = means[1:]
        with torch.no_grad():
            flags = flat[bucket.flags_at:].tolist()
            for position, p in enumerate(bucket.params):
                if not flags[position] > 0:
                    continue  # no rank had a gradient: leave p.grad as it is
                start = bucket.offsets[position]
                if start < 0:
                    value = direct[bucket.direct.index(position)]
                else:
                    value = flat[start:start + p.numel()].view(p.shape)
                if p.grad is None:
                    # A direct result is the zeros tensor _fill sent, reduced in place, or the
                    # collective's own new tensor: it becomes p.grad as is; a slot of flat is
                    # copied (else p.grad would keep the whole bucket's buffer alive), onto
                    # the GPU from a pinned buffer.
                    p.grad = value if start < 0 else value.to(p.device, copy=True,
                                                              non_blocking=True)
                elif start >= 0 or value.data_ptr() != p.grad.data_ptr():
                    # A slot of flat, a non-contiguous p.grad's copy, or a DEVICE mean.
                    p.grad.copy_(value, non_blocking=True)
                # else: the mean was written into p.grad itself, no copy

    def _reset(self) -> None:
        for bucket in self._buckets:
            bucket.ready = 0
            bucket.work = None
            bucket.filled.clear()
            bucket.streams.clear()
            bucket.sent = [None] * len(bucket.direct)
        self._next = 0


def _one_device(params: list[torch.nn.Parameter]) -> torch.device:
    """The one device of ``params``: the CPU or one CUDA GPU; ``ValueError`` otherwise."""
    devices = sorted({str(p.device) for p in params})
    if len(devices) != 1 or params[0].device.type not in ("cpu", "cuda"):
        raise ValueError(f"DistributedGradients: parameters must be on one device, the CPU or "
                         f"one CUDA GPU (got {', '.join(devices)}); move the model with "
                         "model.to(cluster.torch.device(strategy))")
    return params[0].device
