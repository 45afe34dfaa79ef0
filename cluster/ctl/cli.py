"""``clusterctl`` command line: a thin parser over launcher functions.

Only the command surface exists so far; ``launch``, ``validate`` and ``render`` arrive with the
launcher. Until then each reports that plainly and exits 2 (usage error), starting nothing.
"""

from __future__ import annotations

import argparse
import sys

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clusterctl",
        description="Launch, validate and render cluster-runtime cluster files.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in (
        ("launch", "start every task of a cluster file on this host and supervise them"),
        ("validate", "check a cluster file and report every problem"),
        ("render", "print each task's TF_CONFIG for use elsewhere"),
    ):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("file", metavar="FILE", help="cluster.yaml")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    print(
        f"clusterctl {args.command}: not available in this version yet; nothing was started.",
        file=sys.stderr,
    )
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
