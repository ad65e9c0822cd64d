"""Entry point of the ``cassandra-cdc`` command."""

from importlib.metadata import version

import typer

from . import agent, config
from .bootstrap import bootstrap
from .demo import demo
from .dump import dump
from .pipeline import pipeline
from .tail import tail

app = typer.Typer(
    help="Change data capture for Apache Cassandra: read commit logs, stream changes to Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command()(dump)
app.add_typer(agent.app, name="agent")
app.add_typer(config.app, name="config")
app.command()(pipeline)
app.command()(bootstrap)
app.command()(demo)
app.command()(tail)


def _print_version(requested: bool) -> None:
    if requested:
        typer.echo(f"cassandra-cdc {version('cassandra-cdc')}")
        raise typer.Exit()


@app.callback()
def cli(
    show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print the version and exit."),
) -> None:
    """Change data capture for Apache Cassandra."""


def main() -> None:
    app()
