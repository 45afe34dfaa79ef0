"""``bench/_threads.py``: per-thread CPU time of this process, and its busiest thread."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from bench import _threads
from bench._threads import Snapshot, busiest, cpu_between, snapshot, thread_name

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="per-thread CPU time is read from Linux's /proc")

SPIN_S = 0.05


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds  # this thread's own CPU time: spins ~seconds on a CPU
    while time.thread_time() < end:
        pass


@linux_only
def test_a_thread_that_burns_cpu_is_the_busiest():
    go, done, leave = threading.Event(), threading.Event(), threading.Event()

    def burner() -> None:
        go.wait(10)
        _spin(SPIN_S)
        done.set()
        leave.wait(10)  # alive when `after` is taken: a thread that is gone has no figure

    thread = threading.Thread(target=burner, name="burner", daemon=True)
    thread.start()
    try:
        before = snapshot()
        go.set()
        assert done.wait(10)
        after = snapshot()
        cpu = cpu_between(before, after)
        top = busiest(cpu)  # named while it runs
    finally:
        leave.set()
        thread.join(10)
    assert top is not None
    assert (top.tid, top.name) == (thread.native_id, "burner")
    assert SPIN_S * 1e9 <= top.ns < SPIN_S * 1e9 + 20e6  # the spin and a little more
    assert cpu[threading.get_native_id()] < top.ns / 2  # the caller only waited


@linux_only
def test_a_thread_that_started_in_between_counts_from_zero():
    done, leave = threading.Event(), threading.Event()

    def burner() -> None:
        _spin(SPIN_S)
        done.set()
        leave.wait(10)

    before = snapshot()
    thread = threading.Thread(target=burner, name="late burner", daemon=True)
    thread.start()
    try:
        assert done.wait(10)
        after = snapshot()
    finally:
        leave.set()
        thread.join(10)
    assert thread.native_id not in before.ns
    assert SPIN_S * 1e9 <= cpu_between(before, after)[thread.native_id] < SPIN_S * 1e9 + 20e6


@linux_only
def test_the_snapshots_own_cost_is_left_out():
    main = threading.get_native_id()
    before = snapshot()
    after = snapshot()
    assert before.caller == after.caller == main
    assert before.caller_end >= before.ns[main]
    # Between the end of one snapshot and the start of the next the caller did nothing.
    assert cpu_between(before, after)[main] < 1_000_000


def test_cpu_between_counts_new_threads_from_zero_and_leaves_vanished_ones_out():
    before = Snapshot(ns={1: 100, 2: 500, 3: 7}, caller=1, caller_end=160)
    after = Snapshot(ns={1: 1000, 2: 900, 4: 50}, caller=1, caller_end=1400)
    # 1 took both: from the end of `before` (160) to the start of `after` (1000); 3 is gone.
    assert cpu_between(before, after) == {1: 840, 2: 400, 4: 50}
    assert busiest({1: 840, 2: 400, 4: 50}).ns == 840


@linux_only
def test_threads_are_named_by_python_or_by_the_kernel():
    assert thread_name(threading.get_native_id()) == threading.current_thread().name
    assert thread_name(2**22 + 12345) == f"tid {2**22 + 12345}"  # above pid_max's default
    assert busiest({}) is None


def test_elsewhere_than_linux_there_is_no_snapshot(monkeypatch):
    monkeypatch.setattr(_threads.sys, "platform", "darwin")
    assert snapshot() is None


@linux_only
def test_without_proc_there_is_no_snapshot(monkeypatch, tmp_path):
    monkeypatch.setattr(_threads, "TASKS", tmp_path / "absent")
    assert snapshot() is None
