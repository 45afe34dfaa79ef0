"""``bench/threads.py``: bad options are refused before any process starts; one tiny run takes
the decisions of the cores it is told and names the busiest thread."""

from __future__ import annotations

import pytest

from bench import threads
from bench.record import load_result

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("argv", "message"), [
    (["--models", "gpt"], "--models: one of resnet50, bert-base"),
    (["--paths", "shm,udp"], "--paths: shm and/or network"),
    (["--nprocs", "1"], "--nprocs from 2"),
    (["--as-cores", "two"], "comma lists of integers"),
])
def test_bad_options_are_refused_before_anything_runs(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        threads.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_short_run_takes_the_decisions_of_the_cores_it_is_told(capsys, tmp_path) -> None:
    out = tmp_path / "threads.json"
    assert threads.main(["--models", "resnet50", "--nprocs", "2", "--as-cores", "2,16",
                         "--paths", "network", "--steps", "1", "--warmup", "0",
                         "--json", str(out)]) == 0
    result = load_result(out)  # the schema holds
    assert [row[4] for row in result.tables[0].rows] == ["1 lane(s)", "2 lane(s)"]
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| resnet50")]
    assert [row.split(" | ")[4] for row in rows] == ["1 lane(s)", "2 lane(s)"]
    assert rows[1].split(" | ")[-1].rstrip(" |") not in ("", "-")
