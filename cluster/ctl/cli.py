"""``clusterctl`` command line: a thin parser over :mod:`cluster.ctl.spec` and
:func:`cluster.ctl.launcher.launch`.

Exit codes: 0 success; 1 the run failed (the summary names the root cause); 2 bad command line or
cluster file (nothing started); 124 the run exceeded ``timeouts.run``; 130/143 interrupted by
SIGINT/SIGTERM (everything stopped). With ``mode: coordinator`` a failed run exits with the
chief's own exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from cluster.ctl.launcher import LaunchError, launch
from cluster.ctl.render.slurm import SlurmRenderError, render_slurm
from cluster.ctl.spec import ClusterFile, load_cluster_file
from cluster.ctl.task_config import assign_addresses, tf_config
from cluster.errors import ClusterFileError

__all__ = ["build_parser", "color_choice", "main"]

EXIT_USAGE = 2
RENDER_PORT_BASE = 2222


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clusterctl",
        description="Launch, validate and render cluster-runtime cluster files.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    launch_cmd = sub.add_parser(
        "launch", help="start every task of a cluster file on this host and supervise them",
        description="Start every task of FILE on this host, stream their output, stop them all "
                    "when one fails; exit 0 only when the run succeeded.")
    launch_cmd.add_argument("file", metavar="FILE", help="cluster.yaml")
    launch_cmd.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                            help="colour task prefixes (default: auto, on a terminal)")
    launch_cmd.add_argument("--run-dir", metavar="DIR",
                            help="write logs here instead of LOG_DIR/NAME-TIMESTAMP")
    validate_cmd = sub.add_parser("validate", help="check a cluster file and report every problem",
                                  description="Check FILE and report every problem; exit 2 if any.")
    validate_cmd.add_argument("file", metavar="FILE", help="cluster.yaml")
    render_cmd = sub.add_parser(
        "render", help="print each task's TF_CONFIG for use elsewhere",
        description="Print the TF_CONFIG of every task of FILE (one line per task: TASK, a tab, "
                    "the JSON), or of one task with --task. Jobs given as a count get "
                    f"consecutive ports from port_base (default {RENDER_PORT_BASE}).")
    render_cmd.add_argument("file", metavar="FILE", help="cluster.yaml")
    render_cmd.add_argument("--format", choices=("tf-config", "slurm"), default="tf-config",
                            help="output format (default: tf-config); slurm: an sbatch script")
    render_cmd.add_argument("--task", metavar="TYPE:INDEX",
                            help="print only this task's TF_CONFIG, e.g. worker:1")
    render_cmd.add_argument("--nodes", type=int, metavar="N", help="slurm: #SBATCH --nodes")
    render_cmd.add_argument("--partition", metavar="P", help="slurm: #SBATCH --partition")
    render_cmd.add_argument("--time", metavar="T", help="slurm: #SBATCH --time, e.g. 1:00:00")
    return parser


def _load(path: str) -> ClusterFile | None:
    try:
        return load_cluster_file(path)
    except ClusterFileError as e:
        count = len(e.problems)
        print(f"clusterctl: {path}: {count} problem{'s' if count > 1 else ''}; nothing started",
              file=sys.stderr)
        print(str(e), file=sys.stderr)
        return None


def _render(spec: ClusterFile, only: str | None) -> int:
    if spec.port_base is None:
        spec = _with_port_base(spec)
    addresses = assign_addresses(spec)
    configs = {f"{job}:{i}": tf_config(addresses, job, i) for job, i in spec.tasks()}
    if only is not None:
        if only not in configs:
            print(f"clusterctl: render: no task {only!r} in {spec.path}; tasks are "
                  f"{', '.join(configs)}", file=sys.stderr)
            return EXIT_USAGE
        print(configs[only])
        return 0
    for task, text in configs.items():
        print(f"{task}\t{text}")
    return 0


def _with_port_base(spec: ClusterFile) -> ClusterFile:
    return dataclasses.replace(spec, port_base=RENDER_PORT_BASE)


def color_choice(flag: str, no_color: bool) -> str:
    """What ``--color FLAG`` means given whether ``NO_COLOR`` is set (https://no-color.org):
    ``auto`` becomes ``never`` under ``NO_COLOR``; an explicit ``always``/``never`` wins."""
    return "never" if flag == "auto" and no_color else flag


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    spec = _load(args.file)
    if spec is None:
        return EXIT_USAGE
    if args.command == "validate":
        tasks = ", ".join(f"{job}:{i}" for job, i in spec.tasks())
        print(f"{args.file}: OK: run {spec.name!r}, tasks {tasks}; mode {spec.mode}")
        return 0
    if args.command == "render" and args.format == "slurm":
        try:
            print(render_slurm(spec, nodes=args.nodes, partition=args.partition,
                               time_limit=args.time), end="")
        except SlurmRenderError as e:
            print(f"clusterctl: render: {e}", file=sys.stderr)
            return EXIT_USAGE
        return 0
    if args.command == "render":
        if any(v is not None for v in (args.nodes, args.partition, args.time)):
            print("clusterctl: render: --nodes, --partition and --time apply to --format slurm "
                  "only", file=sys.stderr)
            return EXIT_USAGE
        return _render(spec, args.task)
    try:
        # The entry point reads the environment; the launcher below is told, never looks.
        color = color_choice(args.color, no_color=bool(os.environ.get("NO_COLOR")))
        result = launch(spec, color=color, handle_signals=True,
                        run_dir=Path(args.run_dir) if args.run_dir else None)
    except LaunchError as e:
        print(f"clusterctl: {e}", file=sys.stderr)
        return 1
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
