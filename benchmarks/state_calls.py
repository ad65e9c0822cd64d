"""What a ``MapState`` read and write cost from a Python worker: one call at a time, and written ahead.

    python benchmarks/state_calls.py [--keys 2000] [--value-bytes 200 2000] [--batches 8]

A ``transformWithStateInPandas`` query (local[2], RocksDB state with changelog checkpointing, the JVM as
the pipeline runs it) of one grouping key reads and then writes the same ``--keys`` keys of a ``MapState``
per micro-batch (each read finds the value the batch before wrote), through ``MapStateRequests`` (requests
written ahead of their answers) or through PySpark's ``getValue``/``updateValue``; printed: microseconds
per read and per write (median over the batches after the first), for each value size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Iterator

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from cassandra_cdc.pipeline.spark_session import spark_session
from cassandra_cdc.pipeline.state_requests import MapStateRequests

KEY = StructType([StructField("key", IntegerType())])
VALUE = StructType([StructField("value", BinaryType())])
TIMES = StructType([StructField("read_us", LongType()), StructField("write_us", LongType())])
# The workers cannot import this script: the processor goes to them whole.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Timed(StatefulProcessor):
    def __init__(self, keys: int, value_bytes: int, written_ahead: bool) -> None:
        self.keys, self.value_bytes, self.written_ahead = keys, value_bytes, written_ahead

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getMapState("values", KEY, VALUE)
        self.requests = MapStateRequests(self.state, "values")
        self.batch = 0

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        for _ in rows:
            pass
        keys = [(i,) for i in range(self.keys)]  # from the second batch on, each read finds its value
        value = (os.urandom(self.value_bytes),)
        started = time.perf_counter()
        if self.written_ahead:
            self.requests.get_all(keys)
        else:
            for one in keys:
                self.state.getValue(one)
        read = time.perf_counter()
        if self.written_ahead:
            self.requests.update_all((one, value) for one in keys)
        else:
            for one in keys:
                self.state.updateValue(one, value)
        written = time.perf_counter()
        self.batch += 1
        yield pd.DataFrame({"read_us": [int((read - started) / self.keys * 1e6)],
                            "write_us": [int((written - read) / self.keys * 1e6)]})


def measure(keys: int, value_bytes: int, written_ahead: bool, batches: int) -> dict[str, Any]:
    spark = spark_session(app_name="state-calls-benchmark", shuffle_partitions=1)
    times: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load().selectExpr("0 AS g")
                 .groupBy("g").transformWithStateInPandas(Timed(keys, value_bytes, written_ahead), TIMES, "Update",
                                                          "None")
                 .writeStream.foreachBatch(lambda frame, _: times.extend(
                     (row.read_us, row.write_us) for row in frame.collect()))
                 .option("checkpointLocation", checkpoint).trigger(processingTime="1 second").start())
        while len(times) < batches + 1 and query.isActive:
            time.sleep(0.5)
        query.stop()
    measured = times[1:]  # the first batch starts the worker
    return {"value_bytes": value_bytes, "written_ahead": written_ahead, "keys": keys,
            "read_us": statistics.median(t[0] for t in measured), "write_us": statistics.median(t[1] for t in measured),
            "load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=2000, help="keys read and written per micro-batch")
    parser.add_argument("--value-bytes", type=int, nargs="+", default=[200, 2000], help="sizes of the values")
    parser.add_argument("--batches", type=int, default=8, help="micro-batches measured per case")
    options = parser.parse_args()
    for value_bytes in options.value_bytes:
        for written_ahead in (False, True):
            print(json.dumps(measure(options.keys, value_bytes, written_ahead, options.batches)), flush=True)


if __name__ == "__main__":
    main()
