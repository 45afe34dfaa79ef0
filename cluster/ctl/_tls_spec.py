"""The cluster file's ``tls:`` key: mutual TLS for every connection of the run.

Two forms (docs/guide/across-hosts.md, "Encryption (TLS)")::

    tls: auto              # clusterctl makes a CA and each task's certificate in the run directory
    tls: {dir: certs/}     # use the files `clusterctl certs certs/ cluster.yaml` wrote

With ``dir:`` the directory (relative to the cluster file) must hold ``ca.pem`` and, for every
task, ``JOB-INDEX.pem`` and ``JOB-INDEX.key``; the check is here, before anything starts, so a
missing file is a problem of the file (exit 2) and not a task that fails at start-up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.ctl._checker import Checker, kind_of
from cluster.ctl._yaml import Located

if TYPE_CHECKING:
    from cluster.ctl.spec import JobSpec

__all__ = ["CA_FILE", "TlsSpec", "parse_tls", "task_files"]

CA_FILE = "ca.pem"
_HINT = "write `tls: auto` (certificates made at launch) or `tls: {dir: certs/}` (made by " \
        "`clusterctl certs certs/ cluster.yaml`)"


@dataclass(frozen=True)
class TlsSpec:
    """``dir``: where the certificates are; ``None`` for ``tls: auto`` (made at launch)."""

    dir: Path | None = None


def task_files(directory: Path, job: str, index: int) -> tuple[Path, Path, Path]:
    """``(cert, key, ca)`` of task ``job:index`` in a directory ``clusterctl certs`` wrote."""
    return (directory / f"{job}-{index}.pem", directory / f"{job}-{index}.key",
            directory / CA_FILE)


def parse_tls(c: Checker, node: Located, base: Path,
              jobs: Iterable[JobSpec], check_files: bool = True) -> TlsSpec | None:
    """The ``tls:`` value as a :class:`TlsSpec`, or ``None`` after adding a problem to ``c``.
    ``jobs``: whose tasks' files a ``dir:`` must hold (unless not ``check_files``)."""
    if node.value == "auto":
        return TlsSpec()
    if not isinstance(node.value, dict):
        c.add(node.line, "tls", f"expected `auto` or a mapping, got {kind_of(node.value)}",
              _HINT)
        return None
    tls = c.mapping(node, "tls", ("dir",), "TLS settings")
    if tls is None:
        return None
    if "dir" not in tls:
        c.add(node.line, "tls.dir", "missing", _HINT)
        return None
    given = c.string(tls["dir"], "tls.dir")
    if given is None:
        return None
    directory = (base / Path(given).expanduser()).resolve()
    if not check_files:
        return TlsSpec(directory)
    if not directory.is_dir():
        c.add(tls["dir"].line, "tls.dir", f"directory not found: {directory}",
              f"make it with `clusterctl certs {given} FILE` (relative to the cluster file)")
        return None
    missing = sorted({p.name for job in jobs
                      for i in range(job.count) for p in task_files(directory, job.name, i)
                      if not p.is_file()})
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                          else "")
        c.add(tls["dir"].line, "tls.dir", f"{directory} lacks {shown}",
              f"run `clusterctl certs {given} FILE` again for this cluster file")
        return None
    return TlsSpec(directory)
