"""``clusterctl render``: a cluster file as text for running it elsewhere.

One table, :data:`FORMATS`, maps each ``--format`` to its renderer and the options it accepts;
a new format is one module and one row. :func:`render` checks the options
against the row and returns the text to print, or raises :class:`RenderError` (exit 2).

Example::

    from cluster.ctl import load_cluster_file
    from cluster.ctl.render import RenderOptions, render

    text = render(load_cluster_file("cluster.yaml"), "k8s", RenderOptions(image="me/train:1"))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cluster.ctl.render import k8s, slurm, tf_config, tfjob
from cluster.ctl.render.api import DEFAULT_IMAGE, DEFAULT_NAMESPACE, RenderError, RenderOptions
from cluster.ctl.spec import ClusterFile

__all__ = ["DEFAULT_IMAGE", "DEFAULT_NAMESPACE", "FORMATS", "Format", "RenderError",
           "RenderOptions", "render"]


@dataclass(frozen=True)
class Format:
    """A ``--format``: its renderer, the options it accepts, a line of help."""

    render: Callable[[ClusterFile, RenderOptions], str]
    options: tuple[str, ...]
    help: str


FORMATS: dict[str, Format] = {
    "tf-config": Format(tf_config.render, ("task",), "each task's TF_CONFIG, one line per task"),
    "k8s": Format(k8s.render, ("image", "namespace"),
                  "a headless Service and one Indexed Job per job (kubectl apply -f -)"),
    "tfjob": Format(tfjob.render, ("image", "namespace"), "a Kubeflow TFJob (kubeflow.org/v1)"),
    "slurm": Format(slurm.render, ("nodes", "partition", "time"),
                    "an sbatch script whose exit code is the run's (sbatch --wait)"),
}


def render(spec: ClusterFile, fmt: str, options: RenderOptions | None = None) -> str:
    """The text of ``spec`` in format ``fmt``; :class:`RenderError` for an unknown format, an
    option the format does not take, or a file the format cannot express."""
    if fmt not in FORMATS:
        raise RenderError(f"unknown format {fmt!r}; formats are {', '.join(FORMATS)}")
    entry = FORMATS[fmt]
    options = options or RenderOptions()
    for name in options.given():
        if name not in entry.options:
            takes = [f for f, e in FORMATS.items() if name in e.options]
            raise RenderError(f"--{name} does not apply to --format {fmt} (only to "
                              f"{', '.join(takes)})")
    return entry.render(spec, options)
