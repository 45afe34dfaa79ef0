"""cluster.timeline in one process: step records, the trace's schema, files a SIGKILL leaves,
the merge, and that nothing is written while it is off."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import cluster
from cluster import timeline
from cluster.collectives.group import CollectiveGroup
from cluster.ctl.spec import parse_cluster_file
from cluster.errors import ClusterFileError
from cluster.transport.inproc import InProcessHub
from tests.conftest import REPO

STEP_KEYS = {"step", "start", "time", "interval", "collective_time", "collectives", "bytes",
             "samples", "samples_per_s"}


@pytest.fixture
def recorder(tmp_path):
    """A recorder writing into tmp_path, installed for the test; the timeline is off after."""
    rec = timeline.Recorder("worker:0", trace=tmp_path / "trace.json",
                            steps=tmp_path / "steps.jsonl")
    timeline.install(rec)
    yield rec
    timeline.install(None)
    rec.close()


def run_ranks(world: int, body) -> None:
    """``body(group)`` on each rank of an in-process group, one thread per rank."""
    hub = InProcessHub(world)
    errors: list[BaseException] = []

    def main(rank: int) -> None:
        try:
            body(CollectiveGroup(hub.transports[rank]))
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=main, args=(r,), name=f"rank-{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank did not finish in 60 s"
    assert not errors, errors


@pytest.mark.timeout(60)
def test_step_records_count_collectives_bytes_and_samples(recorder, tmp_path) -> None:
    def body(group):
        for _ in range(3):
            with timeline.step(samples=32):
                group.all_reduce(np.ones(1024, np.float32))           # 4096 bytes
                group.all_reduce_many([np.ones(3), np.ones((2, 2), np.float32)])  # 24 + 16
        group.barrier()  # outside any step: in the trace only

    run_ranks(2, body)
    recorder.close()
    header, steps = timeline.load_steps(tmp_path / "steps.jsonl")
    assert header["task"] == "worker:0" and header["pid"] == os.getpid()
    assert len(steps) == 6  # 3 per rank (each thread counts its own)
    for record in steps:
        assert set(record) == STEP_KEYS
        assert record["collectives"] == 2
        assert record["bytes"] == 4096 + 24 + 16
        assert record["samples"] == 32
        assert 0 < record["collective_time"] <= record["time"]
        assert record["samples_per_s"] > 0
    assert sorted(r["step"] for r in steps) == [1, 1, 2, 2, 3, 3]
    assert sum(r["interval"] is None for r in steps) == 2  # each rank's first step


@pytest.mark.timeout(60)
def test_the_trace_is_chrome_json_with_named_collectives_nested_in_steps(recorder,
                                                                         tmp_path) -> None:
    def body(group):
        with timeline.step(samples=8):
            group.all_reduce(np.ones(1024, np.float32))
            with timeline.phase("data"):
                pass
        group.broadcast(np.zeros((2, 3), np.int64))

    run_ranks(2, body)
    recorder.close()
    events = json.loads((tmp_path / "trace.json").read_text())  # complete JSON once closed
    assert isinstance(events, list)
    for event in events:
        assert {"name", "ph", "pid", "tid"} <= set(event)
        assert event["pid"] == os.getpid()
        if event["ph"] == "X":
            assert {"ts", "dur", "cat"} <= set(event) and event["dur"] >= 0
    complete = [e for e in events if e["ph"] == "X"]
    names = sorted(e["name"] for e in complete)
    assert names == ["all_reduce #0 (float32[1024])"] * 2 + ["broadcast #1 (int64[2,3])"] * 2 \
        + ["data"] * 2 + ["step 1"] * 2
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"rank-0", "rank-1"}
    assert {e["tid"] for e in complete} == {e["tid"] for e in events
                                            if e["name"] == "thread_name"}
    for tid in {e["tid"] for e in complete}:  # each collective lies inside its step's span
        step = next(e for e in complete if e["tid"] == tid and e["cat"] == "step")
        reduce = next(e for e in complete if e["tid"] == tid and e["name"].startswith("all_"))
        assert step["ts"] <= reduce["ts"] and reduce["ts"] + reduce["dur"] <= step["ts"] + \
            step["dur"] + 1
        assert reduce["args"] == {"group": "default", "bytes": 4096}
        assert step["args"]["bytes"] == 4096 and step["args"]["samples"] == 8


@pytest.mark.timeout(60)
def test_strategy_run_is_a_step_with_the_batch_rows_as_samples(recorder, tmp_path) -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    batch = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.ones((5, 3), np.float32))
    for _ in range(2):
        strategy.run(lambda x: x * 2, args=(batch,))
    with timeline.step(samples=7):  # the script's own step: run is a phase of it
        strategy.run(lambda x: x * 2, args=(batch,))
    recorder.close()
    _, steps = timeline.load_steps(tmp_path / "steps.jsonl")
    assert [(s["step"], s["samples"]) for s in steps] == [(1, 10), (2, 10), (3, 7)]
    names = [e["name"] for e in timeline.load_trace(tmp_path / "trace.json") if e["ph"] == "X"]
    assert names == ["step 1", "step 2", "run", "step 3"]


def test_steps_do_not_nest_and_samples_must_be_a_count(recorder) -> None:
    with timeline.step():
        with pytest.raises(RuntimeError, match="steps do not nest"):
            timeline.step()
    with pytest.raises(ValueError, match="samples must be an int"):
        timeline.step(samples=-1)


@pytest.mark.timeout(60)
def test_off_writes_nothing(tmp_path) -> None:
    timeline.install(None)
    strategy = cluster.MirroredStrategy(["/cpu:0"])
    strategy.run(lambda: 1.0)
    run_ranks(2, lambda group: group.all_reduce(np.ones(4, np.float32)))
    assert timeline.recorder() is None
    assert timeline.step() is timeline.collective(None, "g") is timeline.run_step(())
    assert list(tmp_path.iterdir()) == []


KILLED_WRITER = """
import os, signal, sys
import numpy as np
from cluster import timeline
from cluster.collectives.group import CollectiveGroup
from cluster.transport.inproc import InProcessHub
rec = timeline.Recorder("worker:1", trace=sys.argv[1], steps=sys.argv[2])
timeline.install(rec)
group = CollectiveGroup(InProcessHub(1).transports[0])
for _ in range(700):  # more than FLUSH_EVENTS lines: some are written, the rest buffered
    with timeline.step(samples=1):
        group.all_reduce(np.ones(8, np.float32))
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(60)
def test_a_sigkilled_writer_leaves_files_that_load_and_merge(tmp_path) -> None:
    trace, steps = tmp_path / "worker-1.json", tmp_path / "worker-1.jsonl"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(trace), str(steps)],
                          cwd=REPO, timeout=50, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    text = trace.read_text()
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)  # no closing bracket: the file really was cut off
    assert text.endswith(",\n"), "a write stopped inside a line"
    events = timeline.load_trace(trace)
    assert events[0] == {"name": "process_name", "ph": "M", "pid": events[0]["pid"], "tid": 0,
                         "args": {"name": "worker:1"}}
    collectives = [e for e in events if e.get("cat") == "collective"]
    assert 0 < len(collectives) < 700
    _, records = timeline.load_steps(steps)
    assert 0 < len(records) < 700 and records[-1]["step"] == len(records)

    merged = tmp_path / "timeline.json"
    timeline.merge_traces([("chief:0", tmp_path / "missing.json"), ("worker:1", trace)], merged)
    whole = json.loads(merged.read_text())
    assert {e["pid"] for e in whole["traceEvents"]} == {1}
    names = [e for e in whole["traceEvents"] if e["name"] == "process_name"]
    assert names == [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                      "args": {"name": "worker:1"}}]
    assert len([e for e in whole["traceEvents"] if e.get("cat") == "collective"]) == \
        len(collectives)


def test_merge_gives_each_task_a_named_process_track(tmp_path) -> None:
    sources = []
    for task in ("chief:0", "worker:0", "worker:1"):
        rec = timeline.Recorder(task, trace=tmp_path / f"{task}.json")
        timeline.install(rec)
        with timeline.step(samples=1), timeline.phase("compute"):
            pass
        timeline.install(None)
        rec.close()
        sources.append((task, tmp_path / f"{task}.json"))
    timeline.merge_traces(sources, tmp_path / "merged.json")
    events = json.loads((tmp_path / "merged.json").read_text())["traceEvents"]
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert process_names == {0: "chief:0", 1: "worker:0", 2: "worker:1"}
    for pid in range(3):
        assert [e["name"] for e in events if e["pid"] == pid and e["ph"] == "X"] == \
            ["compute", "step 1"]


PLAIN_SCRIPT = """
import numpy as np, cluster
strategy = cluster.MirroredStrategy(["/cpu:0"])
for _ in range(3):
    strategy.run(lambda x: x + 1, args=(np.ones((6, 2)),))
"""


@pytest.mark.timeout(60)
def test_the_variables_turn_it_on_in_a_plain_script_and_exit_closes_the_files(tmp_path) -> None:
    env = {**os.environ, "CLUSTER_TIMELINE": str(tmp_path / "t.json"),
           "CLUSTER_STEPS": str(tmp_path / "s.jsonl")}
    proc = subprocess.run([sys.executable, "-c", PLAIN_SCRIPT], cwd=REPO, env=env, timeout=50,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    events = json.loads((tmp_path / "t.json").read_text())  # closed at exit: complete JSON
    assert [e["name"] for e in events if e["ph"] == "X"] == ["step 1", "step 2", "step 3"]
    assert events[0]["args"] == {"name": "local"}
    header, steps = timeline.load_steps(tmp_path / "s.jsonl")
    assert header["task"] == "local"
    assert [(s["step"], s["samples"]) for s in steps] == [(1, 6), (2, 6), (3, 6)]


def test_the_cluster_file_key_is_a_boolean(tmp_path) -> None:
    base = "entrypoint: train.py\ncluster: {worker: 1}\n"
    path = tmp_path / "cluster.yaml"
    (tmp_path / "train.py").write_text("")
    assert parse_cluster_file(base + "timeline: true\n", path).timeline is True
    assert parse_cluster_file(base, path).timeline is False
    with pytest.raises(ClusterFileError, match="timeline: expected true or false, got"):
        parse_cluster_file(base + "timeline: yes please\n", path)
