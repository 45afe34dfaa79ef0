"""tools/thread_states.py: it tells a thread on a CPU from one asleep, and names the sleep."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import thread_states  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc: Linux only")

# One thread spins on the CPU, one waits on a lock nobody releases, the main thread sleeps.
_CHILD = textwrap.dedent("""
    import sys, threading, time
    held = threading.Lock(); held.acquire()
    def spin():
        end = time.monotonic() + 30
        while time.monotonic() < end:
            pass
    threading.Thread(target=spin, daemon=True).start()
    threading.Thread(target=lambda: held.acquire(timeout=30), daemon=True).start()
    print("ready", flush=True)
    time.sleep(30)
""")


def test_parse_stat_takes_the_name_up_to_the_last_parenthesis() -> None:
    assert thread_states.parse_stat("12 (a (b) c) S 1 12") == ("a (b) c", "S")


def test_the_sleep_site_skips_the_generic_frames() -> None:
    stack = ("[<0>] futex_wait_queue+0x60/0x90\n[<0>] futex_wait+0x17d/0x260\n"
             "[<0>] do_syscall_64+0x71/0x290\n")
    assert thread_states.sleep_site(stack, "futex_wait_queue") == "futex_wait_queue"
    assert thread_states.sleep_site("[<0>] __schedule+0x1/0x2\n", "pipe_read") == "pipe_read"
    assert thread_states.sleep_site("", "0") == "?"


def test_a_spinning_thread_runs_and_a_waiting_one_sleeps_in_a_futex() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        _until_two_sleep(child.pid)
        tallies: dict[thread_states.Thread, thread_states.Tally] = {}
        for _ in range(50):
            thread_states.sample([child.pid], tallies)
        mine = {tid: t for (pid, tid, _), t in tallies.items() if pid == child.pid}
        assert len(mine) == 3
        ranked = sorted(mine.values(), key=lambda t: t.running)
        spinner, waiters = ranked[-1], ranked[:-1]
        # The spinner shares 2 cores with this sampler and the suite: on a CPU most samples.
        assert spinner.running >= spinner.samples / 2
        for t in waiters:
            assert t.running <= t.samples / 5
            site, _ = t.sites.most_common(1)[0]
            assert site.startswith("S ")
        sites = " ".join(site for t in waiters for site in t.sites)
        assert "futex" in sites or "?" in sites  # the lock waiter, where the kernel names it
        text = thread_states.report(tallies)
        assert f"{child.pid}/" in text and "working thread(s)" in text
    finally:
        child.kill()
        child.wait(10)


def test_the_command_line_samples_a_matching_process_and_fails_without_one() -> None:
    tool = [sys.executable, str(REPO / "tools" / "thread_states.py")]
    missing = subprocess.run([*tool, "--match", "no-such-process-a7c1", "--seconds", "0.1"],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1 and "no process matches" in missing.stderr
    bad = subprocess.run([*tool, "--pid", "1", "--seconds", "0"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 2 and "--seconds" in bad.stderr
    child = subprocess.Popen([sys.executable, "-c", _CHILD, "thread-states-probe"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        out = subprocess.run([*tool, "--match", "thread-states-probe", "--seconds", "0.5"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert f"| {child.pid}/" in out.stdout and "1 process(es)" in out.stdout
    finally:
        child.kill()
        child.wait(10)


def _until_two_sleep(pid: int, within: float = 20.0) -> None:
    """Wait (against a deadline) until two of ``pid``'s threads sleep: "ready" is printed before
    the main thread reaches its sleep, and on loaded cores a thread may stay runnable, waiting
    for a CPU or the spinner's GIL, for longer than the 50 samples take."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append(thread_states.parse_stat((task / "stat").read_text())[1])
            except OSError:  # a thread that ended meanwhile
                continue
        if states.count("S") >= 2:
            return
        time.sleep(0.01)
    pytest.fail(f"the waiting threads of {pid} never slept within {within} s")
