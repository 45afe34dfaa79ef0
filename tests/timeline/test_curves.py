"""cluster.curves: TensorBoard scalars and the PNG, one writer, and the run without matplotlib."""

from __future__ import annotations

import logging
import sys

import pytest

from cluster.curves import PNG_NAME, Curves
from tests.timeline.test_runs import tfevents_scalars


def test_scalars_go_to_an_event_file_and_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the PNG needs the extra 'plots'")
    curves = Curves(tmp_path, title="t")
    for epoch, (loss, acc) in enumerate([(2.0, 0.5), (1.0, 0.75), (0.5, 0.875)], start=1):
        curves.add(epoch, loss=loss, accuracy=acc)
    assert curves.close() == tmp_path / PNG_NAME
    assert (tmp_path / PNG_NAME).read_bytes()[:4] == b"\x89PNG"
    (events,) = tmp_path.glob("events.out.tfevents.*")
    assert tfevents_scalars(events) == {"loss": [(1, 2.0), (2, 1.0), (3, 0.5)],
                                        "accuracy": [(1, 0.5), (2, 0.75), (3, 0.875)]}


def test_a_disabled_writer_writes_nothing(tmp_path) -> None:
    curves = Curves(tmp_path / "out", enabled=False)
    curves.add(1, loss=1.0)
    assert curves.close() is None
    assert not (tmp_path / "out").exists()
    assert Curves(None).close() is None  # no run directory: nothing to write


def test_without_matplotlib_the_png_is_skipped_with_one_log_line(tmp_path, monkeypatch,
                                                                 caplog) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    curves = Curves(tmp_path)
    curves.add(1, loss=1.0)
    with caplog.at_level(logging.WARNING, logger="cluster.curves"):
        assert curves.close() is None
    assert [r.getMessage() for r in caplog.records] == [
        "curves: no curves.png: matplotlib is not installed (the optional extra 'plots': "
        "uv sync --extra plots)"]
    assert not (tmp_path / PNG_NAME).exists()
    assert list(tmp_path.glob("events.out.tfevents.*"))  # the events are written all the same
