"""A compiled Keras model made data-parallel over a strategy's tasks (torch backend).

:func:`distribute` sets, on the model and its optimizer instances (their classes are left
alone), Keras' own customisation points:

- ``model.train_step`` / ``model.test_step``: cut the global batch to this task's rows
  (:mod:`cluster.keras._split`), run the class's step on them, then sum what the step added to
  the metric variables over the tasks, so the logs (progress bar, ``History``, ``evaluate``) are
  the global batch's, identical on every task;
- ``optimizer.apply``: the gradients weighted by this task's share and summed over the tasks
  (:func:`cluster.keras._sync.sum_gradients`) before the class's ``apply``; a custom
  ``train_step`` that calls ``optimizer.apply`` or ``apply_gradients`` is distributed too;
- ``model.fit`` / ``model.evaluate``: a callback that broadcasts the chief's variables when
  training begins and torch's random state at every epoch (identical shuffles), and, on the
  other tasks, file-writing callbacks pointed at a private temporary folder;
- ``model.save`` / ``model.save_weights``: on the other tasks, into that private folder.

``model.predict`` is not split: every task predicts every row (the results are the same
everywhere).
"""

from __future__ import annotations

import inspect
import os
import weakref
from typing import Any

import keras

from cluster.keras import _files, _split, _sync

__all__ = ["Replication", "distribute", "replication_of"]

_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def replication_of(model: Any) -> Replication | None:
    """The :class:`Replication` :func:`distribute` gave ``model``, or ``None``."""
    try:
        return _MODELS.get(model)
    except TypeError:  # an unhashable object is no model of ours
        return None


class Replication:
    """What one distributed model shares among its overrides: the strategy's group, this
    task's place in it, and the weight of this task's gradients in the current step."""

    def __init__(self, model: Any, strategy: Any, group: Any) -> None:
        self.strategy = strategy
        self.group = group
        self.rank = int(group.rank)
        self.world = int(group.world_size)
        self.is_chief = self.rank == 0
        resolver = getattr(strategy, "cluster_resolver", None)
        task_type = getattr(resolver, "task_type", None) or "task"
        task_id = getattr(resolver, "task_id", None)
        self.task = f"{task_type}:{task_id if task_id is not None else self.rank}"
        self.gradient_weight: float | None = None  # set for the duration of a train step
        self.skip_steps = 0  # steps a resumed epoch had already run: passed over, not computed
        self.synced = False
        self._model = weakref.ref(model)

    @property
    def model(self) -> Any:
        return self._model()

    def local_rows(self, data: Any) -> Any:
        """This task's rows of a global batch; sets the gradients' weight ``rows / total``."""
        total = _split.batch_rows(data)
        start, stop = _split.share(total, self.rank, self.world)
        self.gradient_weight = (stop - start) / total if total else 0.0
        return _split.take_rows(data, start, stop)

    def broadcast_state(self) -> None:
        """The chief's model variables (and optimizer variables, once built) everywhere."""
        model = self.model
        variables = list(model.variables)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "built", False):
            variables += list(optimizer.variables)
        _sync.broadcast_variables(self.group, variables)
        self.synced = True


class _Synchronize(keras.callbacks.Callback):
    """Broadcasts the chief's state when ``fit`` begins and its torch random state before every
    epoch's shuffle."""

    def __init__(self, replication: Replication) -> None:
        super().__init__()
        self.replication = replication

    def on_train_begin(self, logs: Any = None) -> None:
        self.replication.broadcast_state()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        _sync.broadcast_rng(self.replication.group)


def _check_supported(model: Any, strategy: Any) -> Any:
    """The strategy's collective group; ``ValueError`` naming what works otherwise."""
    backend = keras.backend.backend()
    if backend != "torch":
        raise ValueError(
            f"cluster.keras trains Keras models on the torch backend; this process runs Keras "
            f"on {backend!r}. Set KERAS_BACKEND=torch before importing keras (the JAX backend "
            "is not supported by model.fit under a cluster strategy: for JAX, write the step "
            "with cluster.jax)")
    import cluster

    extended = strategy.extended
    group = getattr(extended, "collective_group", None)
    name = type(strategy).__name__
    if isinstance(strategy, cluster.ParameterServerStrategy):
        raise ValueError(
            "model.fit under ParameterServerStrategy is not supported by cluster.keras: use "
            "MultiWorkerMirroredStrategy (synchronous, one replica per task) for model.fit, or "
            "ParameterServerStrategy with a ClusterCoordinator and a custom training step "
            "(cluster.optimizers)")
    if group is None or extended.num_local_replicas != 1:
        raise ValueError(
            f"cluster.keras needs one replica per process, but {name} has "
            f"{extended.num_local_replicas} local replicas: use MultiWorkerMirroredStrategy "
            "with one device per task (the default on a CPU host), or a single-replica strategy")
    if getattr(model, "jit_compile", False) is True:
        raise ValueError(
            "cluster.keras: compile(jit_compile=True) puts the training step under "
            "torch.compile, which cannot run the runtime's collectives; compile with "
            "jit_compile=False (the default on the torch backend)")
    return group


def distribute(model: Any, strategy: Any) -> Replication:
    """Make the compiled ``model`` train data-parallel over ``strategy``'s tasks (see the module
    docstring). Call it on every task, after ``model.compile``; calling it again (a new
    ``compile``) replaces the previous overrides.

    Raises ``ValueError`` for a backend other than torch, a strategy with several replicas per
    process or none with collectives (``ParameterServerStrategy``), or ``jit_compile=True``.
    """
    group = _check_supported(model, strategy)
    replication = Replication(model, strategy, group)
    _MODELS[model] = replication
    cls = type(model)
    train_step = cls.train_step.__get__(model)
    test_step = cls.test_step.__get__(model)
    fit = cls.fit.__get__(model)
    evaluate = cls.evaluate.__get__(model)
    fit_signature = inspect.signature(cls.fit)

    def global_logs(logs: Any, before: list) -> Any:
        _sync.sum_metric_updates(group, metrics, before)
        if not isinstance(logs, dict):
            return logs
        result = model.get_metrics_result()
        return {key: result.get(key, value) for key, value in logs.items()}

    metrics: list = []

    def distributed_train_step(data: Any) -> Any:
        if replication.skip_steps > 0:  # done before the preemption: the data moves on only
            replication.skip_steps -= 1
            return model.get_metrics_result()
        local = replication.local_rows(data)
        metrics[:] = model.metrics_variables
        before = _sync.snapshot(metrics)
        try:
            logs = train_step(local)
        finally:
            replication.gradient_weight = None
        return global_logs(logs, before)

    def distributed_test_step(data: Any) -> Any:
        local = replication.local_rows(data)
        replication.gradient_weight = None
        metrics[:] = model.metrics_variables
        before = _sync.snapshot(metrics)
        return global_logs(test_step(local), before)

    def distributed_fit(*args: Any, **kwargs: Any) -> Any:
        bound = fit_signature.bind(model, *args, **kwargs)
        callbacks = bound.arguments.get("callbacks")
        if isinstance(callbacks, keras.callbacks.CallbackList):
            raise TypeError("model.fit under a cluster strategy takes callbacks as a list, not "
                            "a keras.callbacks.CallbackList")
        callbacks = list(callbacks or [])
        _files.check_callbacks(callbacks)
        bound.arguments["callbacks"] = [_Synchronize(replication), *callbacks]
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        if replication.is_chief:
            return fit(**arguments)
        with _files.private_folder(replication.task) as folder, \
                _files.redirect_callbacks(callbacks, folder):
            return fit(**arguments)

    def distributed_evaluate(*args: Any, **kwargs: Any) -> Any:
        if not replication.synced and model.built:
            replication.broadcast_state()
        return evaluate(*args, **kwargs)

    model.train_step = distributed_train_step
    model.test_step = distributed_test_step
    model.fit = distributed_fit
    model.evaluate = distributed_evaluate
    for name in ("save", "save_weights"):
        setattr(model, name, _chief_writes(getattr(cls, name).__get__(model), replication))
    if model.optimizer is not None:
        _distribute_optimizer(model.optimizer, replication)
    if model.built:
        replication.broadcast_state()
    return replication


def _chief_writes(save: Any, replication: Replication) -> Any:
    """``save`` on the chief; elsewhere the same call into a private folder, then removed."""

    def chief_save(filepath: Any, *args: Any, **kwargs: Any) -> Any:
        if replication.is_chief or not isinstance(filepath, (str, os.PathLike)) \
                or _files.is_private(filepath):
            return save(filepath, *args, **kwargs)
        with _files.private_folder(replication.task) as folder:
            return save(_files.private_path(folder, filepath), *args, **kwargs)

    chief_save.__doc__ = save.__doc__
    return chief_save


def _distribute_optimizer(optimizer: Any, replication: Replication) -> None:
    """``optimizer.apply`` sums the tasks' gradients first (weighted by each task's share of
    the step's global batch; outside a ``fit`` step, averaged)."""
    apply = type(optimizer).apply.__get__(optimizer)

    def distributed_apply(grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        # Without variables (Keras then applies to the ones the optimizer was built with),
        # the gradients give the layout: every one must then be a tensor.
        variables = list(trainable_variables) if trainable_variables is not None else grads
        weight = replication.gradient_weight
        if weight is None:
            weight = 1.0 / replication.world
        summed = _sync.sum_gradients(replication.group, grads, variables, weight)
        return apply(summed, trainable_variables)

    optimizer.apply = distributed_apply
