"""bench/ps_checkpoint.py runs end to end on a tiny size and prints every design's row (no
timing is asserted: speed belongs to the benchmark, not the tests)."""

from __future__ import annotations

import pytest

from bench import ps_checkpoint

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def test_the_bench_prints_both_designs_and_the_disk_floor(tmp_path, capsys):
    assert ps_checkpoint.main(["--size", "1M", "--ps", "2", "--runs", "1",
                               "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert [row.split("|")[2].strip() for row in rows] == [
        "coordinator pulls, writes one checkpoint", "each ps writes its shards (I/O floor)",
        "one process writes the bytes (disk floor)"]
    assert not list(tmp_path.iterdir())  # the bench's temporary directory is gone
