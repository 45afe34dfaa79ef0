"""``cluster.checkpoint``: save and restore training state, atomically and verifiably.

>>> from cluster.checkpoint import Checkpoint, CheckpointManager, latest_checkpoint
>>> ckpt = Checkpoint(step=step, optimizer=opt, model=[w, b], metric=acc)  # doctest: +SKIP
>>> manager = CheckpointManager(ckpt, "/ckpts", max_to_keep=3)            # doctest: +SKIP
>>> manager.restore_or_initialize()   # the newest readable checkpoint, or None  # doctest: +SKIP
>>> manager.save(checkpoint_number=100)  # -> "/ckpts/ckpt-100"          # doctest: +SKIP

Format (:mod:`cluster.checkpoint._format`): a directory per checkpoint with the tensors in one
safetensors file and a JSON index (names, dtypes, shapes, step, optimizer hyperparameters, the
tensor file's sha256, a format version). Tensor names (:mod:`cluster.checkpoint._trackables`) are
the nest paths. No pickle. Unreadable checkpoints raise
:class:`~cluster.errors.CheckpointCorruptError` naming the file.
"""

from __future__ import annotations

from cluster.checkpoint._directory import latest_checkpoint
from cluster.checkpoint._preemption import PreemptionCheckpointHandler
from cluster.checkpoint.checkpoint import Checkpoint
from cluster.checkpoint.manager import CheckpointManager
from cluster.errors import CheckpointCorruptError

__all__ = [
    "Checkpoint",
    "CheckpointCorruptError",
    "CheckpointManager",
    "PreemptionCheckpointHandler",
    "latest_checkpoint",
]
