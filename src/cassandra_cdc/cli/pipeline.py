"""``cassandra-cdc pipeline``: the Spark job turning raw records into change events."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..settings import ConfigError, configure_logging
from .options import LogFormat, LogFormatOption, LogLevel, LogLevelOption


def pipeline(
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="Pipeline YAML configuration file.")] = None,
    bootstrap_servers: Annotated[Optional[str], typer.Option(help="Kafka bootstrap servers.")] = None,
    server: Annotated[Optional[str], typer.Option(help="Logical cluster name the agents use (topic prefix).")] = None,
    checkpoint: Annotated[Optional[str], typer.Option(
        help="Spark checkpoint directory (offsets and state): a path or a Hadoop URI (hdfs://, s3a://...).",
    )] = None,
    format: Annotated[Optional[str], typer.Option("--format", help="Event format: json or avro.")] = None,
    master: Annotated[Optional[str], typer.Option(
        help="Spark master (default local[2]; a local one retries failed tasks, see spark.master).")] = None,
    duration: Annotated[Optional[float], typer.Option(help="Stop after this many seconds.")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(
        help="Port of the driver's Prometheus metrics, /healthz and /readyz (metrics.port; 0: off).")] = None,
    reset_checkpoint: Annotated[bool, typer.Option(
        "--reset-checkpoint", help="Start on an empty checkpoint although an earlier run's output is in "
                                   "Kafka: every event is written again.")] = False,
    accept_gap: Annotated[bool, typer.Option(
        "--accept-gap", help="Start although raw records were deleted before the pipeline read them "
                             "(kafka.accept_gap; bootstrap the tables first).")] = False,
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Run the Spark Structured Streaming job: read the raw topic, merge every replica's copy per
    primary key with Cassandra's reconciliation rules (state in RocksDB, checkpointed), and write one
    Debezium-style event per real change to <server>.<keyspace>.<table>.

    Configure with a YAML file (see docs/pipeline.md) or the flags, which override it. The same job
    runs under spark-submit (see docs/pipeline.md). Stops cleanly on Ctrl-C or after --duration.
    """
    from ..kafka.security import KafkaUnreachable
    from ..pipeline.pipeline_config import load_config
    from ..pipeline.streaming_job import KAFKA_PROBE_TIMEOUT, check_checkpoint, run

    configure_logging(log_level.value, log_format.value)
    overrides = {"kafka.bootstrap_servers": bootstrap_servers, "server": server, "checkpoint": checkpoint,
                 "output.format": format, "spark.master": master, "metrics.port": metrics_port,
                 "reset_checkpoint": reset_checkpoint or None,  # None: as the file says
                 "kafka.accept_gap": accept_gap or None}
    try:
        settings = load_config(config, overrides)
        try:
            check_checkpoint(settings, kafka_timeout=KAFKA_PROBE_TIMEOUT)
        except KafkaUnreachable:
            pass  # ``run`` waits for Kafka, then checks
        status = run(settings, duration)  # checks a checkpoint outside this host once Spark runs
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    raise typer.Exit(status)
