"""The manifests the emulated-pod tests run: ``clusterctl render`` of an example, with the
entry point's arguments replaced (a light run through the example's own knobs)."""

from __future__ import annotations

import dataclasses

from cluster.ctl import load_cluster_file
from cluster.ctl.render import RenderOptions
from cluster.ctl.render import render as render_spec
from tests.conftest import REPO

__all__ = ["render"]


def render(example: str, fmt: str, args: list[str] | None = None,
           namespace: str = "default") -> str:
    """``clusterctl render examples/EXAMPLE/cluster.yaml --format FMT`` (``k8s`` or ``tfjob``),
    the entry point given ``args`` instead of the file's (``None``: the file's)."""
    spec = load_cluster_file(REPO / "examples" / example / "cluster.yaml")
    if args is not None:
        spec = dataclasses.replace(spec, args=tuple(args))
    return render_spec(spec, fmt, RenderOptions(image="cluster-runtime-test:latest",
                                                namespace=namespace))
