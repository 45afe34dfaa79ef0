"""A two-rank group on the gRPC data plane in one process, the victim of hostile-stream tests.

``python -m tests.transport._grpc_victim`` prints ``address ADDRESS`` (rank 0's server) and
``ready``, then on each SIGUSR1 rank 1 sends rank 0 a 1 MiB message in four frames and rank 0
receives it: ``roundtrip ok`` or ``roundtrip failed: ERROR``. Exits when no signal came for 60 s.
"""

from __future__ import annotations

import signal

from cluster.deadline import Deadline
from cluster.errors import ClusterError
from cluster.transport.api import MessageKey
from tests.transport.conftest import NetworkGroup


def main() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # for sigtimedwait, every thread
    group = NetworkGroup(2, data_plane="grpc", max_frame_bytes=256 << 10)
    a, b = group.transports
    print("address", group.servers[0].address, flush=True)
    print("ready", flush=True)
    payload = bytes(range(256)) * 4096
    try:
        seq = 0
        while signal.sigtimedwait({signal.SIGUSR1}, 60) is not None:
            seq += 1
            key = MessageKey("victim", seq, 0)
            try:
                b.send(0, key, payload, deadline=Deadline.after(10))
                got = bytes(a.recv(1, key, deadline=Deadline.after(10)).payload)
                print("roundtrip ok" if got == payload else "roundtrip failed: bytes differ",
                      flush=True)
            except ClusterError as e:
                print(f"roundtrip failed: {type(e).__name__}: {e}", flush=True)
    finally:
        group.close()


if __name__ == "__main__":
    main()
