"""Closing channels within a deadline: a close that never returns (as ``grpc.Channel.close()``
can, waiting for calls whose end is never delivered) costs the caller its deadline, no more."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest

from cluster.deadline import Deadline
from cluster.transport._closing import close_channels
from cluster.transport.server import TaskServer

from .conftest import TOKEN

pytestmark = pytest.mark.timeout(30)


class _StuckChannel:
    """Stands in for a channel whose close waits for good (until the test releases it)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def close(self) -> None:
        self.entered.set()
        self.release.wait(20)


class _Channel:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_close_that_never_returns_costs_the_deadline_and_is_logged(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="cluster.transport._closing")
    stuck, fine = _StuckChannel(), _Channel()
    started = time.monotonic()
    try:
        assert close_channels([stuck, fine], Deadline.after(0.3), what="test channel") is False
        took = time.monotonic() - started
    finally:
        stuck.release.set()
    assert 0.3 <= took < 1.5, took
    assert stuck.entered.is_set() and fine.closed  # every close was started, at once
    assert "1 test channel(s) still closing at the deadline" in caplog.text


def test_a_failing_close_is_logged_never_raised(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="cluster.transport._closing")

    class Broken:
        def close(self) -> None:
            raise RuntimeError("boom")

    assert close_channels([Broken()], Deadline.after(1.0)) is True
    assert "boom" in caplog.text


def test_real_connected_channels_close_at_once() -> None:
    with TaskServer("127.0.0.1:0", TOKEN) as server:
        server.start()
        channels = [grpc.insecure_channel(server.address) for _ in range(4)]
        futures = [grpc.channel_ready_future(c) for c in channels]
        for future in futures:
            future.result(timeout=10)
        started = time.monotonic()
        assert close_channels(channels, Deadline.after(5.0)) is True
        assert time.monotonic() - started < 1.0
