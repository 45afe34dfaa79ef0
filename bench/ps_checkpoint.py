"""Parameter-server checkpoint designs, measured side by side in one run.

    sudo uv run python bench/ps_checkpoint.py                 # 256 MiB over 1 and 2 ps tasks
    uv run python bench/ps_checkpoint.py --size 64M --ps 2 --runs 3

Rows, for the same bytes of float32 variables split evenly over ``P`` ps tasks:

- ``coordinator pulls, writes one checkpoint`` (what ``cluster.checkpoint`` does): a real
  ``mode: coordinator`` cluster launched with ``clusterctl`` (chief, 1 worker, ``P`` real
  ``python -m ps``); the chief times ``manager.save`` (one concurrent pull per ps task, then the
  streamed, checksummed, fsynced, atomically renamed checkpoint).
- ``each ps writes its shards (I/O floor)``: the alternative design's I/O alone: ``P`` fresh
  processes, each holding its shard in memory, write it to a file of their own in the same
  directory with sha256 and fsync, concurrently; the time is the slowest one. It leaves out
  what that design would add (the RPC telling each ps to write, a cross-task commit so a kill
  cannot leave a mix of old and new shards, re-sharding on restore), so it is a lower bound.
- ``one process writes the bytes (disk floor)``: the same total bytes written by one process
  with sha256 and fsync: the disk's speed for this much data.

GB/s = 1e9 bytes / s; medians of ``--runs``. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.allreduce import fmt_size, parse_size  # noqa: E402

_WRITER = """
import hashlib, os, sys, time
import numpy as np
path, nbytes, go = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
data = np.random.default_rng(0).random(nbytes // 4, np.float32)
view = memoryview(data).cast("B")
while time.time() < go:
    time.sleep(0.001)
started = time.perf_counter()
digest = hashlib.sha256()
with open(path, "wb") as f:
    for i in range(0, len(view), 16 << 20):
        piece = view[i:i + (16 << 20)]
        digest.update(piece)
        f.write(piece)
    f.flush()
    os.fsync(f.fileno())
print(time.perf_counter() - started, flush=True)
"""


def parallel_writers(directory: str, total: int, writers: int) -> float:
    """Seconds until the slowest of ``writers`` processes wrote ``total / writers`` bytes."""
    go = time.time() + 2.0  # every process has allocated its shard before the clock starts
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER,
                               os.path.join(directory, f"shard-{i}"), str(total // writers),
                               str(go)], stdout=subprocess.PIPE, text=True)
             for i in range(writers)]
    times = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"writer exited {proc.returncode}")
        times.append(float(out.strip()))
    for i in range(writers):
        os.unlink(os.path.join(directory, f"shard-{i}"))
    return max(times)


def coordinator_save(directory: str, total: int, ps: int, runs: int) -> list[float]:
    from cluster.ctl import launcher
    from cluster.ctl.spec import parse_cluster_file

    chief = REPO / "bench" / "_ps_ckpt_chief.py"
    text = (f"name: ps-ckpt-bench\nmode: coordinator\nentrypoint: {chief}\n"
            f"args: ['--dir', {os.path.join(directory, 'ckpt')!r}, '--bytes', '{total}', "
            f"'--runs', '{runs}']\n"
            f"cluster: {{chief: 1, worker: 1, ps: {ps}}}\n"
            f"env: {{OMP_NUM_THREADS: '1'}}\nlog_dir: {os.path.join(directory, 'runs')}\n"
            "timeouts: {startup: 60, grace: 5, run: 900}\n")
    path = Path(directory) / "cluster.yaml"
    path.write_text(text)
    console = io.StringIO()
    result = launcher.launch(parse_cluster_file(text, path), out=console, color="never")
    out = console.getvalue()
    if result.exit_code != 0:
        raise RuntimeError(f"the benchmark cluster failed:\n{out}")
    line = next(line for line in out.splitlines() if "RESULT " in line)
    return json.loads(line.split("RESULT ", 1)[1])["times"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256M")
    parser.add_argument("--ps", default="1,2", help="comma-separated ps task counts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)
    total = parse_size(args.size)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for ps in (int(p) for p in args.ps.split(",")):
            saves = coordinator_save(directory, total, ps, args.runs)
            shards = [parallel_writers(directory, total, ps) for _ in range(args.runs)]
            rows.append((ps, "coordinator pulls, writes one checkpoint", statistics.median(saves)))
            rows.append((ps, "each ps writes its shards (I/O floor)", statistics.median(shards)))
        disk = statistics.median(parallel_writers(directory, total, 1) for _ in range(args.runs))
    print(f"\n{fmt_size(total)} of float32 variables, {os.cpu_count()} cores, medians of "
          f"{args.runs}, load average {os.getloadavg()[0]:.1f}\n")
    print("| ps tasks | design | save s | GB/s | x disk floor |")
    print("|---|---|---|---|---|")
    for ps, design, seconds in rows:
        print(f"| {ps} | {design} | {seconds:.3f} | {total / seconds / 1e9:.2f} | "
              f"{disk / seconds:.2f} |")
    print(f"| - | one process writes the bytes (disk floor) | {disk:.3f} | "
          f"{total / disk / 1e9:.2f} | 1.00 |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
