"""``TFConfigClusterResolver``: the cluster and this task's identity from ``TF_CONFIG``.

Mirrors ``tf.distribute.cluster_resolver.TFConfigClusterResolver``. ``TF_CONFIG`` is read from
``os.environ`` on every call (never at import or construction), so changing the variable changes
what an existing resolver reports. A ``TF_CONFIG`` like::

    {"cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"]},
     "task": {"type": "worker", "index": 1},
     "rpc_layer": "grpc"}

gives ``task_type == "worker"``, ``task_id == 1`` and ``master() == "grpc://w1:2222"``.

TensorFlow behaviours kept on purpose:

* No ``TF_CONFIG`` (or ``{}``): empty ``ClusterSpec``, ``task_type``/``task_id``/``rpc_layer``
  ``None``, ``master() == ""``.
* The task need not be in the cluster: ``cluster_spec()`` never checks it. ``master()`` raises
  ``ValueError`` for an evaluator outside the cluster or an index out of range, and so does
  ``num_accelerators()`` (it calls ``master()``).
* ``master()`` returns ``session_master`` verbatim when TF_CONFIG has one, and ``""`` when the
  cluster has no job or a single job with a single task (whatever task is asked for).
* ``master(rpc_layer="")`` means "no prefix" here (TF tests ``is not None``), while
  ``SimpleClusterResolver`` treats ``""`` as "use my own". A constructor ``rpc_layer=""``
  likewise hides TF_CONFIG's.
* ``task_type``/``task_id`` given to the constructor or set later win over TF_CONFIG and are
  coerced with ``str()``/``int()`` when read (``task_id="1"`` reads back as ``1``); setting them to
  ``None`` falls back to TF_CONFIG again.
* ``environment`` is the constructor argument (default ``None``); TF ignores any
  ``"environment"`` key in TF_CONFIG, and so does this class.

Malformed TF_CONFIG raises ``ClusterConfigError`` (see ``resolver._tf_config_parser``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from resolver._tf_config_parser import TFConfig, parse_tf_config
from resolver.base import ClusterResolver, format_master_url
from resolver.cluster_spec import ClusterSpec

__all__ = ["TFConfigClusterResolver"]

_TF_CONFIG_ENV = "TF_CONFIG"


def _raw() -> str | None:
    # The one place the environment is read; called on every access by design.
    return os.environ.get(_TF_CONFIG_ENV)


def _load() -> TFConfig:
    return parse_tf_config(_raw())


def sparse_cluster_only() -> bool:
    """True when ``TF_CONFIG`` has Kubeflow's ``"sparseCluster"`` (dynamic workers) and no
    ``"cluster"``: TF then sees an empty cluster; process entry points explain why. Never raises
    (a malformed ``TF_CONFIG`` is the resolver's to report)."""
    raw = _raw()
    try:
        doc = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return False
    return isinstance(doc, dict) and "sparseCluster" in doc and "cluster" not in doc


class TFConfigClusterResolver(ClusterResolver):
    """Resolves the cluster from the ``TF_CONFIG`` environment variable, like TF's.

    Args:
        task_type: overrides ``task.type`` of TF_CONFIG (read back through ``str()``).
        task_id: overrides ``task.index`` of TF_CONFIG (read back through ``int()``).
        rpc_layer: overrides ``rpc_layer`` of TF_CONFIG; ``""`` means none.
        environment: returned by ``environment`` unchanged.

    Raises (from any method or property that reads TF_CONFIG):
        ClusterConfigError: TF_CONFIG is set but is not valid JSON of the expected shape.
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
    ) -> None:
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment

    @property
    def task_type(self) -> str | None:
        """This task's job name: the override (via ``str()``) or TF_CONFIG's ``task.type``."""
        if self._task_type is None:
            return _load().task_type()
        return str(self._task_type)

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """This task's index: the override (via ``int()``) or TF_CONFIG's ``task.index``.

        An override that ``int()`` rejects raises its ``ValueError``/``TypeError`` here, as in TF.
        """
        if self._task_id is None:
            return _load().task_id()
        return int(self._task_id)

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The override if not ``None`` (``""`` included), else TF_CONFIG's ``rpc_layer``."""
        if self._rpc_layer is None:
            return _load().rpc_layer()
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str | None:  # type: ignore[override]
        return self._environment

    def cluster_spec(self) -> ClusterSpec:
        """A new ``ClusterSpec`` of TF_CONFIG's ``cluster`` (empty when absent or unset)."""
        cluster = _load().cluster()
        return ClusterSpec({} if cluster is None else cluster)

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """Address of ``(task_type, task_id)`` (default: this task), prefixed ``rpc_layer://``.

        Returns TF_CONFIG's ``session_master`` when present, and ``""`` for a cluster with no
        job or with one job of one task. The task index is not coerced: ``master("worker", "1")``
        is an unknown task.

        Raises:
            ValueError: the task's job is not in the cluster (an evaluator outside it, or no task
                known at all) or has no task with that index; also for a job with no tasks.
            ClusterConfigError: malformed TF_CONFIG.
        """
        config = _load()
        session_master = config.session_master()
        if session_master is not None:
            return session_master
        cluster = config.cluster()
        spec = ClusterSpec({} if cluster is None else cluster)
        jobs = spec.jobs
        if not jobs or (len(jobs) == 1 and len(spec.job_tasks(jobs[0])) == 1):
            return ""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        return format_master_url(spec.task_address(task_type, task_id), rpc_layer)

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """Local accelerators of this task (``{"GPU": n}`` or ``{}``); see ``ClusterResolver``.

        Unnamed task fields default to this task's, and ``master()`` is consulted first, so an
        evaluator outside the cluster raises ``ValueError`` here as it does in TF.
        """
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        return super().num_accelerators(task_type, task_id, config_proto)
