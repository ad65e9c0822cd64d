"""The SparkSession the pipeline runs in, and the reason for each of its settings.

- Python workers run this interpreter (``sys.executable``): otherwise they start the system python,
  which has no pyarrow, and fail later with a misleading "Python worker failed to connect back".
  A variable already set (spark-submit, a cluster's environment) is left alone.
- State lives in RocksDB (required by ``transformWithState``); the number of shuffle partitions is the
  number of state stores and is fixed in the checkpoint, so it is small (the default 200 is far too
  many on a few cores) and must not change for an existing checkpoint.
- RocksDB commits write a changelog of the batch's changes, and snapshots are made in the background
  every few batches: without it, every micro-batch copies, zips and syncs a snapshot of each state
  store, most of a small batch's time. Spark switches an existing
  checkpoint over on its own.
- RocksDB does not count the state's rows: counting reads each key before every write (to know whether it
  is new), a random read of the store per page written, and the pipeline does not use the count (the
  state operator's ``numRowsTotal`` metric then stays 0). benchmarks/RESULTS.md measured the difference.
- With a local master, checkpoint files are written through Hadoop's ``FileSystem`` API, not
  ``FileContext``: without Hadoop's native library (pip's PySpark has none), every ``FileContext``
  rename starts ``readlink`` processes, which made the state store's commit and the offset and commit
  logs the slowest steps of a micro-batch (benchmarks/RESULTS.md). On the local file system both rename
  atomically.
- Python workers fork from ``cassandra_cdc.pipeline.worker_daemon``, which has pandas, pyarrow and the
  pipeline imported already (see that module).
- The driver JVM maps Spark's classes from the class data sharing archive named by
  ``CASSANDRA_CDC_SPARK_CLASS_ARCHIVE``, when set (class_archive.py): a session starts in half the time.
- Under spark-submit the master is spark-submit's: ``master=None`` leaves it alone.
- A local master retries a failed task as a cluster does (``local_master_with_retries``): Spark's
  ``local[N]`` gives each task one attempt and ignores ``spark.task.maxFailures``, so a single lost Python
  worker (killed, or one that did not connect back in time on a loaded machine) failed the query. The
  sink and the state store are built for task retries (event_sink.py).
- Local masters bind to loopback. No UI, warnings-only logs, Arrow for pandas conversions, UTC session
  time zone.
- The Python state server logs a warning for every read of a map state key that is absent, which the
  pipeline's state reads are for every page not written yet: a line per new page, millions on a large
  table's first load. Its warnings are off in this JVM (the driver, where a local master runs the
  tasks); a cluster's executors take it from their log4j2 configuration (docs/pipeline.md).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
KAFKA_SOURCE_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
FILE_SYSTEM_CHECKPOINT_FILES = \
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
WORKER_DAEMON = "cassandra_cdc.pipeline.worker_daemon"
STATE_SERVER_LOGGER = "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer"
DEFAULT_MASTER = "local[2]"
# The class data sharing archive the driver JVMs that spark_session starts map Spark's classes from.
CLASS_ARCHIVE_VARIABLE = "CASSANDRA_CDC_SPARK_CLASS_ARCHIVE"
# The JVM's class data sharing logs errors only: an archive it cannot use prints nothing among a job's output.
QUIET_CLASS_SHARING = "-Xlog:cds*=error"
# Spark's default spark.task.maxFailures, the attempts a cluster gives each task.
TASK_ATTEMPTS = 4
TASK_ATTEMPTS_SETTING = "spark.task.maxFailures"
# The local masters Spark gives a single attempt per task: local, local[N] and local[*].
_LOCAL_WITHOUT_RETRIES = re.compile(r"local(?:\[\s*(\d+|\*)\s*\])?")


def submitted_master() -> bool:
    """Whether spark-submit started this process: it starts the JVM first and hands its gateway to
    Python in this variable, with the master and settings it was given."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session_master(configured: str | None) -> str | None:
    """The master a job asks for: none under spark-submit (spark-submit's own), else the configured one,
    ``DEFAULT_MASTER`` by default."""
    return None if submitted_master() else configured or DEFAULT_MASTER


def local_master_with_retries(master: str, attempts: int) -> str:
    """``master`` with ``attempts`` per task when it is a local master that allows one (``local``,
    ``local[N]``, ``local[*]`` become ``local[N,attempts]``); any other master is returned as it is: a
    cluster's, ``local-cluster[...]`` (both read ``spark.task.maxFailures``) and ``local[N,F]`` (its
    own F)."""
    local = _LOCAL_WITHOUT_RETRIES.fullmatch(master.strip())
    if local is None:
        return master
    return f"local[{local.group(1) or 1},{attempts}]"


def spark_session(master: str | None = DEFAULT_MASTER, app_name: str = "cassandra-cdc",
                  shuffle_partitions: int = 2,
                  extra_conf: dict[str, Any] | None = None) -> SparkSession:
    """Get (or create) the session; ``extra_conf`` is applied last and wins over every default here.

    A local ``master`` without task retries gets as many attempts per task as ``extra_conf``'s
    ``spark.task.maxFailures``, else as a cluster's default (``local_master_with_retries``).

    ``getOrCreate`` returns an already running session as is, except for runtime SQL settings it
    can still change: static settings (master, UI, provider class) only take effect in a new session.
    """
    for variable in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        os.environ.setdefault(variable, sys.executable)
    conf: dict[str, Any] = {
        "spark.sql.shuffle.partitions": shuffle_partitions,
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": True,
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": False,
        "spark.ui.enabled": False,
        "spark.ui.showConsoleProgress": False,
        "spark.sql.execution.arrow.pyspark.enabled": True,
        "spark.sql.session.timeZone": "UTC",
        "spark.python.daemon.module": WORKER_DAEMON,
    }
    if master is not None and master.startswith("local"):
        # Everything is on this host: no warning that the hostname resolves to a loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        conf["spark.sql.streaming.checkpointFileManagerClass"] = FILE_SYSTEM_CHECKPOINT_FILES
    class_archive = os.environ.get(CLASS_ARCHIVE_VARIABLE)
    archive_options = class_archive_options(class_archive) if master is not None and class_archive else []
    if archive_options:
        conf["spark.driver.extraJavaOptions"] = " ".join(archive_options)
    conf.update(extra_conf or {})
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        attempts = int(conf.get(TASK_ATTEMPTS_SETTING, TASK_ATTEMPTS))
        builder = builder.master(local_master_with_retries(master, attempts))
    for key, value in conf.items():
        builder = builder.config(key, str(value).lower() if isinstance(value, bool) else str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    log4j = spark._jvm.org.apache.logging.log4j  # type: ignore[attr-defined]
    log4j.core.config.Configurator.setLevel(STATE_SERVER_LOGGER, log4j.Level.ERROR)
    return spark


def class_archive_options(archive: str) -> list[str]:
    """The driver JVM's options to map its classes from ``archive`` (class_archive.py), none when there is no
    such file (logged). A JVM that cannot use the archive (another JDK, other jars) starts without it, and
    without printing why among the job's output."""
    if not Path(archive).is_file():
        log.warning("%s names %s, which does not exist: the Spark driver starts without a class archive "
                    "(python -m cassandra_cdc.pipeline.class_archive %s writes one)", CLASS_ARCHIVE_VARIABLE,
                    archive, archive)
        return []
    return [f"-XX:SharedArchiveFile={shlex.quote(archive)}", QUIET_CLASS_SHARING]


def kafka_format_available(spark: SparkSession) -> bool:
    """Whether Spark's own ``format("kafka")`` can be used (its connector jar is on the classpath).

    Without the jar, ``readStream.format("kafka")`` fails only when the query starts
    (``KAFKA_DATA_SOURCE_NOT_ENABLED``); the pipeline then uses ``cdc-kafka`` (pipeline.source) instead.
    Never raises: a session without a JVM gateway (Spark Connect) answers False.
    """
    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        if jvm is None:
            return False
        # The context class loader sees jars added with spark.jars / --jars, the system one does not.
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(KAFKA_SOURCE_PROVIDER, False, loader)
        return True
    except Exception:  # Py4JJavaError (ClassNotFoundException), Py4JError, AttributeError
        return False


__all__ = ["DEFAULT_MASTER", "kafka_format_available", "local_master_with_retries", "session_master",
           "spark_session", "submitted_master"]
