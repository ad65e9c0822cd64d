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


class LogFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"


# A choice, so that a typo is a usage error (exit status 2) before anything starts.
LogLevelOption = Annotated[LogLevel, typer.Option(case_sensitive=False, help="How much to log.")]
# The environment variable also reaches the commands other commands start (the demo's agents and pipeline).
LogFormatOption = Annotated[LogFormat, typer.Option(
    case_sensitive=False, envvar="CASSANDRA_CDC_LOG_FORMAT",
    help="Log lines as text, or as JSON objects (time, level, logger, message).")]
