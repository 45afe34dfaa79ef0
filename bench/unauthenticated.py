"""What callers without the token cost a task: RSS growth of a real serving ``python -m worker``
under floods of unauthenticated requests, one run.

    uv run python bench/unauthenticated.py                       # the rows below, ~1 min
    uv run python bench/unauthenticated.py --rows 64M:32:1,1M:1:500

Each row ``SIZE:CONNECTIONS:CALLS`` opens CONNECTIONS channels and starts CALLS concurrent calls
on each, every one carrying SIZE bytes with no token (half) or a wrong one, to real methods of
every cardinality and to one that does not exist. The victim is a fresh task per row, under
``prlimit --data`` (1 GiB) so a working attack could not endanger the machine. Columns: the
victim's RSS before, its peak growth (VmHWM - RSS before) and RSS growth after the flood, the
answers, and the flood's duration.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.testing import TaskProcess, loopback_cluster, tf_config  # noqa: E402

TOKEN = "bench-secret"
METHODS = ["/cluster_runtime.v1.Worker/Run", "/cluster_runtime.v1.Control/Check",
           "/cluster_runtime.v1.Collective/Exchange", "/no.such.Service/Method"]


def _mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def row(size: str, connections: int, calls: int) -> str:
    cluster = loopback_cluster(worker=1)
    address = cluster["worker"][0]
    argv = ["prlimit", f"--data={1 << 30}", sys.executable, "-m", "worker"]
    with TaskProcess(argv, name="victim", tf_config=tf_config(cluster, "worker", 0),
                     env={"CLUSTER_TOKEN": TOKEN}) as victim:
        good = (("authorization", f"Bearer {TOKEN}"),)
        probe = grpc.insecure_channel(address)
        probe.unary_unary(METHODS[1])(b"", timeout=60, metadata=good, wait_for_ready=True)
        before = _mib(victim.pid, "VmRSS")
        body = b"\xff" * _size(size)
        channels = [grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)])
                    for _ in range(connections)]
        started = time.monotonic()
        futures = [c.unary_unary(METHODS[i % len(METHODS)]).future(
            body, timeout=120, metadata=None if i % 2 else (("authorization", "Bearer x"),))
            for c in channels for i in range(calls)]
        answers: dict[str, int] = {}
        for f in futures:
            error = f.exception()
            name = error.code().name if error is not None else "OK"
            answers[name] = answers.get(name, 0) + 1
        took = time.monotonic() - started
        if victim.returncode is not None:  # killed by its memory limit
            return (f"| {size} x {connections} conn x {calls} | {before:.0f} MiB | victim died "
                    f"(exit {victim.returncode}) | | {answers} | {took:.1f} s |")
        peak = _mib(victim.pid, "VmHWM") - before
        after = _mib(victim.pid, "VmRSS") - before
        probe.unary_unary(METHODS[1])(b"", timeout=10, metadata=good)  # still serving
        for c in [*channels, probe]:
            c.close()
    return (f"| {size} x {connections} conn x {calls} | {before:.0f} MiB | +{peak:.1f} MiB | "
            f"+{after:.1f} MiB | {', '.join(f'{k} {v}' for k, v in answers.items())} | "
            f"{took:.1f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16M:16:1,64M:32:1,64M:4:50,1M:1:500,10K:400:1")
    args = parser.parse_args()
    print("| flood | RSS before | peak growth | growth after | answers | took |")
    print("|---|---|---|---|---|---|")
    for spec in args.rows.split(","):
        size, connections, calls = spec.split(":")
        print(row(size, int(connections), int(calls)), flush=True)


if __name__ == "__main__":
    main()
