"""What the docs say an example prints is what it prints: each figure the pages claim (a test
accuracy, a loss, a bound on time) sits next to a marker, and this test runs the example the way
the page says and compares.

Markers, in README.md and docs/ (HTML comments: invisible on the rendered page):

- ``<!-- claim: RUN.METRIC -->VALUE`` in prose: the figure VALUE, for METRIC of RUN;
- ``<!-- output: RUN -->`` on the line before a fenced block of sample output: every line of it
  that shows figures (``epoch 3/10  loss 0.3468  accuracy 0.9228``, ``test accuracy 0.9639 on
  360 held-out digits``) must appear in RUN's output.

The examples are deterministic (same figures on every run) except parameter-server training,
where which worker's step lands when depends on which worker is free: its claims are lower
bounds (``min-test-accuracy``). PyTorch's repeat on one machine but not across machines (torch
picks its CPU kernels by the vector instructions a CPU has, AVX2 or AVX-512, and their rounding
differs): its claims are lower bounds too. Times vary with the machine: their claims are upper
bounds (``max-seconds``). The runs are ``tests/_examples.py``'s, each started once per session
(through ``clusterctl``'s launcher with the shipped cluster file, or alone as the page says) and
shared with the tests of each example. PyTorch and JAX examples skip when those are not
installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._examples import RUNS, Outcome, timeout_for
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


METRICS = ("test-accuracy", "min-test-accuracy", "max-seconds")


@dataclass(frozen=True)
class Claim:
    where: str  # file:line
    run: str
    metric: str
    value: str


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


def check(claim: Claim, output: Outcome) -> None:
    if claim.metric == "max-seconds":
        assert output.elapsed is not None, f"{claim.where}: max-seconds needs a launch run"
        assert output.elapsed <= float(claim.value), (
            f"{claim.where}: claims at most {claim.value} s, the run took {output.elapsed:.1f} s")
        return
    printed = TEST_ACCURACY.findall(output.text)
    assert len(printed) == 1, f"{claim.where}: expected one test accuracy in:\n{output.text}"
    if claim.metric == "test-accuracy":
        assert printed[0] == claim.value, (
            f"{claim.where}: claims test accuracy {claim.value}, the run printed {printed[0]}")
    else:  # min-test-accuracy
        assert float(printed[0]) >= float(claim.value), (
            f"{claim.where}: claims at least {claim.value}, the run printed {printed[0]}")


@pytest.mark.timeout(max(timeout_for(name) for name in RUNS))
@pytest.mark.parametrize("name", sorted(RUNS))
def test_what_the_docs_claim_is_what_the_example_prints(name, example_runs) -> None:
    mine = [c for c in claims() if c.run == name]
    blocks = [(where, lines) for where, run, lines in sample_outputs() if run == name]
    assert mine or blocks, f"no page claims anything about {name}"
    output = example_runs(name)
    assert output.ok, output.text
    for claim in mine:
        check(claim, output)
    for where, lines in blocks:
        missing = [line for line in lines if line not in output.text]
        assert not missing, f"{where}: sample output the run did not print: {missing}"
