"""``CollectiveGroup``: the collectives of one group of ranks over a :class:`Transport`.

Public methods validate their arguments, then hand over to ``_*_impl`` methods that only compute
(TensorFlow's ``cross_device_ops`` split). Each public call is one collective with one sequence
number and one deadline; any failure inside it aborts the whole group, so no rank is left waiting.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from cluster import timeline
from cluster._family import Staged, is_cupy, stage, to_array
from cluster.collectives import _jobs, _packing, _stall, kernels
from cluster.collectives._buffers import BufferPool, working_copy
from cluster.collectives._call import Call, CallCounter
from cluster.collectives._jobs import Prepare, Prepared, identity, on_gpu, restore_each, then
from cluster.collectives.arena import ArenaLayout
from cluster.collectives.epilogue import Update, apply_whole, check_apply
from cluster.collectives.hierarchy import HostCollectives, leaders_all_reduce
from cluster.collectives.network import NetworkCollectives
from cluster.collectives.ops import ReduceOp, check_int, check_plain_dtype, check_reducible
from cluster.collectives.options import (
    CollectivePath,
    CollectiveSettings,
    CommunicationImplementation,
    CommunicationOptions,
)
from cluster.collectives.route import Route, choose_route, hier_config, shm_config
from cluster.collectives.schedule import segments
from cluster.collectives.shared_memory import SharedMemoryCollectives
from cluster.collectives.topology import Topology, discover
from cluster.collectives.work import CollectiveStream, Work
from cluster.deadline import Deadline
from cluster.transport.api import Transport
from cluster.transport.subset import SubsetTransport

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_SHM_ROUND_BYTES",
    "DEFAULT_SHM_WHOLE_BYTES",
    "DEFAULT_SMALL_MESSAGE_BYTES",
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

SETUP_SEQ = 2**63 - 1
"""The sequence number of the group's set-up collective (outside the numbering of calls)."""

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
    - Path and algorithm: :mod:`~cluster.collectives.route`. Co-located ranks use shared
      memory (:mod:`~cluster.collectives.shared_memory`); across hosts all-reduces are
      hierarchical (:mod:`~cluster.collectives.hierarchy`), the rest use the network
      (:mod:`~cluster.collectives.network`: recursive doubling or the ring).
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
        _shared_memory: bool = True,
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
        self._small = small_message_bytes
        self._chunk = chunk_bytes
        self._settings = settings
        self._calls = CallCounter(transport, name)
        self._stream = CollectiveStream(name)
        self._buffers = BufferPool()
        self._network = NetworkCollectives(
            transport, name, settings=settings, small_message_bytes=small_message_bytes,
            chunk_bytes=chunk_bytes, buffers=self._buffers,
        )
        self._host_id = host_id
        self._round_bytes = shm_round_bytes
        self._whole_bytes = shm_whole_bytes
        self._single_copy = shm_single_copy
        self._shared_memory = _shared_memory and settings.path is CollectivePath.AUTO
        self._set_up = not _shared_memory  # an internal group (the leaders): network only
        # Set by the set-up (the group's first collective):
        self._topology: Topology | None = None
        self._shm: SharedMemoryCollectives | None = None
        self._leaders: CollectiveGroup | None = None
        self._hosts: HostCollectives | None = None
        self._routes: collections.Counter[str] = collections.Counter()

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
        return self._topology

    @property
    def route_counts(self) -> dict[str, int]:
        """How many calls of each kind took each route so far, e.g. ``{"all_reduce/hier": 12,
        "broadcast/network": 1}`` (``hier``: shared memory inside each host, the network across
        the hosts' leaders): what proves which path a run really took."""
        return dict(self._routes)

    # -- public collectives: validate, then _impl ------------------------------------------------

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
            return (lambda call: self._all_reduce_apply_impl(call, arrays, flat, parsed, update),
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
            staged = stage(value, "all_gather")
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
            return (lambda call: self._all_gather_impl(call, array, int(axis) % array.ndim),
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
            staged = stage(value, "broadcast")
            check_plain_dtype(staged.array.dtype, "broadcast")
            return (lambda call: self._broadcast_impl(call, staged.array, int(root)),
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
            staged = stage(value, "reduce_scatter")
            check_reducible(staged.array.dtype, "reduce_scatter")
            if staged.array.ndim == 0:
                raise ValueError("reduce_scatter needs a value of rank >= 1 to split along axis 0")
            return (lambda call: self._reduce_scatter_impl(call, staged.array, parsed),
                    staged.restore)

        return self._stream.run(self._job("reduce_scatter", options, prepare, value))

    def barrier(self, *, options: CommunicationOptions | None = None) -> None:
        """Return once every rank has entered this barrier."""
        self._stream.run(self._job("barrier", options, lambda: (self._barrier_impl, identity)))

    def close(self) -> None:
        """End the group's stream thread once its queued collectives finished (each bounded by
        its deadline). The group stays usable; a later asynchronous call starts a new thread."""
        self._stream.close()

    # -- jobs: validate on the caller's thread, run in the stream ----------------------------

    def _all_reduce_job(
        self, value: Any, op: ReduceOp | str, options: CommunicationOptions | None
    ) -> Callable[[], Any]:
        def prepare() -> Prepared:
            parsed = ReduceOp.parse(op)
            if is_cupy(value):
                check_reducible(value.dtype, "all_reduce")
                return (lambda call: self._cupy_all_reduce(call, value, parsed)), identity
            staged = stage(value, "all_reduce")
            check_reducible(staged.array.dtype, "all_reduce")
            return (lambda call: self._all_reduce_impl(call, staged.array, staged.owned, parsed),
                    staged.restore)

        return self._job("all_reduce", options, prepare, value)

    def _cupy_all_reduce(self, call: Call, value: Any, op: ReduceOp) -> Any:
        route = self._route(call, "all_reduce")
        if self._shm is not None and route is not Route.NETWORK:  # NCCL inside the host
            return self._host_path().device_all_reduce(call, route, value, op)
        staged = stage(value, "all_reduce")
        return staged.restore(self._all_reduce_impl(call, staged.array, staged.owned, op))

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
            return (lambda call: self._all_reduce_many_run(call, items, parsed)), restore

        return self._job("all_reduce_many", options, prepare, values)

    def _all_reduce_many_run(self, call: Call, items: list[Staged], op: ReduceOp) -> list[Any]:
        route = self._route(call, "all_reduce") if self.world_size > 1 else Route.NETWORK
        # CuPy values stay on their GPU where NCCL may carry them (the device route).
        on_device = route is not Route.NETWORK and self._shm is not None
        arrays, owned, restores = [], [], []
        for item in items:
            if is_cupy(item.array) and not on_device:
                host = stage(item.array, "all_reduce_many")
                item = Staged(host.array, True, then(host.restore, item.restore))
            arrays.append(item.array)
            owned.append(item.owned)
            restores.append(item.restore)
        return list(zip(restores, self._all_reduce_many_impl(call, route, arrays, owned, op),
                        strict=True))

    def _job(self, kind: str, options: CommunicationOptions | None, prepare: Prepare,
             value: Any = None) -> Callable[[], Any]:
        """Validate now, run later: see :func:`~cluster.collectives._jobs.job`. ``value`` names
        the call's shape on the timeline."""
        return _jobs.job(kind, options, prepare,
                         collective=functools.partial(self._collective, value=value),
                         reject=self._reject)

    def _reject(self, kind: str, options: Any, error: Exception) -> Any:
        """Raise ``error``, keeping the group: see :func:`~cluster.collectives._jobs.reject`."""
        _jobs.reject(kind, options, error, world_size=self.world_size,
                     collective=self._collective, barrier=self._barrier_impl)

    def _submit(self, kind: str, job: Callable[[], Any]) -> Work:
        me = self._transport.peers[self.rank]
        return self._stream.submit(job, f"{kind} of group {self._name!r} on {me}")

    # -- implementations: route, then the network or the host path -----------------------------

    def _all_reduce_impl(
        self, call: Call, array: np.ndarray, owned: bool, op: ReduceOp
    ) -> np.ndarray:
        if self.world_size == 1:
            return working_copy(array, owned).reshape(array.shape)
        route = self._route(call, "all_reduce")
        if route is Route.NETWORK:
            work = self._network.all_reduce(call, array, owned, op)
        else:
            work = self._host_path().all_reduce(call, route, array, owned, op)
        return work.reshape(array.shape)

    def _all_reduce_many_impl(
        self, call: Call, route: Route, arrays: list[Any], owned: list[bool], op: ReduceOp
    ) -> list[Any]:
        host = [i for i, a in enumerate(arrays) if not is_cupy(a)]
        packs = _packing.plan_packs(
            [(arrays[i].dtype, arrays[i].nbytes) for i in host], call.options.bytes_per_pack
        )
        plan = [[host[j] for j in pack] for pack in packs]  # indices into ``arrays``
        if route is not Route.NETWORK:
            return self._host_path().all_reduce_many(call, route, arrays, owned, plan, op)
        return self._network.all_reduce_many(call, arrays, owned, plan, op)

    def _all_reduce_apply_impl(self, call: Call, arrays: list[np.ndarray],
                               targets: list[np.ndarray], op: ReduceOp, update: Update) -> None:
        if self.world_size == 1:
            for array, target in zip(arrays, targets, strict=True):  # op of one value: itself
                apply_whole(update, target, np.array(array, order="C"))  # scratch: a copy
            return
        packs = _packing.plan_packs([(a.dtype, a.nbytes) for a in arrays],
                                    call.options.bytes_per_pack)
        route = self._route(call, "all_reduce")
        if route is Route.NETWORK:
            self._network.all_reduce_apply(call, arrays, targets, packs, op, update)
        else:
            self._host_path().all_reduce_apply(call, route, arrays, targets, packs, op, update)

    def _all_gather_impl(self, call: Call, array: np.ndarray, axis: int) -> np.ndarray:
        if self.world_size == 1:
            return np.array(array, order="C", copy=True)
        if self._route(call, "all_gather") is Route.LOCAL:
            return self._host_path().all_gather(call, array, axis)
        return self._network.all_gather(call, array, axis)

    def _broadcast_impl(self, call: Call, array: np.ndarray, root: int) -> np.ndarray:
        if self.world_size == 1 or self.rank == root:
            work = np.array(array, order="C", copy=True).reshape(-1)
        else:
            work = np.empty(array.size, dtype=array.dtype)
        if self.world_size > 1:
            if self._route(call, "broadcast") is Route.LOCAL:
                self._host_path().broadcast(call, array, work, root)
            else:
                self._network.broadcast(call, array, work, root)
        return work.reshape(array.shape)

    def _reduce_scatter_impl(self, call: Call, array: np.ndarray, op: ReduceOp) -> np.ndarray:
        rest = array.shape[1:]
        row_elems = math.prod(rest)
        rows = segments(array.shape[0], self.world_size)
        bounds = [(a * row_elems, b * row_elems) for a, b in rows]
        if self.world_size == 1:
            work = working_copy(array, owned=False)
        elif self._route(call, "reduce_scatter") is Route.LOCAL:
            work = self._host_path().reduce_scatter(call, array, bounds, op)
        else:
            work = self._network.reduce_scatter(call, array, bounds, op)
        lo, hi = bounds[self.rank]
        a, b = rows[self.rank]
        return work[lo:hi].reshape((b - a, *rest)).copy()

    def _barrier_impl(self, call: Call, signature: str | None = None) -> None:
        if self.world_size == 1:
            return
        if self._route(call, "barrier") is Route.LOCAL:
            self._host_path().barrier(call, signature or "barrier shm")
        else:
            self._network.barrier(call, signature or "barrier")

    # -- set-up, routes and the leaders ----------------------------------------------------------

    def _set_up_hosts(self, deadline: Deadline) -> None:
        """Find the group's hosts and map their arenas: an exchange of its own (sequence number
        :data:`SETUP_SEQ`) inside every rank's first collective, so at the same point
        everywhere. Ranks configured differently (path, implementation) fail it with a mismatch.
        """
        self._set_up = True
        if self.world_size == 1:
            return
        wanted = (self._shared_memory
                  and self._options.implementation is not CommunicationImplementation.RING)
        topology, arena = discover(
            self._transport, group=self._name, seq=SETUP_SEQ, deadline=deadline,
            layout_for=lambda n: ArenaLayout(n, self._round_bytes), host_id=self._host_id,
            shared_memory=wanted,
        )
        self._topology = topology
        if arena is not None:
            self._shm = SharedMemoryCollectives(arena, whole_bytes=self._whole_bytes,
                                                single_copy=self._single_copy)
            self._network.arena = arena
            self._calls.on_abort.append(arena.abort)
        if not topology.single_host and topology.shares_memory and self.rank in topology.leaders:
            self._leaders = CollectiveGroup(
                SubsetTransport(self._transport, topology.leaders), f"{self._name}/hosts",
                self._options, small_message_bytes=self._small, chunk_bytes=self._chunk,
                settings=self._settings, _shared_memory=False,
            )
        configs = {
            Route.LOCAL: shm_config(self._round_bytes, self._whole_bytes),
            Route.HIER: hier_config(topology, self._round_bytes, self._whole_bytes,
                                    self._network.algorithm_config(self._options)),
        }
        self._hosts = HostCollectives(
            self._shm, self._network, configs=configs, world_size=self.world_size,
            across_leaders=None if self._leaders is None else functools.partial(
                leaders_all_reduce, self._leaders, self.world_size),
            buffers=self._buffers,
        )

    def _route(self, call: Call, kind: str) -> Route:
        """This call's route (:func:`~cluster.collectives.route.choose_route`): a function of
        the group's set-up and the call's options only."""
        route = choose_route(self._topology, self._settings, call.options, kind)
        self._routes[f"{kind}/{route.value}"] += 1
        return route

    def _host_path(self) -> HostCollectives:
        """The ``LOCAL``/``HIER`` collectives; only those routes call it, and they are only
        chosen once the hosts are set up."""
        assert self._hosts is not None
        return self._hosts

    @contextlib.contextmanager
    def _collective(self, kind: str, options: CommunicationOptions | None,
                    value: Any = None) -> Iterator[Call]:
        """Number the call and start its deadline; any error inside aborts the group. The
        group's first call sets up its hosts first (failures there are that call's). The call
        is a span of the timeline (:mod:`cluster.timeline`: ``value`` names its shape), watched
        for stalls (:mod:`~cluster.collectives._stall`)."""
        with self._calls.call(kind, self._options if options is None else options) as call, \
                timeline.collective(call, self._name, value), \
                _stall.watch(call, self._name, self._transport, value):
            if not self._set_up:
                self._set_up_hosts(call.deadline)
            yield call

