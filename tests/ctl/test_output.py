"""Console output helpers: line splitting (progress bars included) and prefixes."""

from __future__ import annotations

import io

import pytest

from cluster.ctl._output import Console, LineSplitter, is_native_log_line, use_color


def test_lines_split_across_chunks_and_flushed_at_the_end() -> None:
    s = LineSplitter()
    assert s.feed(b"a\nb") == ["a"]
    assert s.feed(b"c\n\nd") == ["bc", ""]
    assert s.flush() == ["d"]
    assert s.flush() == []


def test_carriage_return_redraws_keep_what_a_terminal_shows() -> None:
    s = LineSplitter()
    assert s.feed(b"epoch 1:  0%|   |\repoch 1: 50%|#  |\r          \repoch 1 loss 0.5\n") \
        == ["epoch 1 loss 0.5"]
    assert s.feed(b"dos line\r\n") == ["dos line"]


@pytest.mark.parametrize("line", [
    # gRPC's C core (absl), as it writes them when a peer dies or the run is stopped
    "I1128 06:48:40.287768    8148 chttp2_transport.cc:1403] ipv4:127.0.0.1:51685: Got goaway [2] "
    "err=UNAVAILABLE:GOAWAY received; Error code: 2; Debug Text: Cancelling all calls",
    "E0000 00:00:1732790000.123456   12345 ev_epoll1_linux.cc:123] assertion failed: ...",
    "I0000 00:00:1732790000.654321    4242 subchannel.cc:806] subchannel 0x55: Socket closed",
    "W1128 06:54:16.640814   16171 log.cc:102] Log level INFO is not suitable for production.",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    # gRPC's older gpr format: nanoseconds
    "E1128 06:48:40.287768123  140123 tcp_posix.cc:680] recvmsg: Connection reset by peer",
    "F1128 06:48:40.287768 99 ring_hash.h:7] a header",
])
def test_native_log_lines_are_recognised_by_their_prefix(line) -> None:
    assert is_native_log_line(line)


@pytest.mark.parametrize("line", [
    "I1128 06:48:40.287768   140 train.py:12] absl-py logging: the user's own log",
    "ERROR cluster.task_runtime: chief:0: worker:1 failed: ValueError: the bug",
    "Traceback (most recent call last):",
    "epoch 1 loss 0.5: Got goaway from the data loader",  # the words alone are not the format
    "  I1128 06:48:40.287768 8148 chttp2_transport.cc:1403] indented: not at the start",
    "I1128 06:48:40 8148 chttp2_transport.cc:1403] no fraction of a second",
    "",
])
def test_other_lines_are_not_native_log_lines(line) -> None:
    assert not is_native_log_line(line)


def test_prefixes_and_colour() -> None:
    out = io.StringIO()
    console = Console(out, color=False, tasks=["worker:0", "worker:10", "clusterctl"])
    console.task_line("worker:0", "hello")
    console.info("two\nlines")
    assert out.getvalue().splitlines() == [
        "[worker:0]   hello", "[clusterctl] two", "[clusterctl] lines"]
    colored = io.StringIO()
    Console(colored, color=True, tasks=["worker:0"]).task_line("worker:0", "x")
    assert colored.getvalue().startswith("\033[36m[worker:0]")
    assert not use_color(io.StringIO(), "auto")
    assert use_color(io.StringIO(), "always")
