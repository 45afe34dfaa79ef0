"""The chief of a parameter-server cluster compiles a Keras model in ParameterServerStrategy's
scope; prints the refusal ``cluster.keras`` gives (exit 0), or exits 1 when there is none."""

from __future__ import annotations

import sys

import keras

import cluster
import cluster.keras  # noqa: F401  (before the model is compiled)


def main() -> int:
    from resolver import TFConfigClusterResolver

    strategy = cluster.ParameterServerStrategy(TFConfigClusterResolver())
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        try:
            model.compile(optimizer="sgd", loss="mse")
        except ValueError as e:
            print(f"refused: {e}", flush=True)
            return 0
    print("not refused", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
