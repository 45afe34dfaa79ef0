"""Collectives between the ranks of a group, over any :class:`~cluster.transport.api.Transport`.

Pipelined ring all-reduce (reduce-scatter + all-gather) for large messages, recursive doubling for
small ones, plus all-gather, broadcast, reduce-scatter and barrier, with ordering/mismatch checks,
deadlines and group-wide abort; co-located ranks use shared memory, and NCCL for CuPy values.
Nothing here imports grpc: the same code runs over the gRPC and the in-process transports.

Where things live:

- ``group``: :class:`CollectiveGroup`, the API (validate, then ``_impl``);
- ``route``: which path (shared memory, hierarchical, network) and which network algorithm a
  call takes, as pure functions;
- ``network``: the collectives over the transport (``ring``, ``doubling``, ``tree``,
  ``broadcast`` are their algorithms, ``schedule`` their pure schedules, ``cost`` their
  message-count model);
- ``hierarchy``: the shared-memory and hierarchical collectives; ``shared_memory`` their
  algorithms, over the ``arena`` in a ``shm_segment``, found by ``topology``;
- ``host_nccl`` (over ``nccl``): NCCL among a host's GPUs;
- ``ops``, ``options``: reduction operators and the frozen options;
- ``work``: :class:`Work`, the handle of an asynchronous call, and the group's stream that runs
  its calls one at a time in issue order; ``_jobs``: validation before any byte moves.

>>> from cluster.transport.inproc import InProcessHub
>>> hub = InProcessHub(1)
>>> CollectiveGroup(hub.transports[0]).all_reduce(3.0)  # a Python float is float32, as in TF
np.float32(3.0)
"""

from __future__ import annotations

from cluster.collectives.group import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_SMALL_MESSAGE_BYTES,
    CollectiveGroup,
)
from cluster.collectives.ops import SUPPORTED_DTYPES, ReduceOp
from cluster.collectives.options import CommunicationImplementation, CommunicationOptions
from cluster.collectives.work import Work

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_SMALL_MESSAGE_BYTES",
    "SUPPORTED_DTYPES",
    "CollectiveGroup",
    "CommunicationImplementation",
    "CommunicationOptions",
    "ReduceOp",
    "Work",
]
