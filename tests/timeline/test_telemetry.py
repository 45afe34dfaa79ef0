"""What clusterctl gives each task for the timeline (cluster.ctl._telemetry), without processes."""

from __future__ import annotations

from pathlib import Path

from cluster.ctl import _telemetry
from cluster.ctl.spec import parse_cluster_file


def spec(tmp_path: Path, extra: str = ""):
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "cluster.yaml"
    path.write_text("entrypoint: train.py\ncluster: {chief: 1, worker: 1}\n" + extra)
    return parse_cluster_file(path.read_text(), path)


def test_every_task_records_steps_and_a_trace_only_when_asked(tmp_path) -> None:
    run = tmp_path / "run"
    env = _telemetry.task_env(spec(tmp_path), run, "worker:0", {})
    assert env == {"CLUSTER_RUN_DIR": str(run.resolve()),
                   "CLUSTER_STEPS": str(run.resolve() / "steps" / "worker-0.jsonl"),
                   "CLUSTER_TIMELINE": ""}  # empty: an inherited CLUSTER_TIMELINE is not used
    env = _telemetry.task_env(spec(tmp_path, "timeline: true\n"), run, "chief:0", {})
    assert env["CLUSTER_TIMELINE"] == str(run.resolve() / "timeline" / "chief-0.json")


def test_clusterctls_own_variable_asks_for_a_timeline_merged_where_it_says(tmp_path,
                                                                            monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run, s = tmp_path / "run", spec(tmp_path)
    env = _telemetry.task_env(s, run, "worker:0", {"CLUSTER_TIMELINE": "out/t.json"})
    assert env["CLUSTER_TIMELINE"] == str(run.resolve() / "timeline" / "worker-0.json")
    monkeypatch.setenv("CLUSTER_TIMELINE", "out/t.json")
    said: list[str] = []
    assert _telemetry.finish(s, run, said.append) == tmp_path / "out" / "t.json"
    assert (tmp_path / "out" / "t.json").exists()  # no task wrote a trace: an empty timeline
    assert said[0].startswith(f"timeline: {tmp_path / 'out' / 't.json'} (0 events")
    monkeypatch.delenv("CLUSTER_TIMELINE")
    assert _telemetry.finish(s, run, said.append) is None  # not asked for: nothing merged


def test_the_newest_run_is_remembered_for_status(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _telemetry.started(tmp_path / "run", print)
    pointer = tmp_path / "state" / "cluster-runtime" / "latest-run"
    assert pointer.read_text() == f"{(tmp_path / 'run').resolve()}\n"
