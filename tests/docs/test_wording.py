"""Docs, code, comments and tests say what is true now: no word of issue numbers, work sessions,
mornings, nights or builds ("issue 18", "since the last session", "the build before"); history
lives in git. Every tracked text file under the project's own directories is scanned, and each
hit is reported as ``file:line``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

SCANNED = ("README.md", "mkdocs.yml", "docs/", "cluster/", "resolver/", "worker/", "ps/",
           "tests/", "bench/", "examples/", "tools/", "deploy/", "proto/")
THIS_FILE = Path(__file__).resolve().relative_to(REPO).as_posix()

# Each names a way of dating a statement, precise enough to leave technical words alone
# ("calls run in issue order", "a new session (its own process group)", pytest's
# scope="session", "build the same dict").
PROCESS_WORDS = re.compile("|".join([
    r"\bissues? #?\d+",                              # issue 18, issues 17 and 20
    r"\bthe issue's\b",                              # the bar
    r"\b(?:this|last|previous|earlier|next|that) session\b",
    r"\b(?:morning|evening|afternoon)s?\b|\bmorning's\b|\bevening's\b",
    r"\bnights?\b|\bovernight\b",
    r"\byesterday\b|\bthe day before\b",
    r"\bthe build before\b",
    # "build" as a noun (a version of the code), not the verb: "fixtures that build groups"
    r"\b(?:this|that|the final|the previous|the last|the next|another|an earlier|the old|"
    r"the new) build(?:'s\b|(?=\s*[,.;:)]|\s*$|\s+of\b))",
]), re.IGNORECASE)


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED], cwd=REPO, check=True,
                         capture_output=True, timeout=30).stdout
    return sorted(p for p in out.decode().split("\0") if p and p != THIS_FILE)


def hits(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if PROCESS_WORDS.search(line)]


@pytest.mark.parametrize("dated", [
    "issue 18 target", "(issue 20 item 11)", "Issue 22: JAX came back as NumPy",
    "The issue's bar", "since the last session", "this morning's six runs",
    "the night before", "What changed that evening", "on the build before",
    "six runs of the final build", "another build's _gradients.py", "last night",
])
def test_the_pattern_finds_dated_wording(dated: str) -> None:
    assert PROCESS_WORDS.search(dated), dated


@pytest.mark.parametrize("technical", [
    "calls run one at a time in issue order", "Start a process in a new session (its own",
    '@pytest.fixture(scope="session")', "two ranks that build the same dict",
    "builds the ClusterSpec", "no build step", "two test sessions on one machine",
])
def test_the_pattern_leaves_technical_words_alone(technical: str) -> None:
    assert not PROCESS_WORDS.search(technical), technical


def test_no_tracked_file_dates_what_it_says() -> None:
    files = tracked_files()
    assert "README.md" in files and any(f.startswith("cluster/") for f in files)
    found = []
    for rel in files:
        path = REPO / rel
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary: images, arrays
            continue
        found += [f"{rel}:{n}: {line}" for n, line in hits(data.decode("utf-8", "replace"))]
    assert not found, ("say what is true now, without issue numbers, sessions, mornings, "
                       "nights or builds:\n" + "\n".join(found))
