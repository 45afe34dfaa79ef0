"""Test task: says it is running, then waits (at most 60 s) until it is stopped."""

import threading

print("running", flush=True)
threading.Event().wait(60)
