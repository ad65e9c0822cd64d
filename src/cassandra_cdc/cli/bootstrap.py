"""``cassandra-cdc bootstrap``: publish a table's existing rows from its SSTables (a Spark batch job)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..settings import ConfigError, configure_logging
from .options import LogFormat, LogFormatOption, LogLevel, LogLevelOption


def bootstrap(
    table: Annotated[str, typer.Option("--table", "-t", help="The table to bootstrap, as KEYSPACE.TABLE.")],
    sstables: Annotated[list[str], typer.Option(
        "--sstables", help="One node's snapshot of the table: a directory of SSTables (e.g. "
                           "<data>/KS/TABLE-ID/snapshots/TAG), a Data.db file, a glob (quoted or expanded by "
                           "the shell), or NODE=PATH to name the node. Repeat for each node.")] = [],
    more_sstables: Annotated[Optional[list[str]], typer.Argument(
        metavar="DIR", help="More snapshot directories (what a shell glob after --sstables expands to).",
        show_default=False)] = None,
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="Pipeline YAML configuration file "
                                                   "(Kafka, topics, checkpoint, Spark settings).")] = None,
    schema: Annotated[Optional[list[Path]], typer.Option(
        "--schema", "-s", help="CQL file defining the table (with user types it uses). Needed only when the "
                               "schema topic does not have the table yet.")] = None,
    master: Annotated[Optional[str], typer.Option(
        help="Spark master, e.g. local[4] (default: the config's, else local[2]; a local one retries "
             "failed tasks, see spark.master; under spark-submit, spark-submit's).")] = None,
    bootstrap_servers: Annotated[Optional[str], typer.Option(help="Kafka bootstrap servers.")] = None,
    server: Annotated[Optional[str], typer.Option(
        help="Logical cluster name the agents use (topic prefix).")] = None,
    checkpoint: Annotated[Optional[str], typer.Option(
        help="The pipeline's checkpoint: a path or a Hadoop URI (file://, hdfs://, s3a://...); progress is "
             "kept in bootstrap/ in it.")] = None,
    progress_file: Annotated[Optional[Path], typer.Option(
        help="Where to record completed tasks instead.")] = None,
    restart: Annotated[bool, typer.Option("--restart", help="Forget earlier progress: read every SSTable "
                                                            "again.")] = False,
    task_mb: Annotated[int, typer.Option(
        min=1, help="Split Data.db files larger than this (MB, uncompressed) into several tasks.")] = 64,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Publish the rows a table already has, read from a snapshot of its SSTables on every node, to the
    raw topic, so that the pipeline's output starts with the whole table, not just later changes.

    Take a snapshot on each node (nodetool snapshot -t TAG KEYSPACE), make the directories readable
    where Spark runs, and give one per node. Reads SSTable formats ma-me, na-nc, oa (big) and da (bti).
    Every SSTable is one Spark task (large ones several); each row keeps its cell timestamps, TTLs and
    tombstones and is flagged as snapshot data, so the pipeline emits op=r for rows it had not seen and
    merges the rest with what the agents stream: run it while they run, no need to stop writes.

    An interrupted run resumes where it stopped (completed tasks are recorded). Example:

        cassandra-cdc bootstrap -c pipeline.yaml --table shop.orders
            --sstables '/backup/*/data/shop/orders-*/snapshots/t1'
    """
    from ..bootstrap import BootstrapError, run_bootstrap
    from ..pipeline.pipeline_config import load_config
    from ..pipeline.spark_session import session_master, spark_session

    configure_logging(log_level.value, log_format.value)
    paths = [*sstables, *(more_sstables or [])]
    if not paths:
        raise typer.BadParameter("give at least one snapshot directory", param_hint="--sstables")
    overrides = {"kafka.bootstrap_servers": bootstrap_servers, "server": server, "checkpoint": checkpoint,
                 "spark.master": master}
    try:
        settings = load_config(config, overrides)
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    sessions = []

    def start_spark() -> Any:  # only once the plan is made and there is something to run
        from pyspark import SparkContext

        running = SparkContext._active_spark_context is not None  # embedded: not ours to stop
        session = spark_session(session_master(settings.spark.master), "cassandra-cdc-bootstrap",
                                settings.spark.shuffle_partitions, settings.spark.conf)
        if not running:
            sessions.append(session)
        return session

    try:
        report = run_bootstrap(start_spark, settings, table, paths, schema or None, progress, restart=restart,
                               progress_file=progress_file, target_task_bytes=task_mb << 20)
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    except BootstrapError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1)
    finally:
        for session in sessions:
            session.stop()
    typer.echo(report.summary())
