"""``cluster.keras.BackupAndRestore``: ``fit`` that survives preemption and resumes at the same
step, through ``cluster.checkpoint``.

Every task passes the callback (same ``backup_dir``); the chief writes. It saves the model's,
the optimizer's and the metrics' variables, the random state the epoch's shuffle started from
and the position ``[epoch, step]`` (:mod:`cluster.keras._state`):

- at the end of every epoch (``save_freq="epoch"``) or every ``save_freq`` steps;
- on a preemption notice (SIGTERM on any task, as Kubernetes, Slurm and ``clusterctl stop``
  send it): a :class:`~cluster.checkpoint.PreemptionCheckpointHandler` agrees on the step at
  the next batch (a 4-byte all-reduce per step), every task saves and exits 204, which
  ``clusterctl`` (``restart.policy: exit-code``), TFJob and Slurm restart.

When ``fit`` starts again with a checkpoint in ``backup_dir`` it restores it, starts at the
saved epoch (Keras' ``initial_epoch``), restores that epoch's random state (the same shuffle),
passes over the steps already done without computing them, and continues with the saved metric
totals: the final weights equal an uninterrupted run's. When ``fit`` completes, the chief
removes ``backup_dir`` (``delete_checkpoint=False`` keeps it), as Keras' own callback does.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import keras
import numpy as np
import torch

from cluster.checkpoint import Checkpoint, CheckpointManager, PreemptionCheckpointHandler
from cluster.keras import _sync
from cluster.keras._model import replication_of
from cluster.keras._state import KerasState

__all__ = ["BackupAndRestore"]


class BackupAndRestore(keras.callbacks.Callback):
    """Back up ``fit``'s state into ``backup_dir`` and resume from it after a restart (see the
    module docstring).

    Args:
      backup_dir: the checkpoint directory, the same on every task (the chief writes).
      save_freq: ``"epoch"``, or save every that many steps as well.
      delete_checkpoint: remove ``backup_dir`` when ``fit`` completes.

    Raises ``ValueError`` (when ``fit`` starts) for a model that was not compiled inside a
    strategy's scope after ``import cluster.keras``."""

    def __init__(self, backup_dir: str | os.PathLike, save_freq: str | int = "epoch",
                 delete_checkpoint: bool = True) -> None:
        super().__init__()
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq > 0):
            raise ValueError(f"BackupAndRestore: save_freq must be 'epoch' or a positive number "
                             f"of steps, got {save_freq!r}")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        self._state: KerasState | None = None
        self._manager: CheckpointManager | None = None
        self._handler: PreemptionCheckpointHandler | None = None
        self._resume_epoch: int | None = None
        self._epoch = 0

    def on_train_begin(self, logs: Any = None) -> None:
        replication = replication_of(self.model)
        if replication is None:
            raise ValueError(
                "cluster.keras.BackupAndRestore: this model was not compiled inside a "
                "strategy's scope after `import cluster.keras`; import cluster.keras before "
                "building the model and compile it inside strategy.scope()")
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)  # its variables are saved too
        self._replication = replication
        self._state = KerasState(self.model, replication.strategy)
        self._manager = CheckpointManager(Checkpoint(fit=self._state), self.backup_dir,
                                          max_to_keep=2)
        # Restores the newest checkpoint, if any; from now on SIGTERM saves at the next step.
        self._handler = PreemptionCheckpointHandler(replication.strategy.cluster_resolver,
                                                    self._manager)
        restored = self._state.restored
        if restored is not None:
            epoch, step = (int(n) for n in restored["position"])
            self._resume_epoch = epoch
            self.model._initial_epoch = epoch  # how Keras' own BackupAndRestore resumes
            replication.skip_steps = step
            print(f"BackupAndRestore: resuming at epoch {epoch + 1}, step {step} from "
                  f"{self._manager.latest_checkpoint}", flush=True)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch
        state = self._state
        if state is not None and self._resume_epoch == epoch and state.restored is not None:
            _sync.set_rng_state(np.array(state.restored["random"]))
            with torch.no_grad():
                for variable, array in zip(self.model.metrics_variables,
                                           state.restored["metrics"], strict=True):
                    variable.value.copy_(torch.from_numpy(np.array(array)))
            state.restored = None
        if state is not None:
            state.random = _sync.rng_state()
            state.position = np.array([epoch, 0], np.int64)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._handler is not None and self._state is not None:
            self._state.position = np.array([self._epoch, batch], np.int64)
            self._handler.run(_nothing)  # on a preemption notice: saves here and exits 204

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.save_freq != "epoch" and self._state is not None \
                and (batch + 1) % int(self.save_freq) == 0:
            self._state.position = np.array([self._epoch, batch + 1], np.int64)
            self._save()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._state is not None:
            self._state.position = np.array([epoch + 1, 0], np.int64)
            self._state.random = _sync.rng_state()
            self._save()

    def on_train_end(self, logs: Any = None) -> None:
        if self._handler is not None:
            self._handler.close()
            self._handler = None
        if self.delete_checkpoint and getattr(self, "_replication", None) is not None \
                and self._replication.is_chief:
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    def _save(self) -> None:
        assert self._manager is not None and self._handler is not None
        self._manager.save(checkpoint_number=self._handler.total_run_calls)


def _nothing() -> None:
    """The step ``PreemptionCheckpointHandler.run`` wraps: the batch itself runs in Keras."""
