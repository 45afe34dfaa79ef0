"""``bench/allreduce.py``'s columns: one per path, forced algorithm and forced lanes, named by
what varies; ``--lanes`` reaching the network paths' rank processes; the busiest thread's CPU
time counted over the timed all-reduces only."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from bench import allreduce


def test_columns_are_named_by_what_varies():
    one = allreduce.column_names(["shm", "tcp"], ["auto"], ["auto"])
    assert one == {("shm", "auto", "auto"): "shm", ("tcp", "auto", "auto"): "tcp"}
    lanes = allreduce.column_names(["shm", "tcp", "threads"], ["auto"], ["auto", "1", "2"])
    assert list(lanes.values()) == ["shm", "tcp/auto lanes", "tcp/1 lane", "tcp/2 lanes",
                                    "threads"]
    both = allreduce.column_names(["grpc", "threads"], ["ring", "tree"], ["auto", "1"])
    assert list(both.values()) == ["grpc/ring/auto lanes", "grpc/ring/1 lane",
                                   "grpc/tree/auto lanes", "grpc/tree/1 lane", "threads/ring",
                                   "threads/tree"]
    assert list(both)[1] == ("grpc", "ring", "1")


@pytest.mark.parametrize(("argv", "message"), [
    (["--lanes", "auto,3"], "--lanes: one of auto, 1, 2"),
    (["--algorithms", "ring,fast"], "--algorithms: one of auto, ring, doubling, tree"),
    (["--paths", "shm,udp"], "--paths: unknown ['udp']"),
])
def test_bad_options_are_refused_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        allreduce.main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and "machine:" not in captured.out


def test_lanes_reach_the_network_paths_rank_processes(monkeypatch):
    envs = []
    rank_result = {"times": {4096: [(0.001, 0.002), (0.003, 0.004)]},
                   "threads": {4096: ("MainThread", 0.0005)}}

    def fake_run_group(fn, n, *, args, env, **kwargs):
        envs.append(env)
        results = [rank_result, {**rank_result, "threads": {4096: ("receiver", 0.0007)}}]
        return [SimpleNamespace(ok=True, rank=r, result=results[r], traceback=None)
                for r in range(n)]

    monkeypatch.setattr(allreduce, "run_group", fake_run_group)
    monkeypatch.setenv("CLUSTER_RING_LANES", "2")  # this shell's value must not reach them
    timed = allreduce.bench_ours(2, [4096], 2, 0, "auto", "tcp", "ring", "1")
    allreduce.bench_ours(2, [4096], 2, 0, "auto", "grpc", "auto", "auto")
    allreduce.bench_ours(2, [4096], 2, 0, "auto", "shm")
    assert [e.get("CLUSTER_RING_LANES") for e in envs] == ["1", "auto", None]
    assert envs[0]["CLUSTER_COLLECTIVE_ALGORITHM"] == "ring"
    # Medians of the slowest rank's wall (1, 3 ms) and of the ranks' CPU summed (4, 8 ms); the
    # busiest thread of any rank.
    assert timed[4096] == pytest.approx((0.002, 0.006, 0.0007, "receiver"))


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _SpinningGroup:
    """A one-rank group whose barrier and all-reduce each burn CPU on the calling thread."""

    def barrier(self) -> None:
        _spin(0.02)

    def all_reduce(self, value, op):
        _spin(0.01)
        return np.ones_like(value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads are read from /proc")
def test_the_thread_meter_counts_the_timed_all_reduces_only():
    meter = allreduce.ThreadMeter(_SpinningGroup(), warmup=1)
    timed = allreduce.time_all_reduce_cpu(meter, [4096], 2, 1, 1.0)
    meter.close()
    assert len(timed[4096]) == 2
    # Two timed all-reduces of 10 ms each; the warm-up and the three 20 ms barriers left out.
    assert 20e6 <= meter.cpu[threading.get_native_id()] < 28e6
    name, seconds = allreduce.busiest_per_iteration(meter.cpu, 2)
    assert name == threading.current_thread().name and 0.01 <= seconds < 0.014


def test_the_hosts_column_is_compared_with_gloo_on_the_same_hosts():
    ours = {("tcp", "auto", "auto"): {4096: allreduce.Medians(0.002)},
            ("netns2", "auto", "auto"): {4096: allreduce.Medians(0.004)},
            ("gloo-netns2", "auto", "auto"): {4096: allreduce.Medians(0.012)}}
    loopback = 0.003
    assert allreduce._reference(("tcp", "auto", "auto"), 4096, loopback, ours) == loopback
    assert allreduce._reference(("netns2", "auto", "auto"), 4096, loopback, ours) == 0.012
    assert allreduce._reference(("gloo-netns2", "auto", "auto"), 4096, loopback, ours) is None
    ours[("gloo-netns2", "auto", "auto")] = None  # gloo failed there: no ratio, not loopback's
    assert allreduce._reference(("netns2", "auto", "auto"), 4096, loopback, ours) is None


@pytest.mark.timeout(180)
def test_gloo_runs_on_emulated_hosts_in_the_layout_ours_does(monkeypatch):
    from cluster.testing import netns
    from tests._requires import require

    require("torch")
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(reason)
    from bench._netns_hosts import bench_netns_gloo, layout

    assert layout(4, 2) == {"h1": ["chief:0", "worker:0"], "h2": ["worker:1", "worker:2"]}
    made = []

    class Recorded(netns.NetnsCluster):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(netns, "NetnsCluster", Recorded)
    ranks = bench_netns_gloo(2, 2, [4096, 1 << 20], iters=2, warmup=1)
    assert len(ranks) == 2
    for times in ranks:  # (wall, CPU) per timed iteration and size; the sums were checked
        assert sorted(times) == [4096, 1 << 20]
        assert all(len(t) == 2 and all(w > 0 and c >= 0 for w, c in t) for t in times.values())
    (hosts,) = made  # its namespaces are gone (other tests' may exist meanwhile)
    assert not [ns for ns in netns.leftover_namespaces() if ns.startswith(hosts.switch[:-3])]
