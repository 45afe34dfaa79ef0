"""deploy/: the committed manifests are exactly what `clusterctl render` produces today, and
every path the Dockerfile copies exists (no image can be built here: no registry)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from cluster.ctl.render import _manifest

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import gen_manifests  # noqa: E402

COMMITTED = REPO / gen_manifests.OUT_DIR
DOCKERFILE = REPO / "deploy" / "Dockerfile"
REGENERATE = "run `uv run python tools/gen_manifests.py` and commit"


def test_committed_manifests_are_what_render_produces(tmp_path) -> None:
    written = gen_manifests.generate(tmp_path)
    assert {p.name for p in written} == {p.name for p in COMMITTED.glob("*.yaml")}, REGENERATE
    stale = [p.name for p in written if p.read_bytes() != (COMMITTED / p.name).read_bytes()]
    assert not stale, f"stale manifests {stale}: {REGENERATE}"


def test_manifests_cover_both_examples_in_both_formats() -> None:
    for example in gen_manifests.EXAMPLES:
        kinds = [d["kind"] for d in yaml.safe_load_all((COMMITTED / f"{example}-k8s.yaml")
                                                        .read_text())]
        assert kinds[0] == "Service" and set(kinds[1:]) == {"Job"}
        text = (COMMITTED / f"{example}-tfjob.yaml").read_text()
        assert [d["kind"] for d in yaml.safe_load_all(text)] == ["TFJob"]
        assert f"image: {gen_manifests.image(example)}" in text


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _copies() -> list[tuple[str, str]]:
    """``(source, destination)`` of every COPY from the build context, ARG defaults applied."""
    args = {}
    copies = []
    for word, rest in _instructions():
        if word == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "COPY" and not rest.startswith("--from"):
            *sources, dest = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest).split()
            copies += [(source, dest) for source in sources]
    return copies


def test_every_path_the_dockerfile_copies_exists() -> None:
    copies = _copies()
    assert copies, "no COPY found"
    missing = [source for source, _ in copies if not (REPO / source).exists()]
    assert not missing, f"deploy/Dockerfile copies paths that do not exist: {missing}"
    copied = {source.rstrip("/") for source, _ in copies}
    # Every package the wheel ships (pyproject's hatch list), so the image can run them all.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = set(project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])
    assert packages >= {"resolver", "cluster", "worker", "ps", "coordination_service"}
    assert packages | {"pyproject.toml", "uv.lock"} <= copied, sorted(packages - copied)


def test_the_image_puts_the_code_where_the_manifests_run_it() -> None:
    instructions = _instructions()
    workdirs = [rest for word, rest in instructions if word == "WORKDIR"]
    assert workdirs[-1] == str(_manifest.CODE_DIR)  # render's workingDir
    code = [source for source, dest in _copies() if dest.rstrip("/") == str(_manifest.CODE_DIR)]
    assert code == ["examples/quickstart/"] and (REPO / code[0] / "cluster.yaml").is_file()
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    assert "uv sync --frozen --no-dev" in runs
    assert any(word == "EXPOSE" and rest == str(_manifest.PORT) for word, rest in instructions)
    assert (REPO / "deploy" / "Dockerfile.dockerignore").is_file()
