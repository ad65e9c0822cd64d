"""The ``cassandra-cdc`` command line."""

from .main import main

__all__ = ["main"]
