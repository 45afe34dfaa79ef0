"""Distributed input: ``experimental_distribute_dataset`` and ``distribute_datasets_from_function``.

A *dataset* is any re-iterable Python iterable of batches. A batch is a nest (tuples, namedtuples,
lists and mappings, nested freely) whose leaves are arrays with a leading batch axis: NumPy, CuPy,
or anything with ``.shape`` and basic slicing. Python scalars, strings, ``None`` and 0-d arrays are
not batchable. Each ``iter()`` of a distributed dataset starts a new epoch, as with ``tf.data``.

``DistributedDataset`` (what ``strategy.experimental_distribute_dataset(dataset)`` returns)
    Every worker iterates the *whole* dataset: this is TensorFlow's ``AutoShardPolicy.DATA``,
    the policy TF falls back to for any input that is not a file reader. Each element is one
    *global* batch; it is split into ``num_replicas_in_sync`` pieces by TF's rule
    (``replica_slices``) and the worker keeps the pieces of its own replicas: worker ``w`` with
    ``k`` local replicas owns global replicas ``w*k .. w*k+k-1`` and replica ``r`` receives piece
    ``r``. So N replicas over W workers see exactly the global batches one process sees, and
    every worker runs out on the same step.
    The dataset must therefore produce the same batches in the same order on every worker: seed any
    shuffling identically everywhere.

``DistributedDatasetsFromFunction`` (what ``strategy.distribute_datasets_from_function(fn)``
returns)
    ``fn(InputContext)`` is called once per worker, when the distributed dataset is created; it
    returns an iterable of *per-replica* batches, usually sharded with the context
    (``input_pipeline_id`` of ``num_input_pipelines``) and batched with
    ``ctx.get_per_replica_batch_size(global_batch_size)``. Local replicas take successive
    elements; when the iterable runs out part-way through a step, the remaining replicas get empty
    batches (batch axis 0) shaped like the step's first element, as TF does for inputs without a
    static batch size. Making all workers stop on the same step is the input function's job, as in
    TF; a strategy can instead inject ``any_worker_has_data`` (an all-reduce of "I still have data")
    to get TF's multi-worker behaviour: workers that ran out feed empty batches until all have.

Example::

    ds = DistributedDataset(batches, num_replicas_in_sync=4, worker_index=1, num_workers=2,
                            local_replicas=2, wrap=PerReplica)
    for per_replica in ds:          # per_replica wraps [piece 2, piece 3] of each global batch
        strategy.run(step, args=(per_replica,))
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from cluster._batching import empty_like, replica_slices, split_batch, split_batch_at
from cluster.errors import OutOfRangeError

__all__ = [
    "DistributedDataset",
    "DistributedDatasetsFromFunction",
    "DistributedIterator",
    "InputContext",
    "InputReplicationMode",
    "Optional",
    "OutOfRangeError",
    "replica_slices",
    "split_batch",
]


class InputReplicationMode(enum.Enum):
    """How ``distribute_datasets_from_function`` replicates the input function (TF's values).

    ``PER_WORKER``: ``fn`` is called once per worker and its elements are dealt to the worker's
    replicas in turn. ``PER_REPLICA``: ``fn`` is called once per replica, with
    ``InputContext(num_replicas_in_sync, global_replica_id, num_replicas_in_sync)``, and each
    replica iterates its own dataset.
    """

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


class InputContext:
    """What an input function needs to shard and batch its input (``tf.distribute.InputContext``).

    ``num_input_pipelines``: how many input pipelines (workers) there are; ``input_pipeline_id``:
    which one this is (shard with it); ``num_replicas_in_sync``: replicas across the whole cluster.
    """

    __slots__ = ("_input_pipeline_id", "_num_input_pipelines", "_num_replicas_in_sync")

    def __init__(
        self, num_input_pipelines: int = 1, input_pipeline_id: int = 0,
        num_replicas_in_sync: int = 1,
    ) -> None:
        self._num_input_pipelines = num_input_pipelines
        self._input_pipeline_id = input_pipeline_id
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def num_input_pipelines(self) -> int:
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size):
        """``global_batch_size // num_replicas_in_sync``.

        Raises ``ValueError`` when ``global_batch_size`` is not divisible by
        ``num_replicas_in_sync`` (TF's message).
        """
        if global_batch_size % self._num_replicas_in_sync:
            raise ValueError(
                f"The `global_batch_size` {global_batch_size!r} is not divisible by "
                f"`num_replicas_in_sync` {self._num_replicas_in_sync!r} "
            )
        return global_batch_size // self._num_replicas_in_sync

    def __str__(self) -> str:
        return (
            f"InputContext(input pipeline id {self._input_pipeline_id}, "
            f"total: {self._num_input_pipelines})"
        )

    __repr__ = __str__


class Optional:
    """A value that may be absent: ``get_next_as_optional()`` (``tf.experimental.Optional``)."""

    __slots__ = ("_has_value", "_value")

    def __init__(self, value: Any = None, *, has_value: bool = True) -> None:
        self._value = value
        self._has_value = has_value

    @classmethod
    def empty(cls) -> Optional:
        return cls(None, has_value=False)

    def has_value(self) -> bool:
        return self._has_value

    def get_value(self) -> Any:
        """The value; ``ValueError`` when there is none (check ``has_value()`` first)."""
        if not self._has_value:
            raise ValueError("The optional does not have a value; check has_value() first.")
        return self._value


# -- iterators ------------------------------------------------------------------------------------


class DistributedIterator:
    """Iterates a distributed dataset: each ``next()`` is one step, ``wrap``-ped local values.

    ``position`` counts the steps taken. When the dataset is re-iterable in a deterministic order
    (``restart(skip)`` is given: :class:`DistributedDataset` gives it), :meth:`seek` starts over
    and skips to a position, which is how a checkpoint restores an iterator
    (``cluster.checkpoint`` tracks it by its position).
    """

    def __init__(self, steps: Iterator[Any],
                 restart: Callable[[int], Iterator[Any]] | None = None) -> None:
        self._steps = steps
        self._restart = restart
        self.position = 0

    @property
    def seekable(self) -> bool:
        return self._restart is not None

    def seek(self, position: int) -> None:
        """Continue at step ``position`` of the epoch (iterating the dataset again from its
        start, skipping elements without splitting them). ``TypeError`` if not seekable."""
        if self._restart is None:
            raise TypeError("this distributed iterator cannot seek: its input is not a "
                            "re-iterable dataset (use experimental_distribute_dataset)")
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self._steps = self._restart(position)
        self.position = position

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        value = next(self._steps)
        self.position += 1
        return value

    def get_next(self) -> Any:
        """The next step's value; :class:`cluster.errors.OutOfRangeError` at the end (as TF)."""
        try:
            return next(self)
        except StopIteration:
            raise OutOfRangeError(
                "End of sequence: the distributed dataset is exhausted; start a new epoch with "
                "iter(dataset), or use get_next_as_optional() to test for the end."
            ) from None

    def get_next_as_optional(self) -> Optional:
        """The next step's value as an ``Optional``, empty at the end instead of raising."""
        try:
            return Optional(next(self))
        except StopIteration:
            return Optional.empty()


def _identity(values: list[Any]) -> list[Any]:
    return values


def _check_topology(
    num_replicas_in_sync: int, num_workers: int, worker_index: int, local_replicas: int,
) -> None:
    for name, value in (("num_replicas_in_sync", num_replicas_in_sync),
                        ("num_workers", num_workers), ("local_replicas", local_replicas)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(worker_index, int) or not 0 <= worker_index < num_workers:
        raise ValueError(
            f"worker_index must be in [0, {num_workers}) for num_workers={num_workers}, "
            f"got {worker_index!r}"
        )
    if num_replicas_in_sync != num_workers * local_replicas:
        raise ValueError(
            "every worker must have the same number of replicas: num_replicas_in_sync "
            f"({num_replicas_in_sync}) != num_workers ({num_workers}) * local_replicas "
            f"({local_replicas})"
        )


class DistributedDataset:
    """A dataset of global batches, split across all replicas; this worker yields its pieces.

    Each step takes the next global batch, splits it with ``split_batch`` into
    ``num_replicas_in_sync`` pieces and yields ``wrap([pieces of this worker's replicas])``, the
    replicas in global-id order (worker ``w`` owns ``w*local_replicas ..``). With one replica
    in sync the batch is passed through untouched: ``wrap([batch])``. Every worker iterates the
    whole dataset (see the module docstring), so all workers stop on the same step.
    """

    def __init__(
        self, dataset: Iterable[Any], *, num_replicas_in_sync: int, worker_index: int = 0,
        num_workers: int = 1, local_replicas: int | None = None,
        wrap: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        if local_replicas is None:
            local_replicas = num_replicas_in_sync // num_workers if num_workers else 0
        _check_topology(num_replicas_in_sync, num_workers, worker_index, local_replicas)
        if not isinstance(dataset, Iterable):
            raise TypeError(
                f"a dataset must be an iterable of batches, got {type(dataset).__name__}; pass "
                "e.g. a list of batches or a generator object"
            )
        if hasattr(dataset, "shape") or isinstance(dataset, Mapping):
            # Iterating an array yields its rows and a dict its keys: never global batches.
            raise TypeError(
                f"a dataset must be an iterable of batches, got a single "
                f"{type(dataset).__name__}, whose iteration would yield rows or keys; batch it "
                "first, e.g. [x[i:i + B] for i in range(0, len(x), B)]"
            )
        self._dataset = dataset
        self._num_replicas = num_replicas_in_sync
        # Global replicas w*k .. w*k+k-1 take pieces w*k .. w*k+k-1, so replica-id order is
        # dataset order. TF's DATA sharding deals piece j*W + w to local replica j of worker w
        # instead (a by-product of sharding the rebatched stream round-robin); each step's
        # pieces, and so each step's global batch, are the same either way.
        self._first = worker_index * local_replicas
        self._stop = self._first + local_replicas
        self._wrap = wrap if wrap is not None else _identity

    def __iter__(self) -> DistributedIterator:
        # A one-shot iterator (a generator) cannot be iterated again: not seekable.
        restartable = not isinstance(self._dataset, Iterator)
        return DistributedIterator(self._steps(), restart=self._steps if restartable else None)

    def _steps(self, skip: int = 0) -> Iterator[Any]:
        elements = iter(self._dataset)
        for _ in itertools.islice(elements, skip):  # skipped elements are not split
            pass
        for index, batch in enumerate(elements, start=skip):
            if self._num_replicas == 1:
                yield self._wrap([batch])
                continue
            pieces = split_batch_at(batch, self._num_replicas, f"dataset element {index}")
            yield self._wrap(pieces[self._first:self._stop])


_END = object()


class DistributedDatasetsFromFunction:
    """Per-replica batches from a user input function, called once per worker (or replica).

    ``PER_WORKER`` (default): ``dataset_fn(InputContext(num_workers, worker_index,
    num_replicas_in_sync))`` is called here, once; each step deals its next ``local_replicas``
    elements to the local replicas in order. ``PER_REPLICA``: ``dataset_fn`` is called once per
    local replica with ``InputContext(num_replicas_in_sync, global_replica_id,
    num_replicas_in_sync)`` and each replica iterates its own dataset.

    A step exists while any local replica still has an element; replicas without one get an
    empty batch shaped like a sibling's element (its leaves need a batch axis). With
    ``any_worker_has_data`` (called every step with this worker's answer; returns whether any
    worker has data: an all-reduce the strategy provides), a worker that ran out keeps yielding
    empty batches, shaped like its last element, until every worker has run out.
    """

    def __init__(
        self, dataset_fn: Callable[[InputContext], Iterable[Any]], *, num_workers: int = 1,
        worker_index: int = 0, local_replicas: int = 1, num_replicas_in_sync: int | None = None,
        wrap: Callable[[list[Any]], Any] | None = None,
        replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER,
        any_worker_has_data: Callable[[bool], bool] | None = None,
    ) -> None:
        if num_replicas_in_sync is None:
            num_replicas_in_sync = num_workers * local_replicas
        _check_topology(num_replicas_in_sync, num_workers, worker_index, local_replicas)
        if not callable(dataset_fn):
            raise TypeError(f"dataset_fn must be callable, got {type(dataset_fn).__name__}")
        mode = InputReplicationMode(replication_mode)
        if mode is InputReplicationMode.PER_WORKER:
            contexts = [InputContext(num_workers, worker_index, num_replicas_in_sync)]
        else:
            first = worker_index * local_replicas
            contexts = [
                InputContext(num_replicas_in_sync, first + j, num_replicas_in_sync)
                for j in range(local_replicas)
            ]
        self._datasets = []
        for context in contexts:
            dataset = dataset_fn(context)
            if not isinstance(dataset, Iterable):
                raise TypeError(
                    f"dataset_fn must return an iterable of per-replica batches, got "
                    f"{type(dataset).__name__} for {context}"
                )
            self._datasets.append(dataset)
        self._mode = mode
        self._local_replicas = local_replicas
        self._wrap = wrap if wrap is not None else _identity
        self._any_worker_has_data = any_worker_has_data

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(self._steps())

    def _take(self, iterators: list[Iterator[Any]], exhausted: list[bool]) -> list[Any]:
        """This step's element for each local replica, ``_END`` where the input ran out."""
        if self._mode is InputReplicationMode.PER_WORKER:
            taken = []
            for _ in range(self._local_replicas):
                taken.append(_END if exhausted[0] else next(iterators[0], _END))
                exhausted[0] = taken[-1] is _END
            return taken
        taken = []
        for j, iterator in enumerate(iterators):
            taken.append(_END if exhausted[j] else next(iterator, _END))
            exhausted[j] = taken[-1] is _END
        return taken

    def _steps(self) -> Iterator[Any]:
        iterators = [iter(dataset) for dataset in self._datasets]
        exhausted = [False] * len(iterators)
        last = _END
        step = 0
        while True:
            taken = self._take(iterators, exhausted)
            present = [element for element in taken if element is not _END]
            has_data = bool(present)
            if self._any_worker_has_data is not None:
                has_data = bool(self._any_worker_has_data(has_data))
            if not has_data:
                return
            template = present[0] if present else last
            if template is _END:
                raise ValueError(
                    f"step {step}: other workers still have data but this worker's input "
                    "produced no element at all, so there is no shape to build its empty "
                    "batches from; give every worker at least one batch."
                )
            if len(present) < len(taken):
                empty = empty_like(template, f"step {step}: the per-replica batch")
                taken = [empty if element is _END else element for element in taken]
            last = template
            step += 1
            yield self._wrap(taken)
