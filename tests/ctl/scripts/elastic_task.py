"""Test task for elastic runs: plain Python, no collectives (the supervisor is what is tested).

Every start appends this process's pid to ``OUT/pids-TASK`` (``TASK`` as ``worker-1``). A victim
(``--victims worker:1,worker:2``) kills itself with SIGKILL on its first start (a marker file
says it did), once every victim is ready, so that they die together; started again, it writes
``OUT/back-TASK``. Every task then waits (at most 30 s) until each victim is back and exits 0
(exit 3 if one is not). With ``--always`` the victims kill themselves on every start, and the
others wait instead until clusterctl has given up on one (its ``membership.jsonl`` in
``CLUSTER_RUN_DIR`` says so). The runtime's peer-failure interrupt (SIGUSR1) is ignored: these
tasks do not train together, they only outlive a peer.

Usage: elastic_task.py OUT --victims TASK[,TASK...] [--always]
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

signal.signal(signal.SIGUSR1, signal.SIG_IGN)
out = Path(sys.argv[1])
victims = sys.argv[sys.argv.index("--victims") + 1].split(",")
always = "--always" in sys.argv
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}:{task['index']}"


def slug(task: str) -> str:
    return task.replace(":", "-")


def given_up() -> bool:
    path = Path(os.environ["CLUSTER_RUN_DIR"]) / "membership.jsonl"
    return path.exists() and '"given-up"' in path.read_text()


def wait_for(paths: list[Path], seconds: float, done=None) -> bool:
    end = time.monotonic() + seconds
    while not (done() if done else all(p.exists() for p in paths)):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


with open(out / f"pids-{slug(name)}", "a") as f:
    f.write(f"{os.getpid()} {os.environ.get('CLUSTER_ELASTIC', '')}\n")
if name in victims:
    marker = out / f"killed-{slug(name)}"
    if always or not marker.exists():
        marker.touch()
        (out / f"ready-{slug(name)}").touch()
        wait_for([out / f"ready-{slug(v)}" for v in victims], 30)
        os.kill(os.getpid(), signal.SIGKILL)
    (out / f"back-{slug(name)}").touch()
    print(f"{name} is back", flush=True)
if not wait_for([out / f"back-{slug(v)}" for v in victims], 30, given_up if always else None):
    print(f"{name}: the victims did not come back", flush=True)
    sys.exit(3)
print(f"{name} done", flush=True)
