"""Options shared by several commands."""

from __future__ import annotations

import enum
from typing import Annotated

import typer


class LogLevel(str, enum.Enum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


# A choice, so that a typo is a usage error (exit status 2) before anything starts.
LogLevelOption = Annotated[LogLevel, typer.Option(case_sensitive=False, help="How much to log.")]
