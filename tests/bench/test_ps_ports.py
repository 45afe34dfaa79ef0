"""``bench/ps.py`` chooses new ports when a port it picked is taken before its task binds it:
a real ``python -m ps`` exits 203 on the taken port, the benchmark starts its cluster again on
fresh ports and measures. Speed is never asserted."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "ps.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_ps_under_test", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_taken_port_is_chosen_again(monkeypatch, capsys) -> None:
    bench = _load_bench()
    real_pick = bench.pick_free_ports
    with socket.socket() as holder:  # a listener on the port the ps (the last task) gets
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        picks: list[list[int]] = []

        def pick(host: str, n: int) -> list[int]:
            ports = [*real_pick(host, n)[:-1], taken] if not picks else real_pick(host, n)
            picks.append(ports)
            return ports

        monkeypatch.setattr(bench, "pick_free_ports", pick)
        found = bench.bench_transfer([4096], [1], iters=1, warmup=0)
    assert len(picks) == 2 and taken not in picks[1]
    assert set(found) == {(1, 4096)} and all(s > 0 for s in found[1, 4096])
    assert "exited (code 203) before serving" in capsys.readouterr().err


def test_the_retry_gives_up_after_its_attempts(monkeypatch) -> None:
    bench = _load_bench()
    calls = []

    def always_taken() -> None:
        calls.append(1)
        raise bench.PortTaken("ps:0 exited (code 203)")

    with pytest.raises(bench.PortTaken):
        bench._on_fresh_ports(always_taken)
    assert len(calls) == bench.PORT_ATTEMPTS
