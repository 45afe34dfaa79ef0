"""Test task for `python -m worker`: prints what it sees, then does what argv says.

argv: ACTION [ARG]: exit CODE | raise | raise-when-told FIFO | wait | lock-broken-by-sigterm
"""

import sys
import threading

print(f"name={__name__} argv={sys.argv}", flush=True)
action = sys.argv[1] if len(sys.argv) > 1 else "exit"
if action == "exit":
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
if action == "raise-when-told":  # blocks until the test opens the FIFO argv[2] for writing
    open(sys.argv[2]).close()
    action = "raise"
if action == "raise":
    raise ValueError("boom from the script")
if action == "lock-broken-by-sigterm":  # what a SIGTERM inside Condition.wait can leave
    import signal

    from cluster.lifecycle import Terminated

    try:
        raise Terminated(signal.SIGTERM)
    except BaseException:
        raise RuntimeError("cannot release un-acquired lock")  # noqa: B904 (the context is the point)
if action == "wait":
    try:
        print("ready", flush=True)
        threading.Event().wait(60)
    finally:
        print("finally ran", flush=True)
