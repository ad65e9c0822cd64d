"""A class data sharing archive of the Spark driver's classes: a local session starts in half the time.

Example::

    python -m cassandra_cdc.pipeline.class_archive .jvm/spark-classes.jsa
    export CASSANDRA_CDC_SPARK_CLASS_ARCHIVE=$PWD/.jvm/spark-classes.jsa
    cassandra-cdc pipeline --config pipeline.yaml

A JVM that starts Spark loads and verifies tens of thousands of classes from Spark's jars: most of a
session's start, and much of its first micro-batch. With the JDK's application class data sharing it maps
them, parsed and verified, from an archive instead (benchmarks/RESULTS.md). This module writes the archive
by running what the pipeline runs (a local session, a streaming query whose state a Python stateful
processor keeps in RocksDB), the JVM dumping the classes it loaded as it exits.

``spark_session`` gives the driver JVM it starts the archive named by ``CASSANDRA_CDC_SPARK_CLASS_ARCHIVE``
(``make install`` writes ``.jvm/spark-classes.jsa``; ``make run`` and ``make test`` use it). An archive holds
the classes of one JDK and one set of jars: a JVM of another JDK, or with other jars first on its class
path, does not use it and starts as it would without. Under spark-submit the driver JVM is spark-submit's:
give it ``--driver-java-options -XX:SharedArchiveFile=PATH`` there.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
from pyspark import SparkContext
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from pyspark.sql.types import LongType, StructField, StructType

from .spark_session import DEFAULT_MASTER, QUIET_CLASS_SHARING, spark_session

# Micro-batches with data the workload runs: the first plans the query and opens the state stores, the later
# ones commit state versions (RocksDB's changelog, the state store's maintenance).
WORKLOAD_BATCHES = 3
WORKLOAD_TIMEOUT = 300.0
_COUNT = StructType([StructField("rows", LongType())])


class _RowCounter(StatefulProcessor):
    """Counts each key's rows in a ``ValueState``: state reads and writes through the Python state server."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", _COUNT)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        stored = self.count.get()
        total = (stored[0] if stored else 0) + sum(len(frame) for frame in rows)
        self.count.update((total,))
        yield pd.DataFrame({"key": [key[0]], "rows": [total]})


def write_class_archive(archive: Path, work_dir: Path) -> None:
    """Run the workload in a local session whose JVM writes ``archive`` as it exits; wait for it to exit."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)
    # Replaces spark_session's driver options, an archive to use among them: a JVM that uses a dynamic
    # archive cannot dump one.
    java_options = f"-XX:ArchiveClassesAtExit={archive} {QUIET_CLASS_SHARING}"
    spark = spark_session(DEFAULT_MASTER, "cassandra-cdc-class-archive", 2,
                          {"spark.driver.extraJavaOptions": java_options})
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
             .withColumn("key", F.col("value") % 4).groupBy("key")
             .transformWithStateInPandas(_RowCounter(), "key long, rows long", "Update", "None")
             .writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", str(work_dir / "checkpoint"))
             .trigger(processingTime="1 second").start())
    deadline = time.monotonic() + WORKLOAD_TIMEOUT
    while sum(1 for progress in query.recentProgress if progress["numInputRows"]) < WORKLOAD_BATCHES:
        if not query.isActive or time.monotonic() > deadline:
            raise RuntimeError(f"the class archive's workload did not run {WORKLOAD_BATCHES} micro-batches: "
                               f"{query.exception() or 'timed out'}")
        time.sleep(0.5)
    query.stop()
    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]  # the JVM PySpark started
    spark.stop()
    jvm.stdin.close()  # the JVM exits when its input ends, writing the archive first
    if jvm.wait(WORKLOAD_TIMEOUT) != 0 or not archive.is_file():
        raise RuntimeError(f"the JVM exited with status {jvm.returncode} without writing {archive}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", type=Path, help="the archive to write (replaced if it exists)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="class-archive-") as work_dir:
        started = time.monotonic()
        write_class_archive(args.archive.resolve(), Path(work_dir))
    size_mib = args.archive.stat().st_size >> 20
    print(f"wrote {args.archive} ({size_mib} MiB) in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
