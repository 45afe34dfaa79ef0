"""Keras quickstart: the quickstart's digits classifier as a Keras model, trained with plain
``model.fit`` under ``MultiWorkerMirroredStrategy``.

Run it on a chief and two workers with ``uv run clusterctl launch examples/keras/cluster.yaml``,
or alone (``uv run python examples/keras/train.py``: no TF_CONFIG, one task). Needs the
``keras`` extra (``uv sync --inexact --extra keras``, with torch). ``--batch-size`` is the
global batch: each task computes on its share of every batch, and the weights after ``fit``
equal one process's on the same batches. Only the chief writes ``--save`` and ``--log-csv``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cluster  # noqa: E402

HERE = Path(__file__).resolve().parent
DIGITS = HERE.parent / "quickstart" / "digits.npz"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, help="the chief saves the model here (.keras)")
    parser.add_argument("--log-csv", type=Path, help="the chief writes the epochs' logs here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    data = np.load(DIGITS)
    x_train, y_train = data["x_train"], data["y_train"]
    x_test, y_test = data["x_test"], data["y_test"]

    strategy = cluster.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)),
                                  keras.layers.Dense(args.hidden, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    callbacks = []
    if args.log_csv:
        args.log_csv.parent.mkdir(parents=True, exist_ok=True)
        callbacks.append(keras.callbacks.CSVLogger(str(args.log_csv)))
    print(f"training on {len(x_train)} digits, {strategy.num_replicas_in_sync} replica(s), "
          f"global batch {args.batch_size}", flush=True)
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(x_test, y_test), callbacks=callbacks, verbose=2)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=args.batch_size, verbose=0)
    print(f"test accuracy {accuracy:.4f}, loss {loss:.4f} on {len(x_test)} held-out digits",
          flush=True)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        model.save(args.save)  # the chief's file; the other tasks write a private copy
    return 0


if __name__ == "__main__":
    sys.exit(main())
