"""Regenerate the example manifests in ``deploy/kubernetes/`` with ``clusterctl render``.

Usage (from the repository root)::

    uv run python tools/gen_manifests.py

Each example of :data:`EXAMPLES` is rendered in each format of :data:`FORMATS`, with the image
``deploy/Dockerfile`` builds for it (``cluster-runtime-NAME:latest``, built with
``--build-arg CODE=examples/NAME``) and namespace :data:`NAMESPACE`, into
``deploy/kubernetes/NAME-FORMAT.yaml``. ``tests/deploy/test_manifests.py`` renders into a
temporary directory and fails when a committed manifest differs, so change the renderer or an
example, run this, and commit both.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = Path("deploy/kubernetes")
EXAMPLES = ("quickstart", "ps")
FORMATS = ("k8s", "tfjob")
NAMESPACE = "default"


def image(example: str) -> str:
    """The image tag docs/guide/kubernetes.md's build command gives ``examples/EXAMPLE``."""
    return f"cluster-runtime-{example}:latest"


def generate(out_dir: Path) -> list[Path]:
    """Render every example in every format into ``out_dir``; return the files written."""
    sys.path.insert(0, str(REPO))
    from cluster.ctl.render import RenderOptions, render
    from cluster.ctl.spec import load_cluster_file

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for example in EXAMPLES:
        spec = load_cluster_file(REPO / "examples" / example / "cluster.yaml")
        for fmt in FORMATS:
            path = out_dir / f"{example}-{fmt}.yaml"
            path.write_text(render(spec, fmt, RenderOptions(image=image(example),
                                                            namespace=NAMESPACE)))
            written.append(path)
    return written


if __name__ == "__main__":
    for written_path in generate(REPO / OUT_DIR):
        print(written_path.relative_to(REPO))
