"""Regenerate the gRPC/protobuf stubs from ``proto/`` into ``cluster/transport/_pb/``.

Usage (from the repository root)::

    uv run python tools/gen_protos.py

The ``.proto`` sources live in ``proto/`` and are compiled under the virtual path
``cluster/transport/_pb/`` so the generated modules import each other package-qualified
(``from cluster.transport._pb import tensor_pb2``) and never as a top-level ``proto`` module.
``tests/test_protos.py`` regenerates into a temporary directory and fails when the committed stubs
differ byte for byte, so edit the ``.proto`` files, run this, and commit both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO / "proto"
PACKAGE_PATH = Path("cluster/transport/_pb")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_sources() -> list[Path]:
    """The ``.proto`` files, sorted so the generated output never depends on directory order."""
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Compile every proto into ``out_root/cluster/transport/_pb``; return the files written.

    Raises ``RuntimeError`` with protoc's exit code when compilation fails.
    """
    from grpc_tools import protoc  # dev dependency; imported here so the module loads without it

    target = out_root / PACKAGE_PATH
    target.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")  # well-known types
    sources = [f"{PACKAGE_PATH.as_posix()}/{p.name}" for p in proto_sources()]
    args = [
        "grpc_tools.protoc",
        f"-I{PACKAGE_PATH.as_posix()}={PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *sources,
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code} on {', '.join(sources)}")
    return sorted(p for p in target.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO, help="root to write under")
    args = parser.parse_args(argv)
    written = generate(args.out)
    for path in written:
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
