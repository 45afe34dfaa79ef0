"""Where the threads of running processes spend their time: on a CPU, or asleep and on what.

A thread whose busiest-thread CPU time is far below the call's wall time is waiting on
something; the CPU clocks cannot say what. This samples every thread of the processes whose
command line contains ``--match`` (or of ``--pid``), ``--hz`` times a second for ``--seconds``,
reading each thread's scheduler state from ``/proc/PID/task/TID/stat`` and, for a sleeping one,
the kernel function it sleeps in (``/proc/PID/task/TID/wchan``; with root, the first frame of
``stack`` that is not the generic sleep or syscall machinery). It prints, per thread (``pid/tid``
and the kernel's name for it: Python before 3.14 names every thread after the process), the
share of samples it was running and the sleep sites that took most of the rest, busiest first,
then the sleep sites of the working threads (those running in at least a tenth of their
samples) summed: where the threads that should be copying wait.

    python tools/thread_states.py --match spawn_main --seconds 5      # e.g. the ranks of a bench

Linux only, no dependency beyond the standard library: it runs on a lent machine as it is.
Sampling costs the sampler's own core, not the sampled threads'.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")

# Frames of a kernel stack that say only "asleep" or "in a system call"; the first other
# frame names what the thread waits on.
_GENERIC = ("schedule", "__schedule", "do_syscall_64", "entry_SYSCALL", "__x64_sys_",
            "x64_sys_call", "io_schedule", "preempt_schedule", "exit_to_user_mode",
            "syscall_exit_to_user_mode", "hrtimer_nanosleep", "do_nanosleep")


@dataclass
class Tally:
    """Samples of one thread: how many, how many running, and where the others slept."""

    samples: int = 0
    running: int = 0
    sites: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, state: str, site: str) -> None:
        self.samples += 1
        if state == "R":
            self.running += 1
        else:
            self.sites[f"{state} {site}"] += 1


def matching_pids(pattern: str) -> list[int]:
    """Processes whose command line contains ``pattern``, but not this tool's (nor a launcher's
    running it, such as ``uv run``: their command lines hold the pattern as an argument)."""
    me = os.getpid()
    pids = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                "utf-8", "replace")
        except OSError:
            continue  # gone, or not ours to read
        if pattern in cmdline and "thread_states.py" not in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def parse_stat(text: str) -> tuple[str, str]:
    """``(name, state)`` from a ``stat`` line; the name (in parentheses) may hold spaces and
    parentheses, so it ends at the last ``)``."""
    open_at, close_at = text.index("("), text.rindex(")")
    return text[open_at + 1 : close_at], text[close_at + 2 : close_at + 3]


def sleep_site(stack: str, wchan: str) -> str:
    """The kernel function a sleeping thread waits in: the first non-generic frame of its
    ``stack`` (``[<0>] name+0x1/0x2`` lines), else its ``wchan``, else ``?``."""
    for line in stack.splitlines():
        frame = line.split("] ", 1)[-1].split("+", 1)[0].strip()
        if frame and not frame.startswith(_GENERIC):
            return frame
    return wchan.strip() if wchan.strip() not in ("", "0") else "?"


Thread = tuple[int, int, str]
"""``(pid, tid, kernel name)``."""


def sample(pids: list[int], tallies: dict[Thread, Tally]) -> None:
    """One sample of every thread of ``pids`` into ``tallies`` (threads that ended are
    skipped)."""
    for pid in pids:
        try:
            tids = os.listdir(PROC / str(pid) / "task")
        except OSError:
            continue
        for tid in tids:
            task = PROC / str(pid) / "task" / tid
            try:
                name, state = parse_stat((task / "stat").read_text())
                site = ""
                if state != "R":
                    try:
                        stack = (task / "stack").read_text()
                    except OSError:  # not root, or no CONFIG_STACKTRACE
                        stack = ""
                    site = sleep_site(stack, (task / "wchan").read_text())
            except (OSError, ValueError):
                continue
            tallies.setdefault((pid, int(tid), name), Tally()).add(state, site)


def report(tallies: dict[Thread, Tally], top: int = 3, rows: int = 24) -> str:
    """Markdown: the ``rows`` busiest threads (samples, % running, the ``top`` sleep sites),
    then the sleep sites of every working thread (running in >= 10% of its samples) summed."""
    lines = ["| thread | samples | running | asleep in (share of its samples) |",
             "|---|---|---|---|"]
    ranked = sorted(tallies.items(), key=lambda kv: -kv[1].running / kv[1].samples)
    for (pid, tid, name), t in ranked[:rows]:
        sites = ", ".join(f"{site} {100 * n / t.samples:.0f}%"
                          for site, n in t.sites.most_common(top))
        lines.append(f"| {pid}/{tid} {name} | {t.samples} | {100 * t.running / t.samples:.0f}% "
                     f"| {sites} |")
    working = [t for t in tallies.values() if t.running >= t.samples / 10]
    total = sum(t.samples for t in working)
    if total:
        summed: collections.Counter[str] = collections.Counter()
        for t in working:
            summed.update(t.sites)
        running = sum(t.running for t in working)
        lines += ["", f"{len(working)} working thread(s): running {100 * running / total:.0f}% "
                  "of their samples; asleep in " + ", ".join(
                      f"{site} {100 * n / total:.0f}%" for site, n in summed.most_common(6))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--match", help="sample processes whose command line contains this")
    who.add_argument("--pid", type=int, action="append", help="sample this process (repeatable)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long (default 5)")
    parser.add_argument("--hz", type=float, default=200.0, help="samples per second (200)")
    parser.add_argument("--wait", type=float, default=0.0,
                        help="with --match, wait up to this long for a match (default 0)")
    parser.add_argument("--after", type=float, default=0.0,
                        help="begin sampling this long after the processes are found (their "
                             "start-up is not what is asked about; default 0)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.hz <= 0 or args.after < 0 or args.wait < 0:
        parser.error("--seconds and --hz must be positive, --after and --wait not negative")
    if sys.platform != "linux":
        print("thread_states.py: Linux only (it reads /proc)", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.wait
    pids = args.pid or matching_pids(args.match)
    while not pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = matching_pids(args.match)
    if not pids:
        print(f"thread_states.py: no process matches {args.match!r}", file=sys.stderr)
        return 1
    if args.after:
        time.sleep(args.after)
        if args.match:  # all of them by now: a group's processes start one after another
            pids = matching_pids(args.match)
    tallies: dict[Thread, Tally] = {}
    period, end = 1.0 / args.hz, time.monotonic() + args.seconds
    while time.monotonic() < end:
        sample(pids, tallies)
        time.sleep(period)
    print(f"{len(pids)} process(es), {args.seconds:g} s at {args.hz:g} Hz, "
          f"{os.cpu_count()} cores")
    print(report(tallies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
