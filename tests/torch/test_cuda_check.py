"""tools/torch_cuda_check.py, the GPU machine's check of cluster.torch, works where it runs
first: on the CPU (the same two tasks and comparison) and without CUDA (one SKIP line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._requires import require

torch = require("torch")

TOOL = Path(__file__).resolve().parents[2] / "tools" / "torch_cuda_check.py"


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_the_check_passes_on_the_cpu_with_one_verdict_line():
    out = _run("--device", "cpu", "--steps", "4", timeout=280)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("PASS torch cpu: 2 tasks on cpu, cpu"), lines
    assert "replicas bitwise equal" in lines[0] and "after 4 steps" in lines[0]


@pytest.mark.timeout(120)
def test_without_cuda_it_says_skip_and_exits_0():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check runs for real (tests/torch/test_cuda.py)")
    out = _run(timeout=100)
    assert out.returncode == 0 and out.stdout.startswith("SKIP no CUDA"), out.stdout
