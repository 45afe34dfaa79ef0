"""``bench/membw.py``: the traffic models of a one-host all-reduce, the measurement in fresh
processes (which reads the peers' bytes right and leaves no process behind), and its options."""

from __future__ import annotations

import doctest
import multiprocessing

import pytest

from bench import membw

MIB = 1 << 20


@pytest.mark.parametrize(("ranks", "least", "single_copy"), [
    (1, 0, 0),       # nothing to reduce
    (2, 4, 5),       # 2 inputs read, 2 outputs written; + the 1 segment read back
    (4, 8, 11),
    (8, 16, 23),
    (16, 32, 47),
])
def test_traffic_per_rank_count_in_message_sizes(ranks, least, single_copy):
    assert membw.floor_bytes(ranks, MIB) == least * MIB
    assert membw.single_copy_bytes(ranks, MIB) == single_copy * MIB
    assert membw.floor_bytes(ranks, 0) == membw.single_copy_bytes(ranks, 0) == 0


def test_bad_model_input_names_it():
    with pytest.raises(ValueError, match="ranks >= 1"):
        membw.floor_bytes(0, MIB)
    with pytest.raises(ValueError, match="nbytes >= 0"):
        membw.single_copy_bytes(2, -1)


def test_docstring_examples_hold():
    failed, tried = doctest.testmod(membw)
    assert tried >= 2 and failed == 0


def _children() -> set:
    """This process's live multiprocessing children (other tests' are not ours to judge)."""
    return set(multiprocessing.active_children())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", sorted(membw.MODES))
def test_each_mode_measures_in_processes_that_all_end(mode):
    before = _children()
    got = membw.measure(mode, 2, MIB, iters=3, warmup=1)
    assert got.mode == mode and got.procs == 2 and got.seconds > 0
    per_byte = membw.MODES[mode]
    expected = per_byte * MIB * 2 if mode != "cma" else per_byte * (MIB // 2) * 2
    assert got.moved == expected
    assert got.gb_per_s == pytest.approx(expected / got.seconds / 1e9)
    assert _children() <= before


@pytest.mark.timeout(120)
def test_cma_alone_reads_its_own_array():
    before = _children()
    got = membw.measure("cma", 1, MIB, iters=2, warmup=0)
    assert got.moved == 2 * MIB
    assert _children() <= before


def test_unknown_mode_is_refused_before_any_process_starts():
    before = _children()
    with pytest.raises(ValueError, match="mode: one of copy, add, cma"):
        membw.measure("stream", 2, MIB, iters=1, warmup=0)
    assert _children() <= before


@pytest.mark.parametrize(("argv", "message"), [
    (["--modes", "copy,triad"], "--modes: one or more of copy, add, cma"),
    (["--procs", "0,2"], "--procs: integers from 1"),
    (["--procs", "two"], "--procs: a comma list of integers"),
    (["--nprocs", "1,2"], "--nprocs: rank counts from 2"),
    (["--size", "lots"], "--size: a byte count such as 64M"),
])
def test_bad_options_exit_2_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        membw.main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and "machine:" not in captured.out


@pytest.mark.timeout(120)
def test_a_small_run_prints_both_tables(capsys, tmp_path):
    out = tmp_path / "membw.json"
    assert membw.main(["--procs", "1,2", "--modes", "copy,cma", "--size", "1M", "--iters", "2",
                       "--warmup", "0", "--nprocs", "2,4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("machine: ")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    # 2 modes x 2 process counts, then the floor at N = 2 and 4: 2 and 4 MiB of least traffic
    assert [r.split(" | ")[:2] for r in rows[1:5]] == [["| 1", "copy"], ["| 2", "copy"],
                                                       ["| 1", "cma"], ["| 2", "cma"]]
    assert [r.split(" | ")[:4:3] for r in rows[6:]] == [["| 2", "5"], ["| 4", "11"]]
    from bench.record import load_result
    result = load_result(out)
    assert [len(t.rows) for t in result.tables] == [4, 2]
    assert result.figures[0].unit == "GB/s" and result.figures[0].value > 0
