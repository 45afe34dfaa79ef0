"""Test task: one all-reduce over the collective transport, then behave as told by argv.

Usage: allreduce.py [--fail TASK] [--hang TASK|all] [--pidfile-dir DIR] [--check-token]
                    [--kill-self-first-attempt TASK] [--linger TASK] [--print-timeouts]

``--linger TASK``: that task's interpreter hangs for 60 s at exit (an exit hook that never
returns, as a library's may), so it outlasts clusterctl's grace and is killed.
"""

import argparse
import atexit
import os
import signal
import threading
import time

import numpy as np

import cluster.runtime
from cluster.collectives import CollectiveGroup, ReduceOp

parser = argparse.ArgumentParser()
parser.add_argument("--fail", default="")
parser.add_argument("--kill-self-first-attempt", default="")
parser.add_argument("--linger", default="")
parser.add_argument("--hang", default="")
parser.add_argument("--pidfile-dir", default="")
parser.add_argument("--check-token", action="store_true")
parser.add_argument("--print-timeouts", action="store_true")
args = parser.parse_args()

rt = cluster.runtime.current() or cluster.runtime.start()
if args.pidfile_dir:
    path = os.path.join(args.pidfile_dir, f"{rt.task_type}-{rt.task_id}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
group = CollectiveGroup(rt.collective_transport(), settings=rt.settings.collectives)
total = group.all_reduce(np.ones(4, np.float32), ReduceOp.SUM)
print(f"{rt.task} all_reduce -> {total.tolist()}", flush=True)
if args.check_token:
    token = os.environ.get("CLUSTER_TOKEN", "").encode()
    in_cmdline = False
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                in_cmdline = in_cmdline or (bool(token) and token in f.read())
        except OSError:
            pass
    print(f"{rt.task} token in env: {bool(token)}, in any command line: {in_cmdline}",
          flush=True)
if args.print_timeouts:  # what the task's settings took from its environment
    s = rt.settings
    print(f"{rt.task} timeouts: connect={s.connect_timeout:g} heartbeat={s.heartbeat_timeout:g} "
          f"stall={s.stall_timeout:g}", flush=True)
if rt.task == args.linger:
    atexit.register(time.sleep, 60)
if rt.task == args.fail:
    raise ValueError(f"boom from {rt.task}")
if rt.task == args.kill_self_first_attempt and os.environ.get("CLUSTER_RESTART_COUNT") == "0":
    os.kill(os.getpid(), signal.SIGKILL)
if args.hang == "all" or rt.task == args.hang:
    threading.Event().wait(120)
group.barrier()
print(f"{rt.task} done", flush=True)
