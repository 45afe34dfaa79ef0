"""Slurm cluster resolver: ``SLURM_*`` job-step variables -> ``ClusterSpec`` + (task_type, task_id).

Mirrors ``tf.distribute.cluster_resolver.SlurmClusterResolver`` (TF 2.x), standard library only:
no ``scontrol`` and no ``nvidia-smi`` subprocesses. Where TensorFlow's behaviour is surprising the
docstrings say so; where we deliberately differ they say "Unlike TF".
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Mapping

from resolver._devices import local_gpu_count
from resolver._hostlist import expand_hostlist, expand_tasks_per_node
from resolver.base import ClusterResolver, format_master_url
from resolver.cluster_spec import ClusterSpec
from resolver.errors import ClusterConfigError

# TF's slurm_cluster_resolver module offers expand_hostlist and expand_tasks_per_node beside the
# resolver; this module keeps that surface (they are defined, pure, in resolver._hostlist).
__all__ = ["SlurmClusterResolver", "expand_hostlist", "expand_tasks_per_node", "get_num_gpus"]

_NON_NEGATIVE_INT = re.compile(r"[0-9]+\Z")
# Module-level so tests can point GPU discovery at a fake /dev and /proc.
_DEVICE_DIR = "/dev"
_PROC_GPUS_DIR = "/proc/driver/nvidia/gpus"


def _visible_cuda_devices() -> list[str] | None:
    """Entries of CUDA_VISIBLE_DEVICES that CUDA honours (same rule as ``local_gpu_count``)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = [entry.strip() for entry in value.split(",")]
    # CUDA stops at the first invalid entry; "-1" is the conventional "hide every GPU".
    stop = next((i for i, e in enumerate(entries) if not e or e.startswith("-")), len(entries))
    return entries[:stop]


def get_num_gpus() -> int:
    """Number of NVIDIA GPUs this process can use, without running anything.

    ``CUDA_VISIBLE_DEVICES`` when set (``''`` and ``'-1'`` are 0), else the ``/dev/nvidia<N>``
    device files (see ``resolver._devices.local_gpu_count``). Unlike TF, which runs
    ``nvidia-smi --list-gpus`` (and fails where it is missing) and counts
    ``CUDA_VISIBLE_DEVICES=''`` as one GPU.
    """
    return local_gpu_count(dev_dir=_DEVICE_DIR, proc_gpus_dir=_PROC_GPUS_DIR)


def _slurm_var(name: str) -> str:
    """``os.environ[name]``; a missing variable raises TF's RuntimeError."""
    try:
        return os.environ[name]
    except KeyError:
        message = f"{name} not found in environment. Not running inside a SLURM step?"
        raise RuntimeError(message) from None


def _slurm_int(name: str) -> int:
    raw = _slurm_var(name)
    if not _NON_NEGATIVE_INT.match(raw.strip()):
        raise ClusterConfigError(f"{name}: {raw!r} is not a non-negative integer")
    return int(raw)


def _check_count(name: str, value: object) -> int:
    """Validates a non-negative integer argument (bool is rejected: True is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ClusterConfigError(f"{name}: expected a non-negative integer, got {value!r}")
    return value


def _tasks_per_node_int(value: object) -> int:
    """TF applies ``int()`` to a non-dict ``tasks_per_node`` (so ``'2'`` works); so do we."""
    try:
        return _check_count("tasks_per_node", int(value))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        message = f"tasks_per_node: expected an int or a dict, got {value!r}"
        raise ClusterConfigError(message) from None


class SlurmClusterResolver(ClusterResolver):
    """Cluster resolver for a Slurm job step (one process per Slurm task), like TF's.

    Every task of the step builds the same cluster: tasks are packed onto the step's nodes, each
    node's tasks get ports ``port_base``, ``port_base + 1``, ...; ranks are then dealt to the jobs
    in **sorted job-name order** (TF's rule: ``{'worker': 3, 'ps': 1}`` makes rank 0 the ``ps``),
    and ``SLURM_PROCID`` picks this process's ``task_type``/``task_id``.

    Slurm variables are read once, by the constructor, as in TF: ``SLURM_PROCID`` always;
    ``SLURM_STEP_NUM_TASKS`` when ``jobs`` is None; ``SLURM_STEP_NODELIST`` unless
    ``tasks_per_node`` is a dict; ``SLURM_STEP_TASKS_PER_NODE`` when ``tasks_per_node`` is None.
    There is no fallback to the ``SLURM_JOB_*`` variables (TF has none): outside ``srun`` a
    missing variable raises TF's ``RuntimeError``.

    TF surprises kept on purpose: ``task_type``/``task_id`` stay None until ``cluster_spec()``
    (or ``master()`` with explicit arguments) has run; ``cluster_spec()`` sets
    ``CUDA_VISIBLE_DEVICES`` as a side effect when ``auto_set_gpu``; ``master()`` with no task
    returns ``''``; a rank beyond the step's tasks leaves task_type/task_id None.

    Tasks are packed onto hosts in hostnames' sorted *string* order, as TF's code does (its
    docstring says node-list order; where TF's code and docs disagree, its code wins), so in
    ``node[9-10]`` ranks 0.. are given node10's addresses. Name nodes with zero padding
    (``node[09-10]``) to keep Slurm's and TF's orders the same.

    Unlike TF: 0 GPUs per task works (TF divides by zero); when ``CUDA_VISIBLE_DEVICES`` at
    construction lists all of the node's GPUs, slices are taken from that list, so a step given
    GPUs ``2,3`` hands out 2 and 3 (TF: 0 and 1, GPUs that are not the step's); malformed Slurm
    values raise ``ClusterConfigError``.
    """

    def __init__(
        self,
        jobs: Mapping[str, int] | None = None,
        port_base: int = 8888,
        gpus_per_node: int | None = None,
        gpus_per_task: int | None = None,
        tasks_per_node: int | Mapping[str, int] | None = None,
        auto_set_gpu: bool = True,
        rpc_layer: str | None = "grpc",
    ) -> None:
        """Reads the Slurm step and checks that jobs and GPUs fit into it.

        Args:
          jobs: ``{job name: number of tasks}``; default ``{'worker': SLURM_STEP_NUM_TASKS}``.
          port_base: port of the first task on each node.
          gpus_per_node: default: ``get_num_gpus()`` on this node.
          gpus_per_task: default ``gpus_per_node // (most tasks on any node)``; 0 means the tasks
            get no GPUs (``CUDA_VISIBLE_DEVICES`` is left alone, ``num_accelerators()`` is {}).
          tasks_per_node: an int for every node of ``SLURM_STEP_NODELIST``, or a dict
            ``{hostname: tasks}`` used instead of Slurm's variables (in its own order).
          auto_set_gpu: make ``cluster_spec()`` set ``CUDA_VISIBLE_DEVICES`` to this task's GPUs.
          rpc_layer: scheme for ``master()``.

        Raises:
          RuntimeError: a needed Slurm variable is missing; ``jobs`` do not add up to the step's
            task count ("Requested 5 tasks but only 4 were assigned."); the tasks of one node
            need more GPUs than it has ("Requested more GPUs per node than available."). These
            are TF's types and messages.
          ClusterConfigError: a Slurm variable or argument is malformed, the node list and the
            tasks-per-node list disagree in length, or no node is given.
        """
        self._rank = _slurm_int("SLURM_PROCID")
        if jobs is None:
            jobs = {"worker": _slurm_int("SLURM_STEP_NUM_TASKS")}
        self._jobs = {name: _check_count(f"jobs[{name!r}]", n) for name, n in jobs.items()}
        self._port_base = port_base
        self._task_configuration = self._resolve_task_configuration(tasks_per_node)

        max_tasks_per_node = max(self._task_configuration.values())
        num_tasks = sum(self._task_configuration.values())
        visible = _visible_cuda_devices()  # before cluster_spec() narrows it to one slice
        if gpus_per_node is None:
            gpus_per_node = get_num_gpus()
        self._gpus_per_node = _check_count("gpus_per_node", gpus_per_node)
        # Node GPU i is visible[i] when the list names every GPU of the node, else i (TF's way).
        covers = visible is not None and len(visible) >= gpus_per_node
        self._gpu_names = visible if covers else [str(i) for i in range(gpus_per_node)]
        if gpus_per_task is None:
            # TF divides unguarded; a node list whose counts are all 0 would raise there.
            gpus_per_task = gpus_per_node // max_tasks_per_node if max_tasks_per_node else 0
        self._gpus_per_task = _check_count("gpus_per_task", gpus_per_task)

        self._auto_set_gpu = auto_set_gpu
        self.task_type = None
        self.task_id = None
        self.rpc_layer = rpc_layer

        if max_tasks_per_node * self._gpus_per_task > self._gpus_per_node:
            raise RuntimeError("Requested more GPUs per node than available.")
        requested = sum(self._jobs.values())
        if requested != num_tasks:
            # TF's wording, even when fewer tasks are requested than the step has.
            raise RuntimeError(f"Requested {requested} tasks but only {num_tasks} were assigned.")

    @staticmethod
    def _resolve_task_configuration(
        tasks_per_node: int | Mapping[str, int] | None,
    ) -> dict[str, int]:
        """``{hostname: tasks on it}`` in node-list order (a dict keeps TF's dedup semantics)."""
        if isinstance(tasks_per_node, Mapping):
            if not tasks_per_node:
                raise ClusterConfigError("tasks_per_node: {} names no hosts")
            return {
                str(host): _check_count(f"tasks_per_node[{host!r}]", n)
                for host, n in tasks_per_node.items()
            }
        nodelist = _slurm_var("SLURM_STEP_NODELIST")
        hosts = expand_hostlist(nodelist, source="SLURM_STEP_NODELIST")
        if not hosts:
            raise ClusterConfigError(f"SLURM_STEP_NODELIST: {nodelist!r} names no hosts")
        if tasks_per_node is not None:
            return dict.fromkeys(hosts, _tasks_per_node_int(tasks_per_node))
        raw = _slurm_var("SLURM_STEP_TASKS_PER_NODE")
        counts = expand_tasks_per_node(raw, source="SLURM_STEP_TASKS_PER_NODE")
        if len(counts) != len(hosts):
            # TF zips the two lists and silently drops the surplus.
            raise ClusterConfigError(
                f"SLURM_STEP_TASKS_PER_NODE: {raw!r} gives task counts for {len(counts)} nodes"
                f" but SLURM_STEP_NODELIST {nodelist!r} names {len(hosts)}"
            )
        return dict(zip(hosts, counts, strict=True))

    def cluster_spec(self) -> ClusterSpec:
        """Builds the ClusterSpec; sets task_type/task_id and, if auto_set_gpu, GPU visibility.

        Recomputed on every call from the values read at construction. With ``auto_set_gpu``
        and GPUs per task > 0, ``CUDA_VISIBLE_DEVICES`` becomes this task's slice: the task with
        local index ``i`` on its node gets node GPUs ``i*g .. i*g+g-1`` (TF's formula).

        Raises:
          ClusterConfigError: ``auto_set_gpu`` is set and ``SLURM_PROCID`` is not one of the
            step's ranks (TF raises IndexError there).
        """
        task_list: list[str] = []
        gpu_allocation: list[str] = []
        gpt = self._gpus_per_task
        # TF iterates the hosts sorted as strings (see the class docstring).
        for host, num_tasks in sorted(self._task_configuration.items()):
            for local_index in range(num_tasks):
                task_list.append(f"{host}:{self._port_base + local_index}")
                node_gpus = range(local_index * gpt, (local_index + 1) * gpt)
                gpu_allocation.append(",".join(self._gpu_names[i] for i in node_gpus))

        allocation: dict[str, list[str]] = {}
        start = 0
        for task_type, num_tasks in sorted(self._jobs.items()):
            allocation[task_type] = task_list[start : start + num_tasks]
            if start <= self._rank < start + num_tasks:
                self.task_type = task_type
                self.task_id = self._rank - start
            start += num_tasks

        if self._auto_set_gpu:
            if self._rank >= len(gpu_allocation):
                raise ClusterConfigError(
                    f"SLURM_PROCID: rank {self._rank} is not one of the step's"
                    f" {len(gpu_allocation)} tasks"
                )
            if gpt > 0:
                os.environ["CUDA_VISIBLE_DEVICES"] = gpu_allocation[self._rank]
        return ClusterSpec(allocation)

    def get_task_info(self) -> tuple[str | None, int | None]:
        """``(task_type, task_id)``; ``(None, None)`` until ``cluster_spec()`` has run (as TF)."""
        return self.task_type, self.task_id

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """``'<rpc_layer>://host:port'`` of the given (default: this) task, or ``''``.

        As in TF this calls ``cluster_spec()`` (with its side effects), and returns ``''`` when
        no task type or id is given and none has been resolved yet. An empty ``rpc_layer``
        falls back to ``self.rpc_layer``; if that is empty too, the bare address is returned.

        Raises:
          ValueError: unknown job or task index (from ``ClusterSpec.task_address``).
        """
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            return ""
        address = self.cluster_spec().task_address(task_type, task_id)
        return format_master_url(address, rpc_layer or self.rpc_layer)

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: object = None,
    ) -> defaultdict[str, int]:
        """``{'GPU': gpus per task}``, the same for every task; empty when that is 0.

        The arguments are ignored, as in TF. Unlike TF's ``{'GPU': 0}``, no GPUs gives an empty
        ``defaultdict(int)`` (the base resolver's convention): ``== {}``, yet ``['GPU']`` is 0.
        """
        del task_type, task_id, config_proto
        result: defaultdict[str, int] = defaultdict(int)
        if self._gpus_per_task > 0:
            result["GPU"] = self._gpus_per_task
        return result
