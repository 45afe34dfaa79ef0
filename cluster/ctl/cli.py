"""``clusterctl`` command line: a thin parser over :mod:`cluster.ctl.spec` and
:func:`cluster.ctl.launcher.launch`.

Exit codes: 0 success; 1 the run failed (the summary names the root cause); 2 bad command line or
cluster file, or a run that could not be set up (nothing started, no run directory left); 124
the run exceeded ``timeouts.run``; 130/143 interrupted by SIGINT/SIGTERM (everything stopped).
With ``mode: coordinator`` a failed run exits with the chief's own exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cluster.ctl import certs, render
from cluster.ctl.launcher import LaunchError, LaunchSetupError, launch
from cluster.ctl.render.tf_config import PORT_BASE
from cluster.ctl.spec import ClusterFile, load_cluster_file
from cluster.errors import ClusterFileError

__all__ = ["build_parser", "color_choice", "main"]

EXIT_USAGE = 2


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
        "render", help="print the cluster for running it elsewhere (TF_CONFIG, Kubernetes, Slurm)",
        description="Print FILE in another form: tf-config prints every task's TF_CONFIG (one "
                    "line per task: TASK, a tab, the JSON; jobs given as a count get "
                    f"consecutive ports from port_base, default {PORT_BASE}), or one task's "
                    "with --task; k8s prints a headless Service and one Indexed Job per job; "
                    "tfjob a Kubeflow TFJob (pipe k8s and tfjob to `kubectl apply -f -`); "
                    "slurm an sbatch script.")
    render_cmd.add_argument("file", metavar="FILE", help="cluster.yaml")
    render_cmd.add_argument("--format", choices=tuple(render.FORMATS), default="tf-config",
                            help="output format (default: tf-config)")
    render_cmd.add_argument("--task", metavar="TYPE:INDEX",
                            help="tf-config: print only this task's TF_CONFIG, e.g. worker:1")
    render_cmd.add_argument("--image", metavar="IMAGE",
                            help="k8s, tfjob: the container image (default: "
                                 f"{render.DEFAULT_IMAGE}, a placeholder: see deploy/Dockerfile)")
    render_cmd.add_argument("--namespace", metavar="NS",
                            help=f"k8s, tfjob: the namespace (default: {render.DEFAULT_NAMESPACE})")
    render_cmd.add_argument("--nodes", type=int, metavar="N", help="slurm: #SBATCH --nodes")
    render_cmd.add_argument("--partition", metavar="P", help="slurm: #SBATCH --partition")
    render_cmd.add_argument("--time", metavar="T", help="slurm: #SBATCH --time, e.g. 1:00:00")
    certs.add_parser(sub)
    status_cmd = sub.add_parser(
        "status", help="print a table of a run's tasks: state, exit code, last step, steps/s",
        description="Print the tasks of the run in RUN_DIR (default: the newest run launched): "
                    "state, exit code, last step, steps/s; exit 2 if there is no such run.")
    status_cmd.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                            help="a run directory (default: the newest run)")
    return parser


def _load(path: str, *, tls_files: bool = True) -> ClusterFile | None:
    try:
        return load_cluster_file(path, tls_files=tls_files)
    except ClusterFileError as e:
        count = len(e.problems)
        print(f"clusterctl: {path}: {count} problem{'s' if count > 1 else ''}; nothing started",
              file=sys.stderr)
        print(str(e), file=sys.stderr)
        return None


def _render(spec: ClusterFile, args: argparse.Namespace) -> int:
    options = render.RenderOptions(task=args.task, image=args.image, namespace=args.namespace,
                                   nodes=args.nodes, partition=args.partition, time=args.time)
    try:
        text = render.render(spec, args.format, options)
    except render.RenderError as e:
        print(f"clusterctl: render: {e}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(text)
    return 0


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
    if args.command == "certs":  # FILE is optional here
        spec = _load(args.file, tls_files=False) if args.file else None
        return EXIT_USAGE if args.file and spec is None else certs.main(args, spec)
    if args.command == "status":
        from cluster.ctl import status  # only this command reads run directories

        return status.main(args.run_dir, sys.stdout, sys.stderr)
    spec = _load(args.file)
    if spec is None:
        return EXIT_USAGE
    if args.command == "validate":
        tasks = ", ".join(f"{job}:{i}" for job, i in spec.tasks())
        print(f"{args.file}: OK: run {spec.name!r}, tasks {tasks}; mode {spec.mode}")
        return 0
    if args.command == "render":
        return _render(spec, args)
    try:
        # The entry point reads the environment; the launcher below is told, never looks.
        color = color_choice(args.color, no_color=bool(os.environ.get("NO_COLOR")))
        result = launch(spec, color=color, handle_signals=True,
                        run_dir=Path(args.run_dir) if args.run_dir else None)
    except LaunchSetupError as e:
        print(f"clusterctl: {args.file}: {e}; nothing started", file=sys.stderr)
        return EXIT_USAGE
    except LaunchError as e:
        print(f"clusterctl: {e}", file=sys.stderr)
        return 1
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
