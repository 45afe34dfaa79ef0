"""``cluster.keras``: Keras 3 ``model.fit`` under the runtime's strategies (torch backend).

Set ``KERAS_BACKEND=torch`` before Keras is imported; then build and compile inside
``strategy.scope()`` and call ``fit`` unchanged. Entering a strategy's scope in a program that
imported Keras imports this module (a scope hook of the package root), so the program needs no
import of its own. In a task of a launched cluster (not a doctest: it needs the cluster)::

    import os
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras, cluster

    strategy = cluster.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3)   # same x, y on every task

Importing this module wraps ``keras.Model.compile`` once (the only change to a Keras class):
a model compiled inside a strategy's scope is passed to :func:`distribute`, which makes it
data-parallel through Keras' own customisation points on that model and its optimizer
(:mod:`cluster.keras._model`). Outside a scope, ``compile`` is Keras' own. What it gives:

- ``batch_size`` is the global batch; each task computes on its share of every batch
  (:mod:`cluster.keras._split`); the gradients are summed over the tasks, each weighted by its
  share, before ``optimizer.apply`` (any Keras optimizer), so the weights after ``fit`` equal one
  process's ``fit`` on the same batches (float32 rounding) and are bitwise identical on every
  task. The chief's variables are broadcast when training starts; ``shuffle=True`` shuffles
  identically everywhere.
- Metrics, ``History``, the progress bar and ``evaluate`` report the global batch's values, the
  same on every task.
- :class:`BackupAndRestore` saves through ``cluster.checkpoint`` at epoch ends and on a
  preemption notice (SIGTERM on any task), and the restarted ``fit`` resumes at the same step
  (:mod:`cluster.keras.backup`).
- Only the chief writes files (``ModelCheckpoint``, ``TensorBoard``, ``CSVLogger``,
  ``model.save``); the other tasks write into a private temporary folder, then remove it.

Supported: Keras 3 (``keras>=3.5``) on the torch backend, ``MultiWorkerMirroredStrategy`` with
one replica per task, or a single-replica strategy. Refused with a ``ValueError`` naming what
works: the JAX and TensorFlow backends, ``ParameterServerStrategy``, several replicas per
process, ``jit_compile=True``, Keras' own ``BackupAndRestore``.
"""

from __future__ import annotations

import functools
from typing import Any

try:
    import keras
except ImportError as e:  # no Keras, or Keras on its default backend (TensorFlow) without it
    raise ImportError(
        f"cluster.keras needs Keras 3 on the torch backend ({e}): install the keras extra "
        "(uv sync --inexact --extra keras) and set KERAS_BACKEND=torch before importing keras"
    ) from e

from cluster.keras._model import Replication, distribute, replication_of  # noqa: E402
from cluster.keras.backup import BackupAndRestore  # noqa: E402

__all__ = ["BackupAndRestore", "Replication", "distribute", "install", "replication_of"]

_MARK = "__cluster_keras_compile__"


def install() -> None:
    """Wrap ``keras.Model.compile`` (once per process; ``import cluster.keras`` calls it): after
    Keras' ``compile``, a model compiled inside a strategy's scope is :func:`distribute`-d
    over that strategy."""
    original = keras.Model.compile
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        import cluster

        if cluster.has_strategy():
            distribute(self, cluster.get_strategy())
        return result

    setattr(compile, _MARK, True)
    keras.Model.compile = compile


install()
