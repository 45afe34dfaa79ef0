"""Regenerate the benchmark pages in ``docs/benchmarks/`` from the result files in
``bench/results/``.

Usage (from the repository root)::

    uv run python tools/bench_pages.py

Each result file (``bench/record.py`` defines them) becomes ``docs/benchmarks/NAME.md``, with
its plots as ``docs/benchmarks/NAME-I.png``; ``index.md`` explains how to read the figures and
sums every benchmark up. Pages and plots this run does not write are removed. The same result
files give the same Markdown, byte for byte, and PNGs without dates;
``tests/bench/test_bench_pages.py`` renders the pages into a temporary directory and fails
when a committed page differs, so change a result file or this generator, run this, and
commit both.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.record import Column, Plot, Result, Table, load_result  # noqa: E402

RESULTS = Path("bench/results")
OUT_DIR = Path("docs/benchmarks")
# The index lists these first, in this order; any other result follows by name.
ORDER = ("strategy", "strategy-bert", "strategy-16core", "torch_ddp", "torch_ddp-16core",
         "keras_fit", "allreduce", "allreduce-16core", "allreduce-hosts", "allreduce-hosts4",
         "membw", "ps", "ps-tls", "tcp_tls", "checkpoint", "scale", "coordination", "elastic")

INTRO = """\
# Benchmarks

Every figure on these pages comes from a result file in `bench/results/`: the exact command
that produced it, the machine (cores, CPU model, memory, OS), the date, the git commit it was
measured at, and the figures. A file says in its `source` whether a bench wrote it
(`measured`) or its figures were transcribed from a published table.

## How to read the figures

- **Times are medians.** An iteration starts after a barrier and its time is the slowest
  rank's; a table shows the median over the timed iterations (pooled over `--rounds` where a
  bench interleaves rounds).
- **`x gloo` is gloo's time over ours**: above 1 we are faster. `x DDP`, `x echo` and `x
  buckets` read the same way against what they name; other ratios (`save / dd`, `TLS cost`)
  say on their page what they divide.
- **Bus bandwidth** (busbw, nccl-tests' convention) is busbw = algbw * 2(N-1)/N, with algbw =
  bytes / time: the bandwidth each rank's links carry in a ring, comparable across N.
- **A 2-core VM is noisy.** Most figures come from a 2-core VM shared with other work, whose
  speed drifts by up to 30% within minutes and whose small sizes are often bimodal. Read the
  ratios measured in one run (both sides saw the same machine), make bandwidth claims at 16-64
  MiB, and read absolute times as that machine's. The 16-core pages come from a lent machine
  with 16 cores and nothing else running on it.

## How to regenerate

Run a bench with `--json` into `bench/results/`, then rebuild these pages:

```bash
uv run python bench/strategy.py --nprocs 2,4 --sizes 64M --models resnet50 --rounds 3 \\
    --json bench/results/strategy.json
uv run python bench/allreduce.py --nprocs 2,4 --sizes 4K,64K,1M,16M,64M --iters 10 \\
    --json bench/results/allreduce.json
uv run python tools/bench_pages.py
```

`bench/strategy.py`, `bench/allreduce.py`, `bench/torch_ddp.py`, `bench/ps.py`,
`bench/tcp_tls.py`, `bench/checkpoint.py`, `bench/scale.py`, `bench/elastic.py` and
`bench/membw.py` take `--json PATH`; the schema is `bench/record.py`.
`tests/bench/test_bench_pages.py` checks every result file against the schema and that the
committed pages are those the result files give.
"""


# -- Markdown --------------------------------------------------------------------------------


def number(value: float | int) -> str:
    """A number as the result file holds it: the shortest text that reads back the same."""
    return repr(value)


def cell(value: float | int | str | None, column: Column) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value.replace("|", "\\|")
    text = (number(value) if column.digits is None or isinstance(value, int)
            else f"{value:.{column.digits}f}")
    return text + ("x" if column.unit == "x" else "")


def heading(column: Column) -> str:
    unit = "" if column.unit in ("", "x", "count") else f" ({column.unit})"
    return column.name.replace("|", "\\|") + unit


def table_markdown(table: Table) -> str:
    lines = ["| " + " | ".join(heading(c) for c in table.columns) + " |",
             "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v, c) for v, c in zip(row, table.columns, strict=True))
              + " |" for row in table.rows]
    return "\n".join(lines)


def machine_text(result: Result) -> str:
    m = result.machine
    memory = f"{number(m.memory_gib)} GiB memory" if m.memory_gib is not None else \
        "memory not recorded"
    return f"{m.cores} cores, {m.cpu}, {memory}, {m.os}"


def plot_file(result: Result, index: int) -> str:
    return f"{result.name}-{index}.png"


def page_markdown(result: Result) -> str:
    """The benchmark's page: what it measures, how it ran, its tables and plots."""
    parts = [f"# {result.title}", result.summary,
             f"```bash\n{result.command}\n```",
             "\n".join([f"- **Machine:** {machine_text(result)}",
                        f"- **Date:** {result.date}",
                        f"- **Commit:** `{result.commit}`",
                        f"- **Source:** {result.source}"])]
    if result.figures:
        parts.append("\n".join(f"- {f.label}: **{figure_value(f.value, f.unit)}**"
                               for f in result.figures))
    for i, table in enumerate(result.tables):
        parts.append(f"## {table.title}")
        if table.notes:
            parts.append(table.notes)
        parts.append(table_markdown(table))
        for j, plot in enumerate(result.plots):
            if plot.table == i:
                parts.append(f"![{plot.title}]({plot_file(result, j)})")
    return "\n\n".join(parts) + "\n"


def figure_value(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:.2f}x"
    return number(value) + (f" {unit}" if unit and unit != "count" else "")


def index_markdown(results: list[Result]) -> str:
    lines = ["| benchmark | machine | date | commit | headline figures |",
             "|---|---|---|---|---|"]
    for r in results:
        figures = "; ".join(f"{f.label} {figure_value(f.value, f.unit)}" for f in r.figures)
        lines.append(f"| [{r.title}]({r.name}.md) | {r.machine.cores} cores, {r.machine.cpu} "
                     f"| {r.date} | `{r.commit}` | {figures or '-'} |")
    return INTRO + "\n## Summary\n\n" + "\n".join(lines) + "\n"


def ordered(results: list[Result]) -> list[Result]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(results, key=lambda r: (rank.get(r.name, len(ORDER)), r.name))


def load_results(results_dir: Path) -> list[Result]:
    """Every ``*.json`` in ``results_dir``, validated, in the index's order.

    Raises ``bench.record.ResultError`` naming the file and field where one breaks the
    schema, or where a file's name is not its ``name`` field.
    """
    from bench.record import ResultError

    results = []
    for path in sorted(results_dir.glob("*.json")):
        result = load_result(path)
        if result.name != path.stem:
            raise ResultError(f"{path}: name {result.name!r} is not the file's name "
                              f"{path.stem!r}; rename one of them")
        results.append(result)
    return ordered(results)


def render_pages(results: list[Result]) -> dict[str, str]:
    """File name -> text of every page: ``index.md`` and one per result."""
    pages = {"index.md": index_markdown(results)}
    pages.update({f"{r.name}.md": page_markdown(r) for r in results})
    return pages


# -- plots -----------------------------------------------------------------------------------


def _value(v: object) -> float:
    return float(v) if isinstance(v, int | float) else math.nan


def _label(table: Table, row: tuple, columns: tuple[str, ...]) -> str:
    parts = []
    for name in columns:
        v = row[table.column(name)]
        parts.append(f"{name}={number(v)}" if isinstance(v, int | float) else str(v))
    return "\n".join(parts)


def draw(plot: Plot, table: Table, path: Path) -> None:
    """Draw ``plot`` of ``table`` into the PNG ``path`` (no date or software in its metadata,
    so the same table gives the same file with the same matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=100)
    try:
        if plot.kind == "bar":
            width = 0.8 / len(plot.y)
            for k, name in enumerate(plot.y):
                col = table.column(name)
                ax.bar([i + (k - (len(plot.y) - 1) / 2) * width for i in range(len(table.rows))],
                       [_value(row[col]) for row in table.rows], width, label=name)
            ax.set_xticks(range(len(table.rows)))
            ax.set_xticklabels([_label(table, row, plot.x) for row in table.rows], fontsize=8)
        else:
            xcol = table.column(plot.x[0])
            categories = list(dict.fromkeys(str(row[xcol]) for row in table.rows))
            groups = ([None] if plot.group is None else
                      list(dict.fromkeys(row[table.column(plot.group)] for row in table.rows)))
            # A colour per y column, a line style per group.
            for g, group in enumerate(groups):
                rows = [row for row in table.rows
                        if group is None or row[table.column(plot.group)] == group]
                for k, name in enumerate(plot.y):
                    col = table.column(name)
                    label = name if group is None else f"{name}, {plot.group}={number(group)}"
                    ax.plot([categories.index(str(row[xcol])) for row in rows],
                            [_value(row[col]) for row in rows], marker="o", label=label,
                            color=f"C{k}", linestyle=("-", "--", ":", "-.")[g % 4])
            ax.set_xticks(range(len(categories)))
            ax.set_xticklabels(categories, fontsize=8)
            ax.set_xlabel(plot.x[0])
        if plot.log_y:
            ax.set_yscale("log")
        ax.set_ylabel(plot.ylabel)
        ax.set_title(plot.title)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)


# -- files -----------------------------------------------------------------------------------


def generate(results_dir: Path, out_dir: Path, plots: bool = True) -> list[Path]:
    """Write every page (and, with ``plots``, every plot) into ``out_dir``; remove the pages and
    plots there that no result gives any more. Returns the files written."""
    results = load_results(results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_pages(results).items():
        (out_dir / name).write_text(text)
        written.append(out_dir / name)
    if plots:
        for r in results:
            for i, plot in enumerate(r.plots):
                draw(plot, r.tables[plot.table], out_dir / plot_file(r, i))
                written.append(out_dir / plot_file(r, i))
    keep = set(written) if plots else {p for p in out_dir.glob("*.png")} | set(written)
    for stale in [*out_dir.glob("*.md"), *out_dir.glob("*.png")]:
        if stale not in keep:
            stale.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=REPO / RESULTS,
                        help="folder of result files (default bench/results)")
    parser.add_argument("--out", type=Path, default=REPO / OUT_DIR,
                        help="folder of the pages (default docs/benchmarks)")
    parser.add_argument("--no-plots", action="store_true", help="write the Markdown only")
    args = parser.parse_args(argv)
    for path in generate(args.results, args.out, plots=not args.no_plots):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
