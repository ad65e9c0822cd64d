"""Entry point of the ``cassandra-cdc`` command."""

import importlib
import sys
from importlib.metadata import version
from typing import Any

import typer
from typer.core import TyperGroup

from . import agent, config
from .bootstrap import bootstrap
from .demo import demo
from .dump import dump
from .pipeline import pipeline
from .tail import tail

# Click's exceptions, wherever this version of typer takes click from (newer ones vendor it).
_click_errors = importlib.import_module(typer.BadParameter.__module__)


class _OneLineErrors(TyperGroup):
    """Bad arguments reported as the commands report their own errors: one line ``error: ...``, exit status
    2 (instead of a framed usage box)."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            status = super().main(*args, standalone_mode=False, **kwargs)
        except getattr(_click_errors, "NoArgsIsHelpError", ()) as error:
            sys.exit(error.exit_code)  # the help is printed already
        except _click_errors.ClickException as error:
            typer.echo(f"error: {error.format_message()}", err=True)
            sys.exit(error.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        # Without standalone mode a command's typer.Exit comes back as its status, a plain return as None.
        sys.exit(status if isinstance(status, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
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
