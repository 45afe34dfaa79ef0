"""What the docs say an example prints is what it prints: each figure the pages claim (a test
accuracy, a loss, a bound on time) sits next to a marker, and this test runs the example the way
the page says and compares.

Markers, in README.md and docs/ (HTML comments: invisible on the rendered page):

- ``<!-- claim: RUN.METRIC -->VALUE`` in prose: the figure VALUE, for METRIC of RUN;
- ``<!-- output: RUN -->`` on the line before a fenced block of sample output: every line of it
  that shows figures (``epoch 3/10  loss 0.3468  accuracy 0.9228``, ``test accuracy 0.9639 on
  360 held-out digits``) must appear in RUN's output.

The examples are deterministic (same figures on every run) except asynchronous
parameter-server training, whose order of updates varies: its claim is a lower bound
(``min-test-accuracy``). Times vary with the machine: their claims are upper bounds
(``max-seconds``). Each run starts once, through ``clusterctl``'s launcher with the shipped
cluster file (as ``tests/examples`` runs them) or alone as the page says.
PyTorch and JAX examples skip when those are not installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.ctl import launcher
from cluster.ctl.spec import load_cluster_file
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess]

PAGES = ("README.md", "docs")
CLAIM = re.compile(r"<!--\s*claim:\s*([\w-]+)\.([\w-]+)\s*-->\s*([0-9]+(?:\.[0-9]+)?)")
OUTPUT = re.compile(r"<!--\s*output:\s*([\w-]+)\s*-->\s*\n```[^\n]*\n(.*?)\n```", re.DOTALL)
MARKER = re.compile(r"<!--\s*(?:claim|output):")
INLINE_CODE = re.compile(r"`[^`\n]+`")
# Lines of sample output that carry figures; anything else (ports, paths, times) may differ.
FIGURES = re.compile(r"epoch \d+/\d+  loss \d\.\d+  accuracy \d\.\d+"
                     r"|test accuracy \d\.\d+ on \d+ held-out digits")
TEST_ACCURACY = re.compile(r"test accuracy (\d\.\d+) on \d+ held-out digits")


@dataclass(frozen=True)
class Run:
    """One documented way of running an example: ``clusterctl launch`` of its shipped cluster
    file (plus ``args``), or ``python examples/EXAMPLE/train.py`` alone."""

    example: str
    launch: bool = True
    args: tuple[str, ...] = ()
    needs: str | None = None  # a module that must be importable (torch, jax)
    timeout: float = 240.0


RUNS = {
    "quickstart-launch": Run("quickstart"),
    "torch-launch": Run("torch", needs="torch", timeout=300.0),
    "torch-alone": Run("torch", launch=False, needs="torch"),
    "jax-launch": Run("jax", needs="jax", timeout=300.0),
    "jax-alone": Run("jax", launch=False, needs="jax"),
    "ps-async-launch": Run("ps"),
    "ps-sync-launch": Run("ps", args=("--sync",)),
}
METRICS = ("test-accuracy", "min-test-accuracy", "max-seconds")


@dataclass(frozen=True)
class Claim:
    where: str  # file:line
    run: str
    metric: str
    value: str


@dataclass(frozen=True)
class Output:
    text: str
    seconds: float | None  # clusterctl's elapsed time (launch runs only)


def pages() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [f for f in files if f.is_file()]


def read(page: Path) -> str:
    """The page without its inline code spans: a marker quoted in backticks (where a page
    explains the syntax) is an example, not a claim. Lines keep their numbers."""
    return INLINE_CODE.sub("", page.read_text())


def claims() -> list[Claim]:
    found = []
    for path in pages():
        text = read(path)
        for m in CLAIM.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(Claim(f"{path.relative_to(REPO)}:{line}", *m.groups()))
    return found


def sample_outputs() -> list[tuple[str, str, list[str]]]:
    """(file:line, run, the lines with figures) of every sample-output block."""
    found = []
    for path in pages():
        text = read(path)
        for m in OUTPUT.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            lines = [f.group(0) for f in map(FIGURES.search, m.group(2).splitlines()) if f]
            found.append((f"{path.relative_to(REPO)}:{line}", m.group(1), lines))
    return found


def test_every_marker_is_well_formed_and_names_a_known_run() -> None:
    markers = sum(len(MARKER.findall(read(p))) for p in pages())
    found, outputs = claims(), sample_outputs()
    assert markers == len(found) + len(outputs), "a claim/output marker that does not parse"
    for c in found:
        assert c.run in RUNS, f"{c.where}: unknown run {c.run!r} (known: {sorted(RUNS)})"
        assert c.metric in METRICS, f"{c.where}: unknown metric {c.metric!r} ({METRICS})"
    for where, run, lines in outputs:
        assert run in RUNS, f"{where}: unknown run {run!r}"
        assert lines, f"{where}: a sample output without figures to check"
    claimed = {c.run for c in found} | {run for _, run, _ in outputs}
    assert claimed == set(RUNS), f"runs no page claims anything about: {set(RUNS) - claimed}"


def run_example(name: str, tmp: Path, marker: str) -> Output:
    run = RUNS[name]
    if run.needs and importlib.util.find_spec(run.needs) is None:
        pytest.skip(f"{run.needs} is not installed: uv sync --extra {run.needs}")
    example = REPO / "examples" / run.example
    if run.launch:
        spec = load_cluster_file(example / "cluster.yaml")
        spec = dataclasses.replace(
            spec, args=spec.args + run.args,
            env={**spec.env, "CLUSTER_TEST_MARKER": marker},
            timeouts=dataclasses.replace(spec.timeouts, run=run.timeout - 30))
        out = io.StringIO()
        result = launcher.launch(spec, out=out, color="never", run_dir=tmp / name)
        text = out.getvalue()
        assert result.exit_code == 0 and result.attempts == 1, text
        output = Output(text, result.elapsed)
    else:
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        proc = subprocess.run([sys.executable, str(example / "train.py")], cwd=REPO,
                              env={**env, "CLUSTER_TEST_MARKER": marker},
                              capture_output=True, text=True, timeout=run.timeout)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        output = Output(proc.stdout + proc.stderr, None)
    return output


def check(claim: Claim, output: Output) -> None:
    if claim.metric == "max-seconds":
        assert output.seconds is not None, f"{claim.where}: max-seconds needs a launch run"
        assert output.seconds <= float(claim.value), (
            f"{claim.where}: claims at most {claim.value} s, the run took {output.seconds:.1f} s")
        return
    printed = TEST_ACCURACY.findall(output.text)
    assert len(printed) == 1, f"{claim.where}: expected one test accuracy in:\n{output.text}"
    if claim.metric == "test-accuracy":
        assert printed[0] == claim.value, (
            f"{claim.where}: claims test accuracy {claim.value}, the run printed {printed[0]}")
    else:  # min-test-accuracy
        assert float(printed[0]) >= float(claim.value), (
            f"{claim.where}: claims at least {claim.value}, the run printed {printed[0]}")


@pytest.mark.timeout(360)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_what_the_docs_claim_is_what_the_example_prints(name, tmp_path, marker) -> None:
    mine = [c for c in claims() if c.run == name]
    blocks = [(where, lines) for where, run, lines in sample_outputs() if run == name]
    assert mine or blocks, f"no page claims anything about {name}"
    output = run_example(name, tmp_path, marker)
    for claim in mine:
        check(claim, output)
    for where, lines in blocks:
        missing = [line for line in lines if line not in output.text]
        assert not missing, f"{where}: sample output the run did not print: {missing}"
