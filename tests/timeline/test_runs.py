"""The timeline and ``clusterctl status`` through real runs of ``clusterctl launch``: the merged
trace after a normal run and after a SIGKILLed task, the status table of a finished run and of a
running one, and the quickstart's curves (TensorBoard events and the PNG)."""

from __future__ import annotations

import io
import json
import socket
import struct
import threading
import uuid
from pathlib import Path

import pytest

from cluster.ctl import cli, launcher, status
from cluster.ctl.spec import parse_cluster_file
from cluster.testing import processes_with
from cluster.timeline import load_steps, load_trace
from tests.conftest import REPO

SCRIPT = Path(__file__).resolve().parent / "scripts" / "steps.py"
QUICKSTART = REPO / "examples" / "quickstart" / "train.py"
TASKS = ["chief:0", "worker:0", "worker:1"]


def cluster_file(tmp_path: Path, marker: str, entrypoint: Path, args: list[str],
                 timeline: bool = True) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"name: tl\nentrypoint: {entrypoint}\nargs: {args!r}\n"
        "cluster: {chief: 1, worker: 2}\n"
        f"env: {{CLUSTER_TEST_MARKER: {marker}, OMP_NUM_THREADS: '1'}}\n"
        f"log_dir: {tmp_path / 'runs'}\n"
        f"timeline: {'true' if timeline else 'false'}\n"
        "restart: {max_restarts: 0}\n"
        "timeouts: {startup: 60, grace: 20, run: 150}\n")
    return path


def launch(path: Path, run_dir: Path, out: io.StringIO | None = None):
    out = out if out is not None else io.StringIO()
    result = launcher.launch(parse_cluster_file(path.read_text(), path), out=out, color="never",
                             run_dir=run_dir)
    return result, out.getvalue()


def assert_chrome_trace(path: Path) -> list[dict]:
    """The merged file: Trace Event Format JSON with one named process per task."""
    whole = json.loads(path.read_text())
    events = whole["traceEvents"]
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and e["dur"] >= 0, e
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(TASKS)
    assert {e["pid"] for e in events} == set(names)  # every event on a task's track
    return events


def collective_names(events: list[dict], task: str) -> list[str]:
    pid = next(e["pid"] for e in events if e["name"] == "process_name"
               and e["args"]["name"] == task)
    return [e["name"] for e in events if e["pid"] == pid and e.get("cat") == "collective"]


# -- the quickstart: one 2-epoch run, looked at several ways ------------------------------------

@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("quickstart")
    marker = f"cluster-test-{uuid.uuid4().hex}"  # module-scoped: its own leak check
    run_dir = tmp_path / "run"
    result, text = launch(cluster_file(tmp_path, marker, QUICKSTART, ["--epochs", "2"]), run_dir)
    assert not processes_with(marker), "processes left behind"
    assert result.exit_code == 0, text
    return run_dir, text


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_run_with_timeline_true_merges_every_task_into_one_chrome_trace(quickstart_run):
    run_dir, text = quickstart_run
    assert f"timeline: {run_dir / 'timeline.json'}" in text
    events = assert_chrome_trace(run_dir / "timeline.json")
    for task in TASKS:
        names = collective_names(events, task)
        # 5 broadcasts of the initial variables, then one fused all-reduce per step (23 per
        # epoch) and the metrics' reads; numbered in call order.
        assert names[0] == "broadcast #0 (float32[64,64])", names[:3]
        steps = [n for n in names if n.startswith("all_reduce_many #")]
        assert len(steps) >= 46, names
        assert all(n.endswith("tensors)") for n in steps)
    step_spans = [e for e in events if e.get("cat") == "step"]
    assert len(step_spans) == 3 * 46


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_status_of_a_finished_run(quickstart_run, capsys):
    run_dir, _ = quickstart_run
    run = status.collect(run_dir)
    assert run.state == "succeeded"
    assert [t.task for t in run.tasks] == TASKS
    for task in run.tasks:
        assert (task.state, task.exit_code, task.last_step) == ("succeeded", 0, 46)
        assert task.steps_per_s > 0 and task.samples_per_s > 0
        assert 0 <= task.collective_share <= 1
    assert cli.main(["status", str(run_dir)]) == 0
    table = capsys.readouterr().out
    assert "run tl: succeeded" in table
    assert table.splitlines()[2].split() == ["TASK", "STATE", "EXIT", "STEP", "STEPS/S",
                                             "SAMPLES/S", "COLLECTIVES", "LAST", "STEP"]
    row = next(line for line in table.splitlines() if line.strip().startswith("worker:1"))
    assert row.split()[:4] == ["worker:1", "succeeded", "0", "46"]


def tfevents_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of a TensorBoard event file (TFRecord framing, tensorboardX's protos)."""
    from tensorboardX.proto import event_pb2

    data, scalars, at = path.read_bytes(), {}, 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
        at += 12 + length + 4
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_quickstart_writes_tensorboard_events_and_a_png_into_the_run_dir(quickstart_run):
    run_dir, text = quickstart_run
    events = list(run_dir.glob("events.out.tfevents.*"))
    assert len(events) == 1, "only the chief writes"
    scalars = tfevents_scalars(events[0])
    assert sorted(scalars) == ["accuracy", "loss"]
    assert [step for step, _ in scalars["loss"]] == [1, 2]
    assert scalars["loss"][1][1] < scalars["loss"][0][1]  # it learns
    pytest.importorskip("matplotlib", reason="the PNG needs the extra 'plots'")
    png = run_dir / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"curves: {png}" in text


# -- a task killed by SIGKILL ---------------------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_sigkilled_task_leaves_a_trace_the_merge_repairs(tmp_path, marker):
    run_dir = tmp_path / "run"
    result, text = launch(cluster_file(tmp_path, marker, SCRIPT, ["--kill", "worker:1"]), run_dir)
    assert result.exit_code != 0, text
    killed = next(t for t in result.tasks if t.task == "worker:1")
    assert killed.exit_code == 137, text
    own = run_dir / "timeline" / "worker-1.json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(own.read_text())  # cut off: no closing line
    assert load_trace(own)
    events = assert_chrome_trace(run_dir / "timeline.json")
    # What it flushed before dying is there: its 5 steps' all-reduces, after the variables'
    # set-up; the 2 buffered steps are lost.
    names = collective_names(events, "worker:1")
    assert [n for n in names if n.startswith("all_reduce")][:5] == \
        [f"all_reduce_many #{i} (1 tensors)" for i in range(5)], names
    _, steps = load_steps(run_dir / "steps" / "worker-1.jsonl")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    row = next(t for t in status.collect(run_dir).tasks if t.task == "worker:1")
    assert (row.state, row.exit_code, row.last_step) == ("failed", 137, 5)


# -- a run that is still going --------------------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_status_of_a_running_run_then_of_the_finished_one(tmp_path, marker, monkeypatch,
                                                             capsys):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # `status`'s default run
    monkeypatch.chdir(tmp_path)  # ... after ./runs, which a developer's checkout may have
    hold = tmp_path / "hold.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(hold))
    server.listen(len(TASKS))
    server.settimeout(120)
    run_dir = tmp_path / "run"
    path = cluster_file(tmp_path, marker, SCRIPT, ["--steps", "4", "--hold", str(hold)],
                        timeline=False)
    outcome: dict = {}
    thread = threading.Thread(
        target=lambda: outcome.update(zip(("result", "text"), launch(path, run_dir),
                                          strict=True)))
    thread.start()
    held = []
    try:
        for _ in TASKS:  # each task connects once its 4 steps are written
            held.append(server.accept()[0])
        run = status.collect(run_dir)
        assert run.state == "running"
        assert [(t.task, t.state, t.exit_code, t.last_step) for t in run.tasks] == \
            [(task, "running", None, 4) for task in TASKS]
        assert cli.main(["status"]) == 0  # the newest run by default
        table = capsys.readouterr().out
        assert "run run: running" in table
        assert sum(" running " in line for line in table.splitlines()) == 3, table
    finally:
        for conn in held:
            conn.close()  # lets the tasks finish
        thread.join(150)
        server.close()
    assert not thread.is_alive()
    assert outcome["result"].exit_code == 0, outcome["text"]
    assert not (run_dir / "timeline.json").exists()  # timeline: false
    run = status.collect(run_dir)
    assert run.state == "succeeded"
    assert [(t.state, t.exit_code, t.last_step) for t in run.tasks] == [("succeeded", 0, 4)] * 3


def test_status_of_a_missing_run_dir_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no ./runs here
    assert cli.main(["status", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "empty-state"))
    assert cli.main(["status"]) == 2
    assert "no run to show" in capsys.readouterr().err
