"""``CollectiveGroup``: the collectives of one group of ranks over a :class:`Transport`.

Public methods validate and stage their arguments on the caller's thread, then hand over to the
group's :class:`~cluster.collectives._engine.GroupEngine`, which only computes (TensorFlow's
``cross_device_ops`` split: ``reduce()`` validates, ``reduce_implementation()`` works). Each
public call is one collective with one sequence number and one deadline; any failure inside it
aborts the whole group, so no rank is left waiting.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cluster._family import Staged, is_cupy, stage, to_array
from cluster.collectives import _jobs, kernels
from cluster.collectives._engine import SETUP_SEQ, GroupEngine
from cluster.collectives._jobs import Prepare, Prepared, identity, on_gpu, restore_each
from cluster.collectives.epilogue import Update, check_apply
from cluster.collectives.ops import ReduceOp, check_int, check_plain_dtype, check_reducible
from cluster.collectives.options import CollectiveSettings, CommunicationOptions
from cluster.collectives.topology import Topology
from cluster.collectives.work import CollectiveStream, Work
from cluster.transport.api import Transport

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_SHM_ROUND_BYTES",
    "DEFAULT_SHM_WHOLE_BYTES",
    "DEFAULT_SMALL_MESSAGE_BYTES",
    "SETUP_SEQ",
    "CollectiveGroup",
]

DEFAULT_SMALL_MESSAGE_BYTES = 64 * 1024
"""All-reduces below this many bytes use recursive doubling (latency), larger ones the ring."""

DEFAULT_CHUNK_BYTES = 4 << 20
"""Pipelining granularity of the ring and chain algorithms (4 MiB: fastest at 16-64 MiB here)."""

DEFAULT_SHM_ROUND_BYTES = 2 << 20
"""Bytes each co-located rank stages per round in shared memory (two buffers of it per rank).

A round's part per rank (this over the local ranks) is what a rank reduces, updates and stages
while it is hot: at 1 MiB per part or less it stays in a core's L2 here. Measured with ResNet-50's
gradients through ``all_reduce_apply`` (fused SGD), 2 MiB rounds against 4 MiB: 28.5 against
32.6-33.4 ms at N=2, 83 against 86 ms at N=4; 64 MiB ``all_reduce`` no slower."""

DEFAULT_SHM_WHOLE_BYTES: int | None = None
"""Shared-memory all-reduces up to this size let every rank reduce everything (one wait);
``None``: chosen by the number of co-located ranks and cores (``local.auto_whole_bytes``)."""


class CollectiveGroup:
    """Collectives among the ``transport.world_size`` ranks of one group.

    >>> from cluster.transport.inproc import InProcessHub
    >>> group = CollectiveGroup(InProcessHub(1).transports[0])  # one per rank, same name
    >>> group.all_reduce(np.ones(2, np.float32), ReduceOp.SUM)
    array([1., 1.], dtype=float32)

    Contract:

    - Every rank makes the same calls in the same order; the n-th call issued is collective
      ``#n`` of the group on every rank. Calls run one at a time in issue order in the group's
      stream (:mod:`~cluster.collectives.work`), synchronous ones included, so any thread may
      issue (``*_async`` return a :class:`~cluster.collectives.work.Work`). Ranks that
      disagree on the kind, op, dtype, shape, root or options get
      :class:`~cluster.errors.CollectiveMismatchError` (the rank that noticed) or
      :class:`~cluster.errors.CollectiveAbortedError` (the others).
    - Every rank gets bitwise-identical results, in the input's array family, dtype and shape.
      Inputs are never modified.
    - Each call has the deadline ``options.timeout_seconds``
      (:class:`~cluster.errors.CollectiveTimeoutError`). A dead peer raises
      :class:`~cluster.errors.PeerUnavailableError` naming it. Any error inside a collective
      aborts the group on every rank; the transport then stays failed and later calls raise at
      once. Input is validated before the collective starts (:mod:`~cluster.collectives._jobs`):
      an input every rank rejects raises ``TypeError``/``ValueError`` there and keeps the group.
    - Path (:func:`~cluster.collectives.route.choose_route`). Ranks that share a host
      (:mod:`~cluster.collectives.topology`, set up by the group's first collective) talk
      through shared memory (:mod:`~cluster.collectives.shared_memory`). A group on one host
      runs every collective there; across hosts, all-reduces are hierarchical (reduce inside
      each host, the network ring across one leader per host, broadcast inside:
      :mod:`~cluster.collectives.hierarchy`) and the other collectives use the network
      (:mod:`~cluster.collectives.network`). ``implementation=RING`` (group or call options),
      ``settings.path=NETWORK`` or a forced ``settings.algorithm`` (``CLUSTER_COLLECTIVE_PATH``
      / ``CLUSTER_COLLECTIVE_ALGORITHM`` through :class:`cluster.settings.TaskSettings`) put
      everything on the network.
    - Network algorithm (:func:`~cluster.collectives.route.network_algorithm`): recursive
      doubling below ``small_message_bytes``, the pipelined ring above it;
      ``implementation=RING`` always uses the ring, and ``settings.algorithm``
      (``RING``/``DOUBLING``) overrides both.
    - ``host_id`` splits one machine into several logical hosts (tests of multi-host layouts);
      ``shm_round_bytes`` / ``shm_whole_bytes`` tune the shared-memory algorithms;
      ``shm_single_copy`` (``None``: where local ranks outnumber cores) lets large all-reduces
      read co-located ranks' arrays in place where the kernel allows it (see
      :mod:`~cluster.collectives.shared_memory`).
    """

    def __init__(
        self,
        transport: Transport,
        name: str = "default",
        options: CommunicationOptions | None = None,
        *,
        small_message_bytes: int = DEFAULT_SMALL_MESSAGE_BYTES,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        host_id: str = "",
        shm_round_bytes: int = DEFAULT_SHM_ROUND_BYTES,
        shm_whole_bytes: int | None = DEFAULT_SHM_WHOLE_BYTES,
        shm_single_copy: bool | None = None,
        settings: CollectiveSettings | None = None,
    ) -> None:
        if not isinstance(transport, Transport):
            raise TypeError(f"transport must be a cluster.transport.Transport, got {transport!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"group name must be a non-empty string, got {name!r}")
        options = CommunicationOptions() if options is None else options
        settings = CollectiveSettings() if settings is None else settings
        if not isinstance(settings, CollectiveSettings):
            raise TypeError(f"settings must be a CollectiveSettings, got {settings!r}")
        if not isinstance(options, CommunicationOptions):
            raise TypeError(f"options must be a CommunicationOptions, got {options!r}")
        check_int("small_message_bytes", small_message_bytes, minimum=0)
        check_int("chunk_bytes", chunk_bytes, minimum=1)
        check_int("shm_round_bytes", shm_round_bytes, minimum=64)
        if shm_whole_bytes is not None:
            check_int("shm_whole_bytes", shm_whole_bytes, minimum=0)
        if shm_round_bytes % 64:
            raise ValueError(f"shm_round_bytes must be a multiple of 64, got {shm_round_bytes}")
        self._transport = transport
        self._name = name
        self._options = options
        self._stream = CollectiveStream(name)
        self._engine = GroupEngine(
            transport, name, options, settings=settings, small_message_bytes=small_message_bytes,
            chunk_bytes=chunk_bytes, host_id=host_id, shm_round_bytes=shm_round_bytes,
            shm_whole_bytes=shm_whole_bytes, shm_single_copy=shm_single_copy,
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def rank(self) -> int:
        return self._transport.rank

    @property
    def world_size(self) -> int:
        return self._transport.world_size

    @property
    def options(self) -> CommunicationOptions:
        return self._options

    @property
    def topology(self) -> Topology | None:
        """The group's hosts, once its first collective has set them up (``None`` when the
        group never uses shared memory)."""
        return self._engine.topology

    @property
    def route_counts(self) -> dict[str, int]:
        """How many calls of each kind took each route so far, e.g. ``{"all_reduce/hier": 12,
        "broadcast/network": 1, "hosts/all_reduce/network": 12}`` (``hier``: shared memory
        inside each host, the network across hosts; ``hosts/...``: the all-reduces this rank
        carried across hosts for them, on every rank where every host has the same number of
        ranks, else on the hosts' leaders): what proves which path a run really took."""
        return self._engine.route_counts

    @property
    def single_copy(self) -> bool | None:
        """Whether large shared-memory all-reduces read co-located ranks' arrays in place
        (``shm_single_copy``, as the set-up resolved it); ``None`` while the group has no
        shared memory (before its first collective, or off that path)."""
        shm = self._engine.shm
        return None if shm is None else shm.single_copy

    # -- public collectives: validate, then the engine ----------------------------------------

    def all_reduce(
        self,
        value: Any,
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """``op`` of ``value`` over all ranks (any shape; float16/32/64, int32/64, bfloat16).

        ``MEAN`` of integers truncates toward zero, as TensorFlow's collectives do.
        """
        return self._stream.run(self._all_reduce_job(value, op, options))

    def all_reduce_async(
        self,
        value: Any,
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        options: CommunicationOptions | None = None,
    ) -> Work:
        """:meth:`all_reduce`, started in the group's stream; ``wait()`` on the :class:`Work`
        returns its result. Do not modify ``value`` until the work is done.

        >>> from cluster.transport.inproc import InProcessHub
        >>> group = CollectiveGroup(InProcessHub(1).transports[0])
        >>> work = group.all_reduce_async(np.ones(2, np.float32))
        >>> work.wait()
        array([1., 1.], dtype=float32)
        """
        return self._submit("all_reduce", self._all_reduce_job(value, op, options))

    def all_reduce_many(
        self,
        values: Sequence[Any],
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        options: CommunicationOptions | None = None,
        in_place: bool = False,
    ) -> list[Any]:
        """``all_reduce`` of each value, fused into packs of ``options.bytes_per_pack`` bytes.

        One collective. Every rank gets identical bytes, though a result may differ in the last
        bits from an ``all_reduce`` of that value alone (its pack may use another algorithm).
        Values may mix families (:mod:`cluster._family`); each result is in its value's. NumPy
        results of fused values are views of one shared buffer (disjoint ones); a value that
        travels alone is reduced without packing, into a fresh buffer. CuPy values take the
        device route where ``all_reduce`` would (NCCL among the host's GPUs), else the host path.
        Results are the caller's: no later call writes them. ``in_place``: each result is
        written into its value (writeable C-contiguous host arrays; a lone one is reduced in
        it, no copy), and the values are returned.
        """
        return self._stream.run(self._all_reduce_many_job(values, op, options, in_place))

    def all_reduce_many_async(
        self,
        values: Sequence[Any],
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        options: CommunicationOptions | None = None,
        in_place: bool = False,
    ) -> Work:
        """:meth:`all_reduce_many`, started in the group's stream; ``wait()`` returns the list of
        results. Do not modify the values until the work is done."""
        return self._submit("all_reduce_many",
                            self._all_reduce_many_job(values, op, options, in_place))

    def all_reduce_apply(
        self,
        values: Sequence[Any],
        targets: Sequence[np.ndarray],
        update: Update,
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        options: CommunicationOptions | None = None,
    ) -> None:
        """``update(targets[i], all_reduce(values[i]))`` for every ``i``, in one collective.

        ``update`` is elementwise and each target a writeable C-contiguous NumPy array of its
        value's shape and dtype, the same bytes on every rank (a mirrored parameter): see
        :mod:`~cluster.collectives.epilogue`. Every rank ends with the bytes the unfused update
        gives; lone values are updated once in the group. Values are never written.
        """
        def prepare() -> Prepared:
            parsed = ReduceOp.parse(op)
            arrays, flat = check_apply(values, targets, update)
            if self.world_size > 1:  # loading compiled loops is not the collective's time
                kernels.load_for(update, sum(a.size for a in arrays))
            return (lambda call: self._engine.all_reduce_apply(call, arrays, flat, parsed, update),
                    identity)

        self._stream.run(self._job("all_reduce_apply", options, prepare, values))

    def all_gather(
        self, value: Any, axis: int = 0, *, options: CommunicationOptions | None = None
    ) -> Any:
        """Concatenation of every rank's ``value`` along ``axis``, in rank order.

        As in tf.distribute, ``value`` must have rank >= 1 and the same shape on every rank
        except along ``axis``, where sizes may differ. Any dtype without Python objects.
        """
        def prepare() -> Prepared:
            staged = stage(value, "all_gather", self._engine.staging)
            array = staged.array
            check_plain_dtype(array.dtype, "all_gather")
            if array.ndim == 0:
                raise ValueError(
                    "all_gather needs a value of rank >= 1 (as tf.distribute does); gather "
                    "scalars as np.reshape(value, [1])"
                )
            if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
                raise TypeError(f"all_gather axis must be an int, got {axis!r}")
            if not -array.ndim <= axis < array.ndim:
                raise ValueError(
                    f"all_gather axis {axis} is out of range for a value of rank {array.ndim}"
                )
            return (lambda call: self._engine.all_gather(call, array, int(axis) % array.ndim),
                    staged.restore)

        return self._stream.run(self._job("all_gather", options, prepare, value))

    def broadcast(
        self, value: Any, root: int = 0, *, options: CommunicationOptions | None = None
    ) -> Any:
        """``root``'s ``value`` on every rank; other ranks' ``value`` gives only shape and dtype.

        The root can return before slower ranks have received everything.
        """
        def prepare() -> Prepared:
            if isinstance(root, bool) or not isinstance(root, int | np.integer):
                raise TypeError(f"broadcast root must be an int rank, got {root!r}")
            if not 0 <= root < self.world_size:
                raise ValueError(
                    f"broadcast root {root} is not a rank of this group (0..{self.world_size - 1})"
                )
            staged = stage(value, "broadcast", self._engine.staging)
            check_plain_dtype(staged.array.dtype, "broadcast")
            return (lambda call: self._engine.broadcast(call, staged.array, int(root)),
                    staged.restore)

        return self._stream.run(self._job("broadcast", options, prepare, value))

    def reduce_scatter(
        self,
        value: Any,
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """This rank's segment, along axis 0, of ``op`` of ``value`` over all ranks.

        Axis 0 splits like ``np.array_split(result, world_size)``: the first ``n % world_size``
        segments have one row more, trailing ones may be empty.
        """
        def prepare() -> Prepared:
            parsed = ReduceOp.parse(op)
            staged = stage(value, "reduce_scatter", self._engine.staging)
            check_reducible(staged.array.dtype, "reduce_scatter")
            if staged.array.ndim == 0:
                raise ValueError("reduce_scatter needs a value of rank >= 1 to split along axis 0")
            return (lambda call: self._engine.reduce_scatter(call, staged.array, parsed),
                    staged.restore)

        return self._stream.run(self._job("reduce_scatter", options, prepare, value))

    def barrier(self, *, options: CommunicationOptions | None = None) -> None:
        """Return once every rank has entered this barrier."""
        self._stream.run(self._job("barrier", options, lambda: (self._engine.barrier, identity)))

    def close(self) -> None:
        """End the group's stream thread once its queued collectives finished (each bounded by
        its deadline) and drop its pinned staging buffers (:mod:`cluster._staging`). The group
        stays usable; a later asynchronous call starts a new thread."""
        self._stream.close()
        self._engine.staging.close()

    # -- jobs: validate on the caller's thread, run in the stream ----------------------------

    def _all_reduce_job(
        self, value: Any, op: ReduceOp | str, options: CommunicationOptions | None
    ) -> Callable[[], Any]:
        def prepare() -> Prepared:
            parsed = ReduceOp.parse(op)
            if is_cupy(value):
                check_reducible(value.dtype, "all_reduce")
                return (lambda call: self._engine.cupy_all_reduce(call, value, parsed)), identity
            staged = stage(value, "all_reduce", self._engine.staging)
            check_reducible(staged.array.dtype, "all_reduce")
            return (lambda call: self._engine.all_reduce(call, staged.array, staged.owned, parsed),
                    staged.restore)

        return self._job("all_reduce", options, prepare, value)

    def _all_reduce_many_job(self, values: Sequence[Any], op: ReduceOp | str,
                             options: CommunicationOptions | None,
                             in_place: bool = False) -> Callable[[], Any]:
        def prepare() -> Prepared:
            parsed = ReduceOp.parse(op)
            if isinstance(values, str | bytes) or not isinstance(values, Sequence):
                raise TypeError(f"all_reduce_many takes a list of values, got {values!r:.80}")
            items = []
            for value in values:
                if is_cupy(value) or on_gpu(value):
                    array, restore = to_array(value, "all_reduce_many")  # staged when it runs
                    items.append(Staged(array, False, restore))
                else:
                    items.append(stage(value, "all_reduce_many"))
                check_reducible(items[-1].array.dtype, "all_reduce_many")
            restore = restore_each
            if in_place:
                items, restore = _jobs.in_place(items, values, "all_reduce_many")
            return (lambda call: self._engine.all_reduce_many(call, items, parsed)), restore

        return self._job("all_reduce_many", options, prepare, values)

    def _job(self, kind: str, options: CommunicationOptions | None, prepare: Prepare,
             value: Any = None) -> Callable[[], Any]:
        """Validate now, run later: see :func:`~cluster.collectives._jobs.job`. ``value`` names
        the call's shape on the timeline."""
        return _jobs.job(kind, options, prepare,
                         collective=functools.partial(self._engine.collective, value=value),
                         reject=self._reject)

    def _reject(self, kind: str, options: Any, error: Exception) -> Any:
        """Raise ``error``, keeping the group: see :func:`~cluster.collectives._jobs.reject`."""
        _jobs.reject(kind, options, error, world_size=self.world_size,
                     collective=self._engine.collective, barrier=self._engine.barrier)

    def _submit(self, kind: str, job: Callable[[], Any]) -> Work:
        me = self._transport.peers[self.rank]
        return self._stream.submit(job, f"{kind} of group {self._name!r} on {me}")
