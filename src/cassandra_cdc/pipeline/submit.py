"""The file spark-submit runs: ``spark-submit [options] <this file> pipeline --config pipeline.yaml``.

spark-submit runs a file as a script, not a module of a package, so this file imports the package
absolutely: ``cassandra_cdc`` must be installed where the driver runs, or shipped with ``--py-files``.
Its arguments are those of the ``cassandra-cdc`` command.
"""

from cassandra_cdc.cli.main import app

if __name__ == "__main__":
    app(prog_name="cassandra-cdc")
