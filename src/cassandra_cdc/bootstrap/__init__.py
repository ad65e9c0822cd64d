"""Bootstrap: the rows a table already has, read from its SSTables and published as snapshot records.

CDC sees only the writes made after it starts. ``bootstrap`` reads a snapshot of the table
(``nodetool snapshot`` on every node) with a Spark batch job, one task per SSTable (large ones split at
partition boundaries), and publishes every partition, with its real cell timestamps, TTLs and
tombstones, to the same raw topic as the agents, flagged as snapshot data. The pipeline merges those
records with the live changes and with the other replicas' copies by Cassandra's own rules, so it can
run while the agents stream: a row emits ``op = r`` if the pipeline had not seen it, nothing if CDC
already brought a newer state, and a row changed during the bootstrap ends in its latest state.

::

    spark = spark_session("local[4]")
    report = run_bootstrap(spark, load_config(Path("pipeline.yaml")), "shop.orders",
                           ["/backup/node1/shop/orders-5a1c.../snapshots/t1", "/backup/node2/...", ...])
    print(report.summary())

or, from a shell::

    cassandra-cdc bootstrap --config pipeline.yaml --table shop.orders \\
        --sstables /backup/*/shop/orders-*/snapshots/t1

Completed tasks are recorded (``<checkpoint>/bootstrap/<keyspace>.<table>.json``): a run that was
interrupted resumes without reading them again.
"""

from .bootstrap_errors import BootstrapError
from .bootstrap_job import BootstrapReport, run_bootstrap
from .task_plan import DEFAULT_TASK_BYTES, SSTableSlice, plan
from .sstable_records import RecordBuilder, RecordLimits

__all__ = ["BootstrapError", "BootstrapReport", "DEFAULT_TASK_BYTES", "RecordBuilder", "RecordLimits",
           "SSTableSlice", "plan", "run_bootstrap"]
