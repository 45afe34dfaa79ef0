"""Elastic training: a lost worker's survivors and its replacement, beside a whole restart.

    uv run python bench/elastic.py                          # N = 4, 8 on this host, 3 repeats
    sudo uv run python bench/elastic.py --netns-hosts 2     # + N = 4 on 2 emulated hosts
    uv run python bench/elastic.py --quick                  # N = 4, 1 repeat: a smoke run

Every task runs ``bench/_elastic_task.py`` under ``python -m worker``: a small model trained
through the public API (``cluster.elastic.State`` and ``run``, a commit per step, a fixed global
batch split among the replicas, ``--step-time`` s of pretend accelerator compute per step). The
bench is the launcher (``bench/_elastic_job.py``). Per case (N tasks: a chief and N-1 workers, on
this host or, with ``--netns-hosts H``, spread over H network-namespace hosts; root only), in one
run:

- **elastic** (``CLUSTER_ELASTIC=2:N``, the coordination service in its own process): SIGKILL a
  worker mid-run; *survivors' next step* is the time from the kill until every survivor completed
  a step in the group of N-1 (the slowest one's). Then start the dead task again (same
  ``TF_CONFIG`` and address, as ``clusterctl`` restarts it); *replacement from start* is the time
  from its process's start to its first completed step in the group, *from imports* the same from
  its ``IMPORTED`` line (``time.time()`` right after ``import cluster`` in the script: the
  interpreter's and the runtime's imports, its server's start and its peers' health check are
  done by then); *members' pause* is the longest time a member went without a step while it
  joined. Repeated ``--repeats`` times on one job, killing another worker each time.
- **whole restart** (the same job without ``CLUSTER_ELASTIC``, checkpointing with
  ``cluster.checkpoint.CheckpointManager`` every ``--checkpoint-every`` steps): SIGKILL a worker,
  stop every other task (SIGTERM, SIGKILL after 10 s, as ``clusterctl`` does), start all N
  again; each restores the newest checkpoint. *Whole restart* is the time from the kill until
  every task completed its first step. The steps since that checkpoint, computed again, are not
  counted.

Tables show medians over the repeats; ``x restart`` is the whole restart's time over the
survivors' next step (above 1 the elastic job is training again that much sooner). Goals: the
survivors' next step within 3 s of the kill, a replacement in the group within 5 s of its start
not counting its imports, and x restart at least 5. The output starts with the machine (cores,
CPU model, cores per rank at each N) and the load average before the run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._elastic_job import (  # noqa: E402
    BenchError,
    Site,
    TrainArgs,
    local_site,
    measure_elastic,
    measure_restart,
    netns_site,
)
from bench._elastic_steps import median  # noqa: E402
from bench.record import (  # noqa: E402
    CORES_PER_RANK,
    Column,
    Figure,
    Table,
    cores_per_rank,
    machine_line,
    write_result,
)

TITLE = "Elastic training: survivors, replacement and whole restart"
SUMMARY = ("One worker of N is SIGKILLed mid-run in an elastic job (`cluster.elastic.run`, a "
           "commit per step, a small model on a fixed global batch): how soon every survivor "
           "completes a step in the smaller group, and how soon the dead task, started again, "
           "completes a step in the group; beside what a job without elasticity pays in the "
           "same run: stop every task, start all N again, restore the newest checkpoint, first "
           "step. Medians over the repeats. Goals: survivors' next step within 3 s of the kill; "
           "a replacement in the group within 5 s of its start, not counting its imports; "
           "whole restart at least 5x the survivors' time.")
COLUMNS = (Column("N"), Column("hosts"), CORES_PER_RANK, Column("repeats"),
           Column("step", "ms", 0), Column("survivors' next step", "s", 2),
           Column("replacement from start", "s", 2), Column("from imports", "s", 2),
           Column("members' pause", "s", 2), Column("whole restart", "s", 2),
           Column("old job stopped", "s", 2), Column("survivors x restart", "x", 1))


def case_row(n: int, hosts: int, elastic: Sequence[dict], restart: Sequence[dict]) -> tuple:
    """The table's row of one case from the repeats' figures (seconds); ``None`` where none
    was measured."""
    def med(rows: Sequence[dict], key: str, scale: float = 1.0, digits: int = 2):
        values = [r[key] for r in rows if r.get(key) is not None]
        return round(median(values) * scale, digits) if values else None

    survivors, whole = med(elastic, "recovery", digits=3), med(restart, "restart", digits=3)
    ratio = round(whole / survivors, 1) if survivors and whole is not None else None
    return (n, hosts, cores_per_rank(n), len(elastic), med([*elastic, *restart], "step", 1e3, 0),
            survivors, med(elastic, "join_start", digits=3),
            med(elastic, "join_imported", digits=3), med(elastic, "join_pause", digits=3),
            whole, med(restart, "stopped", digits=3), ratio)


def result_table(rows: Sequence[tuple], notes: str) -> Table:
    return Table(title="Medians per case (goals: survivors <= 3 s, replacement from imports "
                       "<= 5 s, x restart >= 5)", columns=COLUMNS, rows=tuple(rows), notes=notes)


def result_figures(table: Table) -> list[Figure]:
    """Survivors' next step and x restart, per case."""
    figures = []
    for row in table.rows:
        cells = dict(zip((c.name for c in table.columns), row, strict=True))
        where = f"N={cells['N']}" + (f", {cells['hosts']} hosts" if cells["hosts"] > 1 else "")
        if cells["survivors' next step"] is not None:
            figures.append(Figure(f"survivors' next step {where}",
                                  cells["survivors' next step"], "s"))
        if cells["survivors x restart"] is not None:
            figures.append(Figure(f"x restart {where}", cells["survivors x restart"], "x"))
    return figures


def markdown(table: Table) -> str:
    """The table as the bench prints it."""
    def text(value, column: Column) -> str:
        if value is None:
            return "-"
        if isinstance(value, float) and column.digits is not None:
            value = f"{value:.{column.digits}f}"
        return f"{value}x" if column.unit == "x" else str(value)

    head = [c.name + (f" ({c.unit})" if c.unit not in ("", "x") else "") for c in table.columns]
    lines = [table.title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(text(v, c) for v, c in zip(row, table.columns, strict=True))
              + " |" for row in table.rows]
    return "\n".join(lines + ([table.notes] if table.notes else []))


def run_case(site: Site, hosts: int, args: argparse.Namespace, train: TrainArgs) -> tuple:
    n = len(site.tasks)
    print(f"N={n}, {site.name}: elastic ...", flush=True)
    elastic = measure_elastic(site, args.repeats, train, warmup=args.warmup,
                              timeout=args.timeout)
    print(f"N={n}, {site.name}: whole restart ...", flush=True)
    restart = measure_restart(site, args.repeats, train, warmup=args.warmup,
                              timeout=args.timeout)
    row = case_row(n, hosts, elastic, restart)
    print(f"N={n}, {site.name}: " + ", ".join(
        f"{c.name} {v}" for c, v in zip(COLUMNS[4:], row[4:], strict=True)), flush=True)
    return row


def netns_row(n: int, hosts: int, args: argparse.Namespace, train: TrainArgs) -> tuple:
    from cluster.testing import netns

    reason = netns.unavailable()
    if reason is not None:
        raise BenchError(f"--netns-hosts: {reason}")
    with netns.NetnsCluster([f"h{i + 1}" for i in range(hosts)]) as emulated:
        return run_case(netns_site(emulated, n), hosts, args, train)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="4,8", help="comma list of task counts (this host)")
    parser.add_argument("--netns-hosts", type=int, default=0,
                        help="also N=--netns-nprocs over this many emulated hosts (root)")
    parser.add_argument("--netns-nprocs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10, help="steps before the first kill")
    parser.add_argument("--features", type=int, default=TrainArgs.features)
    parser.add_argument("--batch", type=int, default=TrainArgs.batch)
    parser.add_argument("--step-time", type=float, default=TrainArgs.step_time,
                        help="seconds of pretend accelerator compute per step")
    parser.add_argument("--checkpoint-every", type=int, default=TrainArgs.checkpoint_every)
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds any one wait for a step may take")
    parser.add_argument("--quick", action="store_true",
                        help="N=4 on this host, 1 repeat, 5 warm-up steps: a smoke run")
    parser.add_argument("--json", type=Path, help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.nprocs, args.netns_hosts, args.repeats, args.warmup = "4", 0, 1, 5
    ns = [int(x) for x in args.nprocs.split(",") if x.strip()]
    if not ns or min(ns) < 3:
        parser.error("--nprocs: every count must be >= 3 (the group keeps at least 2)")
    if args.repeats < 1 or args.netns_hosts < 0 or args.netns_nprocs < 3:
        parser.error("--repeats >= 1, --netns-hosts >= 0, --netns-nprocs >= 3")
    train = TrainArgs(args.features, args.batch, args.step_time, args.checkpoint_every)
    load = os.getloadavg()[0]
    shown = sorted({*ns, *([args.netns_nprocs] if args.netns_hosts else [])})
    print(machine_line(shown) + f"; load average {load:.1f} before the run\n", flush=True)
    try:
        rows = [run_case(local_site(n), 1, args, train) for n in ns]
        if args.netns_hosts:
            rows.append(netns_row(args.netns_nprocs, args.netns_hosts, args, train))
    except BenchError as e:
        print(f"elastic bench: {e}", file=sys.stderr)
        return 1
    notes = (f"A linear model of {train.features} float64 weights, a global batch of "
             f"{train.batch} rows, {train.step_time:g} s of pretend compute per step; the whole "
             f"restart saves a checkpoint every {train.checkpoint_every} steps. One-minute load "
             f"average {load:.1f} before the run. From imports: from the replacement's "
             "time.time() right after `import cluster` in its script (under `python -m worker` "
             "its server is up and its peers have answered by then). Members' pause: the longest "
             "time a member went without a step while the replacement joined. Old job stopped: "
             "from the kill until every task of the old job exited.")
    table = result_table(rows, notes)
    print("\n" + markdown(table), flush=True)
    if args.json:
        write_result(args.json, name=args.json.stem, title=TITLE, summary=SUMMARY,
                     script="elastic.py", argv=list(sys.argv[1:] if argv is None else argv),
                     tables=[table], figures=result_figures(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
