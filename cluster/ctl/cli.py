"""``clusterctl`` command line: a thin parser over :mod:`cluster.ctl.spec` and
:func:`cluster.ctl.launcher.launch`.

Exit codes: 0 success; 1 the run failed (the summary names the root cause); 2 bad command line or
cluster file, or a run that could not be set up (nothing started, no run directory left); 124
the run exceeded ``timeouts.run``; 130/143 interrupted by SIGINT/SIGTERM (everything stopped).
With ``mode: coordinator`` a failed run exits with the chief's own exit code.

Imports are lazy: ``clusterctl --help`` imports no grpc, numpy or YAML parser (each subcommand
imports what it needs when it runs), so it answers in well under 0.3 s.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cluster.ctl.spec import ClusterFile

__all__ = ["build_parser", "color_choice", "launch", "main", "parse_tasks_filter"]

EXIT_USAGE = 2
DIST_NAME = "cluster-runtime"
# Copies of cluster.ctl.render's names, so --help need not import the renderers (and through
# them the task settings, the collectives, numpy); tests/ctl/test_cli_packaging.py keeps them
# equal.
RENDER_FORMATS = ("tf-config", "k8s", "tfjob", "slurm")
RENDER_PORT_BASE = 2222
RENDER_DEFAULT_IMAGE = "cluster-runtime:latest"
RENDER_DEFAULT_NAMESPACE = "default"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DIST_NAME)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


# -- the parser: one function per subcommand ---------------------------------------------------


def _add_launch(sub: Any) -> None:
    cmd = sub.add_parser(
        "launch", help="start every task of a cluster file (or N copies of a script) here",
        usage="clusterctl launch [options] FILE [-- ARGS...]\n"
              "       clusterctl launch [options] -n N [--ps K | --elastic MIN:MAX] SCRIPT "
              "[-- ARGS...]",
        description="Start every task of FILE on this host, stream their output, stop them all "
                    "when one fails; exit 0 only when the run succeeded. With -n N, run SCRIPT "
                    "as 1 chief and N-1 workers without a cluster file (torchrun's shape). "
                    "ARGS after -- go to the script (after a file's own `args`).")
    cmd.add_argument("file", metavar="FILE|SCRIPT", help="cluster.yaml, or a script with -n")
    cmd.add_argument("-n", "--nproc", type=int, metavar="N",
                     help="run SCRIPT as N tasks: 1 chief and N-1 workers")
    cmd.add_argument("--ps", type=int, default=0, metavar="K",
                     help="with -n: add K parameter servers (mode: coordinator: only the chief "
                          "runs SCRIPT, the workers serve it)")
    cmd.add_argument("--elastic", metavar="MIN:MAX",
                     help="an elastic run: a chief or worker that dies is started again alone "
                          "while the others go on; the run fails when fewer than MIN run "
                          "(overrides the file's `elastic:`)")
    cmd.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                     help="colour task prefixes (default: auto, on a terminal)")
    cmd.add_argument("--timestamps", action="store_true",
                     help="start every console and log line with the time it was read")
    cmd.add_argument("--tasks", metavar="LIST",
                     help="show only these tasks on the console, e.g. chief:0,worker:1 or "
                          "worker (every worker); the log files always get every task")
    cmd.add_argument("--run-dir", metavar="DIR",
                     help="write logs here instead of LOG_DIR/NAME-TIMESTAMP")
    cmd.set_defaults(handler=_cmd_launch)


def _add_validate(sub: Any) -> None:
    cmd = sub.add_parser("validate", help="check a cluster file and report every problem",
                         description="Check FILE and report every problem; exit 2 if any.")
    cmd.add_argument("file", metavar="FILE", help="cluster.yaml")
    cmd.set_defaults(handler=_cmd_validate)


def _add_render(sub: Any) -> None:
    cmd = sub.add_parser(
        "render", help="print the cluster for running it elsewhere (TF_CONFIG, Kubernetes, Slurm)",
        description="Print FILE in another form: tf-config prints every task's TF_CONFIG (one "
                    "line per task: TASK, a tab, the JSON; jobs given as a count get "
                    f"consecutive ports from port_base, default {RENDER_PORT_BASE}), or one "
                    "task's with --task; k8s prints a headless Service and one Indexed Job per "
                    "job; tfjob a Kubeflow TFJob (pipe k8s and tfjob to `kubectl apply -f -`); "
                    "slurm an sbatch script.")
    cmd.add_argument("file", metavar="FILE", help="cluster.yaml")
    cmd.add_argument("--format", choices=RENDER_FORMATS, default="tf-config",
                     help="output format (default: tf-config)")
    cmd.add_argument("--task", metavar="TYPE:INDEX",
                     help="tf-config: print only this task's TF_CONFIG, e.g. worker:1")
    cmd.add_argument("--image", metavar="IMAGE",
                     help="k8s, tfjob: the container image (default: "
                          f"{RENDER_DEFAULT_IMAGE}, a placeholder: see deploy/Dockerfile)")
    cmd.add_argument("--namespace", metavar="NS",
                     help=f"k8s, tfjob: the namespace (default: {RENDER_DEFAULT_NAMESPACE})")
    cmd.add_argument("--nodes", type=int, metavar="N", help="slurm: #SBATCH --nodes")
    cmd.add_argument("--partition", metavar="P", help="slurm: #SBATCH --partition")
    cmd.add_argument("--time", metavar="T", help="slurm: #SBATCH --time, e.g. 1:00:00")
    cmd.add_argument("--elastic", metavar="MIN:MAX",
                     help="render an elastic run (overrides the file's `elastic:`), as "
                          "`clusterctl launch --elastic` runs it")
    cmd.set_defaults(handler=_cmd_render)


def _add_certs(sub: Any) -> None:
    # Defined here, not in cluster.ctl.certs, so `--help` never imports `cryptography`.
    cmd = sub.add_parser(
        "certs", help="make a CA and the tasks' certificates for `tls:` (mutual TLS)",
        description="Write a CA (reused when DIR has one) and certificates into DIR: one per "
                    "task of FILE (JOB-INDEX.pem/.key, naming its host and its Kubernetes pod "
                    "names) and pod.pem/.key for the Kubernetes Secret; or, with --hosts, "
                    "cluster.pem/.key naming those hosts. Then write `tls: {dir: DIR}` in FILE.")
    cmd.add_argument("dir", metavar="DIR", help="directory to write (created)")
    cmd.add_argument("file", metavar="FILE", nargs="?", help="cluster.yaml")
    cmd.add_argument("--hosts", nargs="+", metavar="HOST",
                     help="write cluster.pem/.key for these hosts (names or IPs)")
    cmd.add_argument("--namespace", metavar="NS", default=RENDER_DEFAULT_NAMESPACE,
                     help="Kubernetes namespace of the pod names (default: "
                          f"{RENDER_DEFAULT_NAMESPACE})")
    cmd.add_argument("--days", type=int, default=None, metavar="N",
                     help="validity in days (default: 365)")
    cmd.set_defaults(handler=_cmd_certs)


def _add_status(sub: Any) -> None:
    cmd = sub.add_parser(
        "status", help="print a table of a run's tasks: state, exit code, last step, steps/s",
        description="Print the tasks of the run in RUN_DIR (default: the newest run under "
                    "./runs, else the newest run launched on this machine): state, exit code, "
                    "last step, steps/s; exit 2 if there is no such run.")
    cmd.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                     help="a run directory (default: the newest under ./runs, else the newest "
                          "launched)")
    cmd.set_defaults(handler=_cmd_status)


_SUBCOMMANDS = [_add_launch, _add_validate, _add_render, _add_certs,
                _add_status]  # in --help order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clusterctl",
        description="Launch, validate and render cluster-runtime cluster files.",
        epilog="examples:\n  clusterctl launch -n 3 train.py -- --epochs 3\n"
               "  clusterctl launch cluster.yaml\n  clusterctl validate cluster.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


# -- helpers -----------------------------------------------------------------------------------


def _problems(label: str, error: Exception) -> None:
    count = len(getattr(error, "problems", ())) or 1
    print(f"clusterctl: {label}: {count} problem{'s' if count > 1 else ''}; nothing started",
          file=sys.stderr)
    print(str(error), file=sys.stderr)


def _load(path: str, *, tls_files: bool = True) -> ClusterFile | None:
    from cluster.ctl.spec import load_cluster_file
    from cluster.errors import ClusterFileError

    try:
        return load_cluster_file(path, tls_files=tls_files)
    except ClusterFileError as e:
        _problems(path, e)
        return None


def color_choice(flag: str, no_color: bool) -> str:
    """What ``--color FLAG`` means given whether ``NO_COLOR`` is set (https://no-color.org):
    ``auto`` becomes ``never`` under ``NO_COLOR``; an explicit ``always``/``never`` wins."""
    return "never" if flag == "auto" and no_color else flag


def parse_tasks_filter(text: str, tasks: list[str]) -> frozenset[str]:
    """The tasks ``--tasks TEXT`` selects among ``tasks``: comma-separated ``job:index`` or
    ``job`` (every task of the job). Raises ``ValueError`` naming an item that selects none."""
    chosen: set[str] = set()
    for item in (part.strip() for part in text.split(",")):
        matched = [t for t in tasks if t == item or t.split(":", 1)[0] == item]
        if not matched:
            raise ValueError(f"--tasks: {item!r} is no task of this run (tasks: "
                             f"{', '.join(tasks)})")
        chosen.update(matched)
    return frozenset(chosen)


def launch(spec: ClusterFile, **kwargs: Any) -> Any:
    """:func:`cluster.ctl.launcher.launch`, imported when a run starts (not for ``--help``)."""
    from cluster.ctl.launcher import launch as run

    return run(spec, **kwargs)


# -- subcommands -------------------------------------------------------------------------------


def _launch_spec(args: argparse.Namespace, extra: tuple[str, ...]) -> ClusterFile | None:
    """The cluster of ``launch``: a file (``extra`` appended to its args) or, with ``-n``, a
    script's one-line cluster, made elastic by ``--elastic``; None after printing why there is
    none."""
    spec = _launch_cluster(args, extra)
    if spec is None or args.elastic is None:
        return spec
    from cluster.ctl._elastic import with_elastic
    from cluster.errors import ClusterFileError

    label = args.file if args.nproc is None else (
        f"clusterctl launch -n {args.nproc}{f' --ps {args.ps}' if args.ps else ''} "
        f"--elastic {args.elastic} {args.file}")
    try:
        return with_elastic(spec, args.elastic, label)
    except ClusterFileError as e:
        _problems(f"launch {args.file}", e)
        return None


def _launch_cluster(args: argparse.Namespace, extra: tuple[str, ...]) -> ClusterFile | None:
    from cluster.ctl import oneline
    from cluster.errors import ClusterFileError

    if args.nproc is None and args.ps:
        print("clusterctl: launch: --ps needs -n N (the number of chief and worker tasks); a "
              "cluster file gives its ps count under `cluster:`", file=sys.stderr)
        return None
    if args.nproc is None:
        if oneline.looks_like_script(args.file):
            print(f"clusterctl: launch: {oneline.script_hint(args.file)}", file=sys.stderr)
            return None
        spec = _load(args.file)
        return None if spec is None else oneline.with_extra_args(spec, extra)
    if Path(args.file).suffix in oneline.YAML_SUFFIXES:
        print(f"clusterctl: launch: -n runs a script, but {args.file} is a cluster file: drop "
              "-n (the file says how many tasks run)", file=sys.stderr)
        return None
    try:
        return oneline.spec_for_script(args.file, args.nproc, ps=args.ps, args=extra)
    except ClusterFileError as e:
        _problems(f"launch {args.file}", e)
        return None


def _cmd_launch(args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    spec = _launch_spec(args, extra)
    if spec is None:
        return EXIT_USAGE
    names = [f"{job}:{i}" for job, i in spec.tasks()]
    try:
        shown = parse_tasks_filter(args.tasks, names) if args.tasks else None
    except ValueError as e:
        print(f"clusterctl: launch: {e}", file=sys.stderr)
        return EXIT_USAGE
    from cluster.ctl.launcher import LaunchError, LaunchSetupError

    try:
        # The entry point reads the environment; the launcher below is told, never looks.
        color = color_choice(args.color, no_color=bool(os.environ.get("NO_COLOR")))
        result = launch(spec, color=color, handle_signals=True,
                        run_dir=Path(args.run_dir) if args.run_dir else None,
                        timestamps=args.timestamps, show=shown)
    except LaunchSetupError as e:
        print(f"clusterctl: {args.file}: {e}; nothing started", file=sys.stderr)
        return EXIT_USAGE
    except LaunchError as e:
        print(f"clusterctl: {e}", file=sys.stderr)
        return 1
    return result.exit_code


def _cmd_validate(args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    spec = _load(args.file)
    if spec is None:
        return EXIT_USAGE
    tasks = ", ".join(f"{job}:{i}" for job, i in spec.tasks())
    elastic = f"; elastic {spec.elastic}" if spec.elastic is not None else ""
    print(f"{args.file}: OK: run {spec.name!r}, tasks {tasks}; mode {spec.mode}{elastic}")
    return 0


def _cmd_render(args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    spec = _load(args.file)
    if spec is None:
        return EXIT_USAGE
    if args.elastic is not None:
        from cluster.ctl._elastic import with_elastic
        from cluster.errors import ClusterFileError

        try:
            spec = with_elastic(spec, args.elastic, args.file)
        except ClusterFileError as e:
            _problems(f"render {args.file}", e)
            return EXIT_USAGE
    from cluster.ctl import render

    options = render.RenderOptions(task=args.task, image=args.image, namespace=args.namespace,
                                   nodes=args.nodes, partition=args.partition, time=args.time)
    try:
        text = render.render(spec, args.format, options)
    except render.RenderError as e:
        print(f"clusterctl: render: {e}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(text)
    return 0


def _cmd_certs(args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    spec = _load(args.file, tls_files=False) if args.file else None  # FILE is optional here
    if args.file and spec is None:
        return EXIT_USAGE
    from cluster.ctl import certs

    if args.days is None:
        args.days = certs.DEFAULT_DAYS
    return certs.main(args, spec)


def _cmd_status(args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    from cluster.ctl import status  # only this command reads run directories

    return status.main(args.run_dir, sys.stdout, sys.stderr)


_TAKES_EXTRA = ("launch",)  # subcommands that pass ARGS after `--` on to the script


def main(argv: list[str] | None = None) -> int:
    """Run ``clusterctl ARGV``; returns the exit code (no arguments: usage, exit 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: tuple[str, ...] = ()
    if "--" in argv:  # split here: argparse mishandles `--` after a subcommand's options
        cut = argv.index("--")
        argv, extra = argv[:cut], tuple(argv[cut + 1:])
    parser = build_parser()
    if not argv:
        parser.print_usage(sys.stderr)
        print("clusterctl: error: give a command, e.g. `clusterctl launch -n 2 train.py`; "
              "`clusterctl --help` lists them", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if extra and args.command not in _TAKES_EXTRA:
        parser.error(f"{args.command} takes no script arguments after --")
    return args.handler(args, extra)


if __name__ == "__main__":
    sys.exit(main())
