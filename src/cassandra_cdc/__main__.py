"""``python -m cassandra_cdc``: the ``cassandra-cdc`` command (how the demo starts its agents and pipeline)."""

from .cli.main import app

app(prog_name="cassandra-cdc")
