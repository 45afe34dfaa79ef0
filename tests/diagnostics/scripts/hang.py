"""Test task: says it is ready, then waits in ``wait_here_forever`` until it is stopped."""

import threading

import cluster.runtime


def wait_here_forever() -> None:
    threading.Event().wait(300)


rt = cluster.runtime.current() or cluster.runtime.start()
print(f"{rt.task} ready", flush=True)
wait_here_forever()
