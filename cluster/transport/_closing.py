"""Closing gRPC channels within a deadline.

``grpc.Channel.close()`` cancels the channel's calls and then waits, without any limit, until
its polling thread has seen every one of them end; a call whose end is never delivered (seen
after SIGTERM, about once in ten runs) keeps the closing thread there for good. Teardown must
stay bounded (a task stopping, a group re-forming), so the close runs in a daemon thread that
the caller waits for at most until its deadline: past it, the channel is left to finish
closing on its own (it holds nothing this process still needs) and a DEBUG line says which.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import grpc

from cluster.deadline import Deadline

__all__ = ["CLOSE_TIMEOUT", "close_channels"]

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 1.0
"""Seconds a close without a deadline of its own waits for its channels."""


def close_channels(channels: Iterable[grpc.Channel], deadline: Deadline | None = None, *,
                   what: str = "channel") -> bool:
    """Close every channel of ``channels`` at once, waiting until ``deadline`` at most (default
    :data:`CLOSE_TIMEOUT` from now); True when all closed in time. Never raises: a close that
    fails, or overruns, is logged at DEBUG naming ``what``."""
    deadline = deadline or Deadline.after(CLOSE_TIMEOUT)
    threads = []
    for channel in channels:
        thread = threading.Thread(target=_close, args=(channel, what), name=f"close-{what}",
                                  daemon=True)
        thread.start()
        threads.append(thread)
    late = 0
    for thread in threads:
        thread.join(deadline.timeout())
        late += thread.is_alive()
    if late:
        log.debug("%d %s(s) still closing at the deadline: left to finish on their own", late,
                  what)
    return not late


def _close(channel: grpc.Channel, what: str) -> None:
    try:
        channel.close()
    except Exception as e:  # a teardown step never raises; the channel is dropped either way
        log.debug("closing a %s failed: %r", what, e)
