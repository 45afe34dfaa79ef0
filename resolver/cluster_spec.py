"""``ClusterSpec``: the jobs of a cluster and the network address of each task.

Mirrors ``tf.train.ClusterSpec`` (TensorFlow 2.x ``server_lib``) without protobuf, including the
parts of its behaviour that surprise people:

* A job is given as a list/tuple of addresses (task ``i`` is element ``i``) or as a *sparse*
  ``{index: address}`` dict. Dict keys go through ``int()``, so ``"1"`` and ``1.5`` both become
  task ``1``; duplicate keys after conversion keep the last address.
* ``as_dict()`` returns a job as a **list** whenever its indices are exactly ``0..n-1`` (even if
  it was given as a dict) and as a dict otherwise; a job with no tasks comes back as ``{}``.
* Copying a spec (``ClusterSpec(other)``) sorts the jobs by name and turns ``bytes`` names and
  addresses into ``str`` (TF round-trips through its ``ClusterDef`` proto); building from a dict
  keeps the dict's job order and the caller's values.
* ``spec == other`` compares the internal ``{job: {index: address}}`` mapping with ``other``, so a
  spec equals another spec with the same tasks, and equals a dict of ``{index: address}`` dicts,
  but never a dict of lists. Specs are unhashable.
* Task indices must fit in a signed 32-bit integer (the proto's key type): ``ValueError``.

Errors are TF's types: ``TypeError`` for a cluster that is not a dict/``ClusterSpec``, a job that
is not a list/tuple/dict, or a job name/address that is not ``str``/``bytes``; ``ValueError`` for a
non-integer index key, an unknown job, or an unknown task.

Everything is O(number of tasks) with plain dicts: a 10,000-task spec builds in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ClusterSpec"]

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1

Address = str | bytes
JobTasks = list[Address] | dict[int, Address]


def _check_name(job_name: Any) -> None:
    if not isinstance(job_name, (str, bytes)):
        raise TypeError(f"job name {job_name!r} must be str or bytes")


def _check_address(address: Any) -> None:
    if not isinstance(address, (str, bytes)):
        raise TypeError(f"task address {address!r} must be str or bytes")


def _check_index(index: int) -> None:
    # TF stores tasks in a proto map<int32, string>; anything wider fails there.
    if not _INT32_MIN <= index <= _INT32_MAX:
        raise ValueError(f"task index {index} is out of the int32 range")


def _as_text(value: Address) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class ClusterSpec:
    """The set of jobs in a cluster and the address of every task, like ``tf.train.ClusterSpec``.

    Example::

        spec = ClusterSpec({"worker": ["w0:2222", "w1:2222"], "ps": {3: "ps3:2222"}})
        spec.task_address("worker", 1)   # 'w1:2222'
        spec.as_dict()                   # {'worker': ['w0:2222', 'w1:2222'], 'ps': {3: 'ps3:2222'}}
        spec.job_tasks("ps")             # [None, None, None, 'ps3:2222']

    Raises:
        TypeError: ``cluster`` is neither a dict nor a ``ClusterSpec``; a job is not a list, tuple
            or dict; a job name or address is not ``str``/``bytes``.
        ValueError: a sparse job's key is not convertible by ``int()``, or is outside int32.
    """

    # TF defines __eq__ without __hash__: specs are mutable-looking values, not dict keys.
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, cluster: Mapping[Any, Any] | ClusterSpec) -> None:
        self._cluster_spec: dict[Any, dict[int, Any]] = {}
        if isinstance(cluster, dict):
            for job_name, tasks in cluster.items():
                if isinstance(tasks, (list, tuple)):
                    job = dict(enumerate(tasks))
                elif isinstance(tasks, dict):
                    # int() raises ValueError/TypeError for keys like "x" or None, as in TF.
                    job = {int(index): address for index, address in tasks.items()}
                else:
                    raise TypeError(
                        f"tasks of job {job_name!r} must be a list of addresses or a dict "
                        f"mapping task indices to addresses, got {type(tasks).__name__}"
                    )
                self._cluster_spec[job_name] = job
            self._validate()
        elif isinstance(cluster, ClusterSpec):
            # TF copies through its ClusterDef proto: jobs come out sorted by name and every name
            # and address comes back as str.
            for job_name in sorted(cluster._cluster_spec):
                tasks = cluster._cluster_spec[job_name]
                self._cluster_spec[_as_text(job_name)] = {
                    index: _as_text(address) for index, address in tasks.items()
                }
        else:
            raise TypeError(
                "cluster must be a dict mapping job names to lists of addresses or to "
                f"{{index: address}} dicts, or a ClusterSpec; got {type(cluster).__name__}"
            )

    def _validate(self) -> None:
        # TF validates while building its sorted ClusterDef proto; sorting here also reproduces
        # its TypeError for job names of mixed types.
        for job_name in sorted(self._cluster_spec):
            _check_name(job_name)
            for index, address in self._cluster_spec[job_name].items():
                _check_index(index)
                _check_address(address)

    # -- value protocol ------------------------------------------------------------------------

    def __bool__(self) -> bool:
        """True when the spec has at least one job (a job with no tasks counts)."""
        return bool(self._cluster_spec)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterSpec):
            return self._cluster_spec == other._cluster_spec
        return self._cluster_spec == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        as_dict = self.as_dict()
        items = ", ".join(f"{name!r}: {as_dict[name]!r}" for name in sorted(as_dict))
        return "ClusterSpec({" + items + "})"

    # TF defines only __repr__, so str() gives the same text.
    __str__ = __repr__

    # -- queries -------------------------------------------------------------------------------

    def _job(self, job_name: Any) -> dict[int, Any]:
        try:
            return self._cluster_spec[job_name]
        except KeyError:
            raise ValueError(f"No such job in cluster: {job_name!r}") from None

    @property
    def jobs(self) -> list[Any]:
        """Job names, in the order they were given (sorted for a copied spec)."""
        return list(self._cluster_spec)

    def num_tasks(self, job_name: Any) -> int:
        """Number of tasks in ``job_name``; ``ValueError`` for an unknown job."""
        return len(self._job(job_name))

    def task_indices(self, job_name: Any) -> list[int]:
        """Sorted task indices of ``job_name``; ``ValueError`` for an unknown job."""
        return sorted(self._job(job_name))

    def task_address(self, job_name: Any, task_index: Any) -> Any:
        """Address of task ``task_index`` of ``job_name``.

        The index is looked up as given (no ``int()``): ``task_address("worker", "0")`` is an
        unknown task, while ``True`` finds task 1, exactly as in TF.

        Raises:
            ValueError: unknown job, or no task with that index.
        """
        job = self._job(job_name)
        try:
            return job[task_index]
        except KeyError:
            raise ValueError(f"No task with index {task_index!r} in job {job_name!r}") from None

    def job_tasks(self, job_name: Any) -> list[Any | None]:
        """Addresses of ``job_name`` as a list indexed by task, with ``None`` in the gaps.

        Raises:
            ValueError: unknown job, or a job with no tasks (TF fails there too).
        """
        job = self._job(job_name)
        if not job:
            raise ValueError(f"job {job_name!r} has no tasks")
        tasks: list[Any | None] = [None] * (max(job) + 1)
        # Assign in the job's own order so negative indices land where TF puts them.
        for index, address in job.items():
            tasks[index] = address
        return tasks

    def as_dict(self) -> dict[Any, JobTasks]:
        """A new ``{job: tasks}`` dict: a list for a job indexed ``0..n-1``, else ``{index: addr}``.

        A job with no tasks maps to ``{}``. The result shares nothing mutable with the spec.
        """
        result: dict[Any, JobTasks] = {}
        for job_name, job in self._cluster_spec.items():
            if not job:
                result[job_name] = {}
            elif max(job) + 1 == len(job):
                result[job_name] = self.job_tasks(job_name)
            else:
                result[job_name] = {index: job[index] for index in sorted(job)}
        return result
