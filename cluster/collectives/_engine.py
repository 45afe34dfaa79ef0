"""``GroupEngine``: one rank's collectives of a group once their arguments are valid.

:class:`~cluster.collectives.group.CollectiveGroup` validates and stages a call's input
(TensorFlow's ``reduce()``); the engine does the work (``reduce_implementation()``):

- :meth:`GroupEngine.collective` numbers a call, starts its one deadline and makes it a span of
  the timeline watched for stalls; any error inside aborts the group on every rank. The group's
  first collective sets up its hosts first (:meth:`GroupEngine.set_up_hosts`), so at the same
  point on every rank.
- Each collective method takes that :class:`~cluster.collectives._call.Call`, chooses the route
  (:func:`~cluster.collectives.route.choose_route`: a function of the set-up and the call's
  options only) and hands over to the network
  (:class:`~cluster.collectives.network.NetworkCollectives`) or to the host path
  (:class:`~cluster.collectives.hierarchy.HostCollectives`: shared memory inside a host, the
  hierarchical all-reduce across hosts).
- Path and algorithm: as :class:`~cluster.collectives.group.CollectiveGroup` states them.
- The ranks that carry a ``HIER`` all-reduce across hosts form an engine of their own (network
  only): on a striped topology (every host the same number of ranks,
  :attr:`~cluster.collectives.topology.Topology.striped`) each column of ranks, one per host at
  one local index (``<group>/hosts`` for the leaders, ``<group>/hosts/J`` for the others), else
  the leaders alone (``<group>/hosts``).

Arrays handed in are NumPy (CuPy only where a method says so); ``owned`` says the engine may
reduce into one in place. CuPy values that take a host path are copied through the group's
:class:`~cluster._staging.Staging` (pinned, reused buffers; :attr:`GroupEngine.staging`).
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from cluster import timeline
from cluster._family import Staged, is_cupy, stage
from cluster._staging import Staging
from cluster.collectives import _packing, _stall
from cluster.collectives._buffers import BufferPool, working_copy
from cluster.collectives._call import Call, CallCounter
from cluster.collectives.arena import ArenaLayout
from cluster.collectives.epilogue import Update, apply_whole
from cluster.collectives.hierarchy import HostCollectives
from cluster.collectives.network import NetworkCollectives
from cluster.collectives.ops import ReduceOp, finalize
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
from cluster.deadline import Deadline
from cluster.transport.api import Transport
from cluster.transport.subset import SubsetTransport

__all__ = ["SETUP_SEQ", "GroupEngine"]

SETUP_SEQ = 2**63 - 1
"""The sequence number of the group's set-up collective (outside the numbering of calls)."""


class GroupEngine:
    """The collectives of one rank of the group ``name`` over ``transport``, arguments valid.

    ``shared_memory=False`` keeps the engine on the network and skips the set-up (the leaders'
    engine of a group across hosts). The other arguments are the group's, already checked.
    """

    def __init__(self, transport: Transport, name: str, options: CommunicationOptions, *,
                 settings: CollectiveSettings, small_message_bytes: int, chunk_bytes: int,
                 host_id: str = "", shm_round_bytes: int, shm_whole_bytes: int | None,
                 shm_single_copy: bool | None = None, shared_memory: bool = True) -> None:
        self._transport = transport
        self._name = name
        self._options = options
        self._settings = settings
        self._small = small_message_bytes
        self._chunk = chunk_bytes
        self._host_id = host_id
        self._round_bytes = shm_round_bytes
        self._whole_bytes = shm_whole_bytes
        self._single_copy = shm_single_copy
        self._calls = CallCounter(transport, name)
        self._buffers = BufferPool()
        self._staging = Staging()
        self._network = NetworkCollectives(
            transport, name, settings=settings, small_message_bytes=small_message_bytes,
            chunk_bytes=chunk_bytes, buffers=self._buffers,
        )
        self._shared_memory = shared_memory and settings.path is CollectivePath.AUTO
        self._set_up = not shared_memory  # the leaders' engine: network only, nothing to set up
        # Set by the set-up (the group's first collective):
        self._topology: Topology | None = None
        self._shm: SharedMemoryCollectives | None = None
        self._across: GroupEngine | None = None  # this rank's ranks across hosts, if it has
        self._hosts: HostCollectives | None = None
        self._routes: collections.Counter[str] = collections.Counter()

    @property
    def rank(self) -> int:
        return self._transport.rank

    @property
    def world_size(self) -> int:
        return self._transport.world_size

    @property
    def topology(self) -> Topology | None:
        """The group's hosts once set up; ``None`` before, or when it never uses shared memory."""
        return self._topology

    @property
    def shm(self) -> SharedMemoryCollectives | None:
        """The shared-memory collectives among co-located ranks, once set up (else ``None``)."""
        return self._shm

    @property
    def network(self) -> NetworkCollectives:
        """The network collectives (the ring, recursive doubling) of the group's ranks."""
        return self._network

    @property
    def staging(self) -> Staging:
        """Where this rank's GPU values are staged in host memory for the host paths."""
        return self._staging

    @property
    def route_counts(self) -> dict[str, int]:
        """Calls per ``kind/route`` so far (see ``CollectiveGroup.route_counts``); those this
        rank's engine across hosts ran for it as ``hosts/kind/route``."""
        counts = dict(self._routes)
        if self._across is not None:
            counts.update((f"hosts/{k}", v) for k, v in self._across.route_counts.items())
        return counts

    # -- one call ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def collective(self, kind: str, options: CommunicationOptions | None,
                   value: Any = None) -> Iterator[Call]:
        """Number the call and start its deadline; any error inside aborts the group. The
        group's first call sets up its hosts first (failures there are that call's). The call
        is a span of the timeline (:mod:`cluster.timeline`: ``value`` names its shape), watched
        for stalls (:mod:`~cluster.collectives._stall`)."""
        with self._calls.call(kind, self._options if options is None else options) as call, \
                timeline.collective(call, self._name, value), \
                _stall.watch(call, self._name, self._transport, value):
            if not self._set_up:
                self.set_up_hosts(call.deadline)
            yield call

    # -- collectives: route, then the network or the host path ---------------------------------

    def all_reduce(self, call: Call, array: np.ndarray, owned: bool, op: ReduceOp) -> np.ndarray:
        if self.world_size == 1:
            return working_copy(array, owned).reshape(array.shape)
        route = self._route(call, "all_reduce")
        if route is Route.NETWORK:
            work = self._network.all_reduce(call, array, owned, op)
        else:
            work = self._host_path().all_reduce(call, route, array, owned, op)
        return work.reshape(array.shape)

    def cupy_all_reduce(self, call: Call, value: Any, op: ReduceOp) -> Any:
        """A CuPy all-reduce: NCCL inside the host where the route allows, else through host
        memory; the result is CuPy."""
        route = self._route(call, "all_reduce")
        if self._shm is not None and route is not Route.NETWORK:  # NCCL inside the host
            return self._host_path().device_all_reduce(call, route, value, op)
        staged = stage(value, "all_reduce", self._staging)
        return staged.restore(self.all_reduce(call, staged.array, staged.owned, op))

    def all_reduce_many(self, call: Call, items: list[Staged], op: ReduceOp) -> list[Any]:
        """``(restore, result)`` per item: CuPy items stay on their GPU where NCCL may carry
        them (the device route), else they are staged to the host here and their results copied
        back onto their GPUs (each direction's copies queued together, waited for once)."""
        route = self._route(call, "all_reduce") if self.world_size > 1 else Route.NETWORK
        on_device = route is not Route.NETWORK and self._shm is not None
        staged = [] if on_device else [i for i, item in enumerate(items) if is_cupy(item.array)]
        hosts = self._staging.to_host_many([items[i].array for i in staged])
        arrays = [item.array for item in items]
        owned = [item.owned for item in items]
        for i, host in zip(staged, hosts, strict=True):
            arrays[i], owned[i] = host, True
        results = self._all_reduce_packed(call, route, arrays, owned, op)
        devices = [items[i].array.device.id for i in staged]
        on_gpus = self._staging.to_device_many([results[i] for i in staged], devices)
        for i, result in zip(staged, on_gpus, strict=True):
            results[i] = result
        return list(zip([item.restore for item in items], results, strict=True))

    def _all_reduce_packed(self, call: Call, route: Route, arrays: list[Any], owned: list[bool],
                           op: ReduceOp) -> list[Any]:
        host = [i for i, a in enumerate(arrays) if not is_cupy(a)]
        packs = _packing.plan_packs(
            [(arrays[i].dtype, arrays[i].nbytes) for i in host], call.options.bytes_per_pack
        )
        plan = [[host[j] for j in pack] for pack in packs]  # indices into ``arrays``
        if route is not Route.NETWORK:
            return self._host_path().all_reduce_many(call, route, arrays, owned, plan, op)
        return self._network.all_reduce_many(call, arrays, owned, plan, op)

    def all_reduce_apply(self, call: Call, arrays: list[np.ndarray], targets: list[np.ndarray],
                         op: ReduceOp, update: Update) -> None:
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

    def all_gather(self, call: Call, array: np.ndarray, axis: int) -> np.ndarray:
        if self.world_size == 1:
            return np.array(array, order="C", copy=True)
        if self._route(call, "all_gather") is Route.LOCAL:
            return self._host_path().all_gather(call, array, axis)
        return self._network.all_gather(call, array, axis)

    def broadcast(self, call: Call, array: np.ndarray, root: int) -> np.ndarray:
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

    def reduce_scatter(self, call: Call, array: np.ndarray, op: ReduceOp) -> np.ndarray:
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

    def barrier(self, call: Call, signature: str | None = None) -> None:
        if self.world_size == 1:
            return
        if self._route(call, "barrier") is Route.LOCAL:
            self._host_path().barrier(call, signature or "barrier shm")
        else:
            self._network.barrier(call, signature or "barrier")

    # -- set-up, routes and the leaders ----------------------------------------------------------

    def set_up_hosts(self, deadline: Deadline) -> None:
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
        across = topology.column if topology.striped else topology.leaders
        if not topology.single_host and topology.shares_memory and self.rank in across:
            j = topology.local_rank if topology.striped else 0
            self._across = GroupEngine(
                SubsetTransport(self._transport, across),
                f"{self._name}/hosts" + (f"/{j}" if j else ""),
                self._options, settings=self._settings, small_message_bytes=self._small,
                chunk_bytes=self._chunk, shm_round_bytes=self._round_bytes,
                shm_whole_bytes=self._whole_bytes, shared_memory=False,
            )
        configs = {
            Route.LOCAL: shm_config(self._round_bytes, self._whole_bytes),
            Route.HIER: hier_config(topology, self._round_bytes, self._whole_bytes,
                                    self._network.algorithm_config(self._options)),
        }
        self._hosts = HostCollectives(
            self._shm, self._network, configs=configs, world_size=self.world_size,
            across_hosts=None if self._across is None else self._across_hosts,
            striped=topology.striped,
            buffers=self._buffers, staging=self._staging,
        )

    def _across_hosts(self, call: Call, work: np.ndarray, op: ReduceOp) -> None:
        """The ``HIER`` route's :data:`~cluster.collectives.hierarchy.AcrossHosts`: all-reduce
        flat ``work`` (a host total, or its stripe of one) in place across this rank's engine
        across hosts (the network ring, within what is left of the call's deadline), then
        apply MEAN's division over the whole group once."""
        assert self._across is not None
        timeout = call.deadline.timeout()
        options = CommunicationOptions(
            call.options.bytes_per_pack,
            None if timeout is None else max(timeout, 1e-3),
            call.options.implementation,
        )
        inner = ReduceOp.SUM if op is ReduceOp.MEAN else op
        with self._across.collective("all_reduce", options, work) as inner_call:
            self._across.all_reduce(inner_call, work, True, inner)
        finalize(op, work, self.world_size)

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
