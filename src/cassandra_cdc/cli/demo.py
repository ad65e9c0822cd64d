"""``cassandra-cdc demo``: the whole system live on one machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def demo(
    duration: Annotated[Optional[float], typer.Option(
        help="Seconds of writing, then stop by itself (default: until Ctrl-C). Starting Spark before, and "
             "catching up, checking and stopping after, take a minute or more.")] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Exit with status 1 when the final check fails (for CI).")] = False,
    workdir: Annotated[Path, typer.Option(
        help="Where the broker, the nodes' cdc_raw, configurations, checkpoint and logs live.")] = Path("demo-data"),
    keep: Annotated[bool, typer.Option("--keep", help="Keep the work directory afterwards.")] = False,
    rate: Annotated[float, typer.Option(help="CQL statements per second the simulated cluster runs.")] = 200.0,
    seed: Annotated[int, typer.Option(help="Seed of the workload.")] = 1,
    keys: Annotated[int, typer.Option(help="Partitions per table.")] = 100,
    alter_at: Annotated[Optional[float], typer.Option(
        help="Seconds into the writing at which the schema changes (default: 40% of --duration, or 30 s).")] = None,
    catchup_timeout: Annotated[float, typer.Option(
        help="After writing, wait at most this long for the events to catch up with the tables "
             "(less when no event comes for 120 s).")] = 300.0,
    live: Annotated[Optional[bool], typer.Option(
        "--live/--plain",
        help="Live terminal view, or a summary line every 10 s (default: live on a terminal).")] = None,
) -> None:
    """Run the whole system on this machine and watch Cassandra changes become events.

    Starts an embedded Kafka-protocol broker on loopback, a simulated 3-node Cassandra 4.1 cluster (RF=3)
    writing a realistic workload to three cdc_raw directories (inserts, updates, deletes, TTLs, collections,
    counters, a table without CDC, one ALTER TABLE), one `cassandra-cdc agent` per node and the
    `cassandra-cdc pipeline`, as separate processes with the configurations written to --workdir. Shows the
    events as they come; at the end, replays every event into tables and compares them with the table state
    the simulator computed from the statements. Ctrl-C stops cleanly (twice: at once); everything started
    is stopped and the work directory removed (unless --keep, or something failed).
    """
    from ..demo import DemoOptions, run_demo

    if rate <= 0 or keys < 1:
        raise typer.BadParameter("--rate must be positive and --keys at least 1")
    options = DemoOptions(workdir=workdir, duration=duration, check=check, keep=keep, rate=rate, seed=seed,
                          keys=keys, alter_at=alter_at, catchup_timeout=catchup_timeout, live=live)
    raise typer.Exit(run_demo(options))
