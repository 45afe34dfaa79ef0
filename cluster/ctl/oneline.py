"""The cluster of a one-line launch, torchrun's shape: ``clusterctl launch -n 3 train.py -- ARGS``.

:func:`spec_for_script` turns the command line into the text of a cluster file and validates it
with :func:`cluster.ctl.spec.parse_cluster_file`, the path every file takes, so a one-line launch
gets exactly the checks, defaults and limits a file gets (``limits.max_tasks``, the entrypoint
must exist, ...). The cluster is 1 chief and ``nproc - 1`` workers; ``ps`` parameter servers
switch to ``mode: coordinator`` (parameter-server training, as in ``examples/ps``: only the chief
runs the script, the workers serve it). Runs go to ``./runs`` beside the current directory, the
run is named after the script.

:func:`script_hint` is what ``clusterctl launch train.py`` (no ``-n``) says instead of a YAML
parse error.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from cluster.ctl.spec import ClusterFile, Problem, parse_cluster_file
from cluster.errors import ClusterFileError

__all__ = ["YAML_SUFFIXES", "looks_like_script", "script_hint", "spec_for_script",
           "with_extra_args"]

YAML_SUFFIXES = (".yaml", ".yml")


def looks_like_script(target: str) -> bool:
    """Whether ``target`` names a Python script rather than a cluster file (``.py``)."""
    return Path(target).suffix == ".py"


def script_hint(target: str) -> str:
    """The message for ``clusterctl launch SCRIPT`` without ``-n``: how to run it."""
    return (f"{target} is a Python script, not a cluster file: say how many tasks run it, "
            f"e.g. `clusterctl launch -n 2 {target} -- ARGS` (1 chief + 1 worker; add `--ps 2` "
            "for parameter-server training), or write a cluster.yaml (see "
            "docs/guide/cluster-file.md)")


def _run_name(script: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", script.stem).lstrip("._-")
    return name or "run"


def spec_for_script(script: str | Path, nproc: int, *, ps: int = 0, args: tuple[str, ...] = (),
                    cwd: Path | None = None) -> ClusterFile:
    """The validated cluster of ``clusterctl launch -n NPROC [--ps PS] SCRIPT -- ARGS``.

    Raises:
        ClusterFileError: the command line describes no valid cluster (``nproc`` < 1, ``ps``
            without a worker to serve the chief, a missing script, too many tasks); each problem
            names the command-line flag and says how to fix it.
    """
    cwd = (cwd or Path.cwd()).resolve()
    label = f"clusterctl launch -n {nproc}{f' --ps {ps}' if ps else ''} {script}"
    problems = []
    if nproc < 1:
        problems.append(Problem(label, 0, "-n", f"{nproc} tasks: at least 1 (the chief) "
                                "is needed", "e.g. -n 2: a chief and a worker"))
    if ps < 0:
        problems.append(Problem(label, 0, "--ps", f"negative count {ps}", "0 or more"))
    elif ps and nproc < 2:
        problems.append(Problem(label, 0, "--ps", "parameter-server training needs a worker "
                                "besides the chief", "use -n 2 or more with --ps"))
    path = (cwd / script).resolve()
    if not path.is_file():
        problems.append(Problem(label, 0, "SCRIPT", f"file not found: {path}",
                                "the path is relative to the current directory"))
    if problems:
        raise ClusterFileError(problems)
    text = "\n".join([
        f"name: {_run_name(path)}",
        f"entrypoint: {json.dumps(str(path))}",
        f"args: {json.dumps(list(args))}",
        f"cluster: {json.dumps({'chief': 1, 'worker': nproc - 1, 'ps': ps})}",
        *(["mode: coordinator"] if ps else []),
    ]) + "\n"
    try:
        return parse_cluster_file(text, cwd / "clusterctl-launch.yaml")
    except ClusterFileError as e:  # the generated text's line numbers mean nothing to a user
        raise ClusterFileError([replace(p, file=label, line=0) for p in e.problems]) from None


def with_extra_args(spec: ClusterFile, extra: tuple[str, ...]) -> ClusterFile:
    """``spec`` with ``extra`` appended to its ``args`` (``clusterctl launch FILE -- ARGS``)."""
    return replace(spec, args=(*spec.args, *extra)) if extra else spec
