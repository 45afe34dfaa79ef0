"""``cluster.curves``: training curves as TensorBoard event files and a PNG, for one writer task.

::

    curves = Curves(run_dir, enabled=is_chief)         # one task writes
    for epoch in ...:
        curves.add(epoch, loss=0.71, accuracy=0.89)   # TensorBoard scalars "loss", "accuracy"
    curves.close()                                    # + run_dir/curves.png

The event files (``events.out.tfevents.*``, written by ``tensorboardX``) are flushed at every
:meth:`Curves.add`, so ``tensorboard --logdir RUN_DIR`` shows a run while it goes on. The PNG
(one panel per scalar) needs ``matplotlib``, the optional extra ``plots``
(``uv sync --extra plots`` or ``pip install 'cluster-runtime[plots]'``); without it
:meth:`Curves.close` skips it and logs one line saying so. Only one task should write (the
chief): a ``Curves`` with ``enabled=False`` does nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["PNG_NAME", "Curves"]

PNG_NAME = "curves.png"

log = logging.getLogger(__name__)


class Curves:
    """Scalars per step of one run in ``log_dir`` (created); see the module docstring."""

    def __init__(self, log_dir: str | os.PathLike[str] | None, *, enabled: bool = True,
                 title: str = "", x_label: str = "epoch") -> None:
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.enabled = enabled and self.log_dir is not None
        self.title, self.x_label = title, x_label
        self.history: dict[str, list[tuple[int, float]]] = {}
        self._writer = None
        if self.enabled:
            from tensorboardX import SummaryWriter  # imports protobuf: only for the writer

            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(logdir=str(self.log_dir), flush_secs=5)

    def add(self, step: int, **scalars: float) -> None:
        """Record ``scalars`` (name=value) at ``step`` and flush them to the event file."""
        if not self.enabled:
            return
        for name, value in scalars.items():
            self.history.setdefault(name, []).append((int(step), float(value)))
            self._writer.add_scalar(name, float(value), int(step))
        self._writer.flush()

    def close(self) -> Path | None:
        """Close the event file and draw the PNG; returns its path (``None`` when disabled,
        with nothing recorded, or without matplotlib)."""
        if not self.enabled:
            return None
        self._writer.close()
        self.enabled = False
        if not self.history:
            return None
        try:
            import matplotlib
        except ImportError:
            log.warning("curves: no %s: matplotlib is not installed (the optional extra "
                        "'plots': uv sync --extra plots)", PNG_NAME)
            return None
        matplotlib.use("Agg")  # files only: no display, no GUI toolkit
        from matplotlib import pyplot as plt

        names = list(self.history)
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
        for ax, name in zip(axes[0], names, strict=True):
            steps, values = zip(*self.history[name], strict=True)
            ax.plot(steps, values, marker="o", markersize=3)
            ax.set_title(name)
            ax.set_xlabel(self.x_label)
            ax.grid(alpha=0.3)
        if self.title:
            fig.suptitle(self.title)
        fig.tight_layout()
        path = self.log_dir / PNG_NAME
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
