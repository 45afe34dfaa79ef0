"""The contract's program, run as one task of a cluster (or alone): trains a small classifier with
``model.fit`` under ``MultiWorkerMirroredStrategy`` once per variant, and writes what each ended
with to ``OUT/<variant>/<task>.npz`` (weights, history, evaluate) for the tests to compare.

``python _fit_task.py OUT [VARIANT ...] [--strategy none]``; a variant is
``OPTIMIZER-DATA[-shuffle]`` with OPTIMIZER ``sgd`` or ``adam`` and DATA ``arrays``,
``pydataset`` or ``dataloader``. ``--strategy none``: plain Keras, no strategy (the reference).

``--files DIR``: every task also passes ``ModelCheckpoint`` and ``CSVLogger`` writing into DIR
(the same folder for every task) and calls ``model.save(DIR/model.keras)``; a callback after
them records, at every epoch's end, where each task's checkpoint went and which files were
there, into ``OUT/<variant>/<task>-files.json``.

``--backup DIR``: ``cluster.keras.BackupAndRestore(DIR/<variant>)`` too. ``--preempt-at
EPOCH:STEP``: on its first attempt, worker:1 sends itself SIGTERM (a preemption notice) when
that step of that epoch (both from 0) begins.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cluster  # noqa: E402
import cluster.keras  # noqa: E402, F401  (before the model is built)

ROWS, FEATURES, CLASSES, GLOBAL_BATCH = 250, 16, 4, 32  # 250 = 7 * 32 + 26: an uneven last batch


def data(seed: int, rows: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    y = (x[:, :CLASSES].argmax(axis=1) + (x[:, -1] > 1.0)) % CLASSES
    return x, y.astype(np.int64)


class Batches(keras.utils.PyDataset):
    """A PyDataset of global batches (every task holds the same one)."""

    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        s = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[s], self.y[s]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("variants", nargs="*", default=["sgd-arrays"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--strategy", default="multi_worker", choices=["multi_worker", "none"])
    parser.add_argument("--files")
    parser.add_argument("--backup")
    parser.add_argument("--preempt-at")
    args = parser.parse_args(argv)
    strategy = (cluster.MultiWorkerMirroredStrategy() if args.strategy == "multi_worker"
                else cluster.get_strategy())
    for variant in args.variants:
        optimizer, data_kind, *shuffle = variant.split("-")
        train(strategy, os.path.join(args.out, variant), optimizer, data_kind, bool(shuffle),
              args.epochs, args.files and os.path.join(args.files, variant),
              args.backup and os.path.join(args.backup, variant), args.preempt_at)
    return 0


class Where(keras.callbacks.Callback):
    """Records where a ModelCheckpoint writes during fit, and what is there, at every epoch."""

    def __init__(self, checkpoint):
        super().__init__()
        self.checkpoint, self.seen = checkpoint, []

    def on_epoch_end(self, epoch, logs=None):
        folder = os.path.dirname(self.checkpoint.filepath)
        self.seen.append({"epoch": epoch, "folder": folder,
                          "files": sorted(os.listdir(folder))})


class Preempt(keras.callbacks.Callback):
    """SIGTERM to this process when step ``step`` of epoch ``epoch`` begins."""

    def __init__(self, epoch: int, step: int):
        super().__init__()
        self.at, self.epoch = (epoch, step), -1

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            print(f"preempting myself at epoch {self.epoch}, step {batch}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)


def train(strategy, out: str, optimizer_name: str, data_kind: str, shuffle: bool,
          epochs: int, files: str | None, backup: str | None = None,
          preempt_at: str | None = None) -> None:
    keras.utils.set_random_seed(1234)
    x, y = data(0, ROWS)
    x_val, y_val = data(1, 70)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(CLASSES)])
        optimizer = (keras.optimizers.SGD(0.05, momentum=0.9) if optimizer_name == "sgd"
                     else keras.optimizers.Adam(0.01))
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    fit_args: dict = {"epochs": epochs, "validation_data": (x_val, y_val), "verbose": 2}
    if data_kind == "arrays":
        fit_args.update(x=x, y=y, batch_size=GLOBAL_BATCH, shuffle=shuffle)
    elif data_kind == "pydataset":
        fit_args.update(x=Batches(x, y, GLOBAL_BATCH), shuffle=shuffle)
    else:
        import torch

        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
            batch_size=GLOBAL_BATCH, shuffle=shuffle)
        fit_args.update(x=loader)
    resolver = getattr(strategy, "cluster_resolver", None)
    task = f"{getattr(resolver, 'task_type', None) or 'alone'}-{getattr(resolver, 'task_id', 0)}"
    os.makedirs(out, exist_ok=True)
    where = None
    if files:
        os.makedirs(files, exist_ok=True)  # CSVLogger, like open(), needs its folder
        checkpoint = keras.callbacks.ModelCheckpoint(
            os.path.join(files, "ckpt-{epoch}.weights.h5"), save_weights_only=True)
        where = Where(checkpoint)
        fit_args["callbacks"] = [checkpoint, keras.callbacks.CSVLogger(
            os.path.join(files, "log.csv")), where]
    if backup:
        callbacks = fit_args.setdefault("callbacks", [])
        first_attempt = os.environ.get("CLUSTER_RESTART_COUNT", "0") == "0"
        if preempt_at and task == "worker-1" and first_attempt:
            callbacks.append(Preempt(*(int(n) for n in preempt_at.split(":"))))
        callbacks.append(cluster.keras.BackupAndRestore(backup))
    history = model.fit(**fit_args)
    if files:
        model.save(os.path.join(files, "model.keras"))
        with open(os.path.join(out, f"{task}-files.json"), "w") as f:
            json.dump({"seen": where.seen, "after": checkpoint.filepath}, f)
    evaluation = model.evaluate(x_val, y_val, batch_size=GLOBAL_BATCH, return_dict=True,
                                verbose=0)
    weights = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    np.savez(os.path.join(out, f"{task}.npz"), **weights,
             logs=np.frombuffer(json.dumps({"history": history.history,
                                            "evaluate": evaluation}).encode(), np.uint8))
    print(f"{task}: {out}: evaluate {evaluation}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
