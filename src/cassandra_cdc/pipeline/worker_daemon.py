"""Spark's Python worker daemon (``spark.python.daemon.module``) with the pipeline's imports done once.

Spark forks a Python worker from the daemon for each task, and the workers of the stateful operator
and of the sink are not reused across micro-batches: each one imported pandas, pyarrow, pyspark.sql
and this package again, about a second of CPU per worker and most of the Python CPU of a small
micro-batch (py-spy, benchmarks/RESULTS.md). Imported here, before the daemon forks, they are shared
by every worker.
"""

from __future__ import annotations

import pandas  # noqa: F401
import pyarrow  # noqa: F401
from pyspark import daemon

from . import change_processor, event_sink, kafka_source  # noqa: F401

if __name__ == "__main__":
    daemon.manager()
