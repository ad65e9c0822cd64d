"""Entry point of the ``cassandra-cdc`` command."""

import typer

app = typer.Typer(help="Change data capture for Apache Cassandra.", no_args_is_help=True)


def main() -> None:
    app()
