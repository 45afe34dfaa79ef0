"""The cores a host gives the collectives (``cluster.collectives.cores``): a cgroup CPU quota,
v1 or v2, caps ``os.cpu_count()``; no quota, or none readable, leaves it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.collectives import cores

pytestmark = pytest.mark.path_independent


def _tree(root: Path, files: dict[str, str], cgroup: str = "0::/\n") -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.mkdir(parents=True, exist_ok=True)
    proc = root / "proc-self-cgroup"
    proc.write_text(cgroup)
    return proc


@pytest.mark.parametrize(("files", "cgroup", "expected"), [
    ({"cpu.max": "200000 100000\n"}, "0::/\n", 2),  # v2, a container's own root
    ({"cpu.max": "150000 100000\n"}, "0::/\n", 2),  # 1.5 CPUs: rounded up
    ({"cpu.max": "max 100000\n"}, "0::/\n", None),  # no quota
    ({"job/cpu.max": "400000 100000\n", "cpu.max": "max 100000\n"}, "0::/job\n", 4),
    ({"job/cpu.max": "800000 100000\n", "cpu.max": "300000 100000\n"}, "0::/job\n", 3),
    ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"},
     "4:cpu,cpuacct:/\n", 3),  # v1
    ({"cpu,cpuacct/k8s/pod/cpu.cfs_quota_us": "100000\n",
      "cpu,cpuacct/k8s/pod/cpu.cfs_period_us": "100000\n"}, "4:cpu,cpuacct:/k8s/pod\n", 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "4:cpu:/\n", None),
    ({"cpu.max": "garbage\n"}, "0::/\n", None),
    ({}, "0::/\n", None),  # no cgroup file system
])
def test_quota_cores(tmp_path: Path, files: dict[str, str], cgroup: str,
                     expected: int | None) -> None:
    proc = _tree(tmp_path / "cg", files, cgroup)
    assert cores.quota_cores(tmp_path / "cg", proc) == expected


def test_unreadable_proc_cgroup_still_reads_the_root(tmp_path: Path) -> None:
    _tree(tmp_path, {"cpu.max": "300000 100000\n"})
    assert cores.quota_cores(tmp_path, tmp_path / "missing") == 3


def test_host_cores_is_the_machine_capped_by_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 64)
    for quota, expected in [(2, 2), (None, 64), (128, 64)]:
        monkeypatch.setattr(cores, "quota_cores", lambda q=quota: q)
        cores.host_cores.cache_clear()
        assert cores.host_cores() == expected
    cores.host_cores.cache_clear()
