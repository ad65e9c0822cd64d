"""``cassandra-cdc agent``: run the per-node agent, or show where it is."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..agent import Agent, ConfigError, load_config
from ..agent.segment_status import segment_statuses
from ..settings import configure_logging
from .options import LogFormat, LogFormatOption, LogLevel, LogLevelOption

app = typer.Typer(no_args_is_help=False)

ConfigOption = Annotated[Optional[Path], typer.Option("--config", "-c", help="Agent YAML configuration file.")]


@app.callback(invoke_without_command=True)
def agent(
    ctx: typer.Context,
    config: ConfigOption = None,
    cdc_raw: Annotated[Optional[Path], typer.Option(help="The node's cdc_raw directory.")] = None,
    schema: Annotated[Optional[Path], typer.Option(help="CQL schema file of the cluster.")] = None,
    bootstrap_servers: Annotated[Optional[str], typer.Option(help="Kafka bootstrap servers.")] = None,
    server: Annotated[Optional[str], typer.Option(help="Logical cluster name, prefix of the topics.")] = None,
    node_id: Annotated[Optional[str], typer.Option(help="This node's id (default: host name).")] = None,
    state_dir: Annotated[Optional[Path], typer.Option(help="Where positions are kept.")] = None,
    after_completed: Annotated[Optional[str], typer.Option(
        help="delete | keep | archive:DIR — what to do with fully published segments.")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(help="Prometheus port (0: off).")] = None,
    accept_lost_records: Annotated[bool, typer.Option(
        help="Start even though the raw topic lost records Kafka had acknowledged (kafka.accept_lost_records).")
    ] = False,
    accept_segment_loss: Annotated[bool, typer.Option(
        help="Go on past segments that left cdc_raw before they were published, found at this start (logged "
             "and counted), although segment_loss is 'stop' (accept_segment_loss).")] = False,
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Tail cdc_raw and publish every change of a CDC table to Kafka.

    Configure with a YAML file (--config; see docs/configuration.md) or, for a quick start, with the
    flags alone, which override the file. SIGTERM finishes in-flight deliveries, saves the position
    and exits 0; after any crash the agent resumes from its last saved position.
    """
    if ctx.invoked_subcommand is not None:
        return
    overrides = {"cdc_raw": cdc_raw, "schema.file": schema, "kafka.bootstrap_servers": bootstrap_servers,
                 "server": server, "node_id": node_id, "state_dir": state_dir, "metrics.port": metrics_port,
                 "kafka.accept_lost_records": accept_lost_records or None,
                 "accept_segment_loss": accept_segment_loss or None}
    if after_completed is not None:
        mode, _, directory = after_completed.partition(":")
        overrides["cleanup.mode"] = mode
        overrides["cleanup.archive_dir"] = directory or None
    configure_logging(log_level.value, log_format.value)
    try:
        settings = load_config(config, overrides)
        runner = Agent(settings)
    except (ConfigError, ValueError, OSError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    except KeyboardInterrupt:  # while waiting for the cluster to answer: nothing was read yet
        raise typer.Exit(130)
    # What startup made (modules, settings, schema: tens of thousands of objects) lives as long as the process:
    # frozen, the cyclic garbage collector's full collections walk only what came since.
    gc.collect()
    gc.freeze()
    raise typer.Exit(runner.run())


# How often --until-drained looks at cdc_raw and the agent's positions again.
DRAINED_POLL_SECONDS = 1.0


@app.command()
def status(config: ConfigOption = None,
           cdc_raw: Annotated[Optional[Path], typer.Option(help="The node's cdc_raw directory.")] = None,
           state_dir: Annotated[Optional[Path], typer.Option(help="The agent's state directory.")] = None,
           until_drained: Annotated[bool, typer.Option(
               help="Once the node has stopped (decommissioned, or drained and stopped): wait until the "
                    "agent has published everything in cdc_raw, each segment whole or up to the offset "
                    "Cassandra made durable, before the agent is stopped; exit 1 if --timeout passes "
                    "first.")] = False,
           timeout: Annotated[float, typer.Option(help="Seconds --until-drained waits at most.")] = 600.0,
           ) -> None:
    """Show, per segment in cdc_raw, what Cassandra made durable and what the agent has published."""
    if config is not None:
        try:
            settings = load_config(config, {"cdc_raw": cdc_raw, "state_dir": state_dir})
        except ConfigError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2)
        cdc_raw, state_dir = settings.cdc_raw, settings.state_dir
    if cdc_raw is None or state_dir is None:
        typer.echo("error: give --config, or --cdc-raw and --state-dir", err=True)
        raise typer.Exit(2)
    if not cdc_raw.is_dir():
        typer.echo(f"error: {cdc_raw} is not a directory (the node's cdc_raw_directory)", err=True)
        raise typer.Exit(2)
    deadline = time.monotonic() + timeout
    while True:
        try:
            rows = segment_statuses(cdc_raw, state_dir)
        except ValueError as error:  # an unreadable positions.json, named in the message
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2)
        if not until_drained or all(row.drained for row in rows) or time.monotonic() > deadline:
            break
        time.sleep(DRAINED_POLL_SECONDS)
    table = Table("segment", "durable offset", "Cassandra", "acknowledged", "lag bytes", "agent")
    for row in rows:
        table.add_row(row.segment, _text(row.durable_offset), "COMPLETED" if row.completed_by_cassandra else "writing",
                      _text(row.acknowledged), _text(row.lag_bytes), "published" if row.published else "in progress")
    Console().print(table)
    if until_drained:
        undrained = [row.segment for row in rows if not row.drained]
        if undrained:
            typer.echo(f"not drained after {timeout:.0f} s: {', '.join(undrained)}", err=True)
            raise typer.Exit(1)
        typer.echo(f"drained: the agent has published everything Cassandra made durable in {cdc_raw}")


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)
