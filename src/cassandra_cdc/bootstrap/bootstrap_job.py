"""The bootstrap as a Spark batch job: plan, publish the schema, run one task per SSTable (range), record
progress, report."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from confluent_kafka import KafkaException, Producer

from ..kafka import RAW_TOPIC_PARTITIONS
from ..kafka.admin import TopicCreationFailed, admin_client, create_missing_topics
from ..kafka.schema_catalog import SchemaCatalog
from ..kafka.security import broker_metadata
from ..pipeline.checkpoint_files import checkpoint_files
from ..pipeline.pipeline_config import PipelineConfig
from ..schema import SchemaError, TableMetadata, load_schema_files
from ..kafka.schema_records import SchemaRecord
from .bootstrap_errors import BootstrapError
from .task_plan import DEFAULT_TASK_BYTES, SSTableSlice, plan
from .progress import CompletedTasks, ProgressFile, Tracker
from .publish import PublishSettings, TaskHook, publish_tasks
from .sstable_records import RecordLimits, RecordStats

log = logging.getLogger(__name__)

SCHEMA_NODE = "bootstrap"
KAFKA_TIMEOUT_SECONDS = 30.0


@dataclass(kw_only=True)
class BootstrapReport(RecordStats):
    """What a run did: the tasks' counts summed. ``tasks_skipped``: completed by an earlier run."""

    table: str
    tasks: int = 0
    tasks_skipped: int = 0
    tasks_run: int = 0
    sstables: int = 0
    data_bytes: int = 0
    file_bytes: int = 0
    cpu_seconds: float = 0.0
    seconds: float = 0.0
    schema_published: bool = False
    progress_file: str = ""
    task_results: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def rows_per_cpu_second(self) -> float:
        return self.rows / self.cpu_seconds if self.cpu_seconds else 0.0

    def summary(self) -> str:
        skipped = f", {self.tasks_skipped} done before" if self.tasks_skipped else ""
        text = (f"{self.table}: {self.tasks_run} of {self.tasks} tasks run{skipped}; "
                f"{self.partitions:,} partitions, {self.rows:,} rows -> {self.records:,} records "
                f"({self.record_bytes / 1e6:,.1f} MB) in {self.seconds:,.1f} s "
                f"({self.rows_per_second:,.0f} rows/s; {self.rows_per_cpu_second:,.0f} rows/s per busy core)")
        if self.unknown_cells:
            text += f"; {self.unknown_cells:,} cells of columns unknown to the schema left out"
        return text


def run_bootstrap(spark: Any, config: PipelineConfig, table_name: str, sstable_paths: Sequence[str | Path],
                  schema_file: Path | Sequence[Path] | None = None, progress: bool = True, *,
                  restart: bool = False, progress_file: Path | None = None,
                  target_task_bytes: int = DEFAULT_TASK_BYTES, limits: RecordLimits = RecordLimits(),
                  task_hook: TaskHook | None = None) -> BootstrapReport:
    """Publish the rows of ``table_name``'s SSTables (one snapshot per node) to the raw topic.

    ``spark`` is a SparkSession, or a function returning one, called only if there are tasks to run.

    The table's definition comes from ``schema_file`` (CQL) or else from the schema topic; it names
    the columns (values are decoded with the types Statistics.db records). The schema is published
    first when the schema topic does not have it. Tasks completed by an earlier run of the same table
    (``progress_file``, a local path, default ``<checkpoint>/bootstrap/<keyspace>.<table>.json``, read and
    written as the pipeline reads its checkpoint: a Hadoop path) are skipped unless ``restart``. Shows a
    progress bar when ``progress``; logs a line every 10 s either way.
    ``task_hook`` runs in the worker before each task (tests use it to make one fail).

    Raises ConfigError if the brokers refuse its login or TLS (``kafka.security``) or do not answer,
    BootstrapError if it cannot start otherwise or a task fails (the completed ones are recorded).
    """
    started = time.monotonic()
    broker_metadata(config.kafka.librdkafka(config.kafka.producer), config.kafka.bootstrap_servers,
                    KAFKA_TIMEOUT_SECONDS)
    table, on_topic = resolve_table(config, table_name, schema_file)
    tasks = plan(sstable_paths, table, target_task_bytes)
    if progress_file is not None:
        store = ProgressFile.at(progress_file, table)
    else:
        files = checkpoint_files(config.checkpoint, None)
        if files is None:  # a checkpoint only Hadoop reaches: Spark is needed to read the progress
            spark = spark() if callable(spark) else spark
            files = checkpoint_files(config.checkpoint, spark)
        store = ProgressFile(files, progress_file_name(table), table)
    if restart:
        store.remove()
    previous = store.load()
    remaining = [t for t in tasks if t.task_id not in previous]
    report = BootstrapReport(table=table.qualified_name, tasks=len(tasks),
                             tasks_skipped=len(tasks) - len(remaining), sstables=len({t.path for t in tasks}),
                             progress_file=store.location)
    log.info("bootstrap of %s: %d SSTables from %d nodes, %d tasks (%d completed before), %.1f MB of data",
             table.qualified_name, report.sstables, len({t.node_id for t in tasks}), len(tasks),
             report.tasks_skipped, sum(t.data_bytes for t in remaining) / 1e6)
    ensure_topics(config)
    if not on_topic:
        publish_schema(config, table)
        report.schema_published = True
    if remaining:
        results = _run_tasks(spark, config, table, remaining, store, previous, progress, limits, task_hook)
        _add_results(report, results)
    store.save({**previous, **{r["task_id"]: _counts(r) for r in report.task_results}}, finished=True)
    report.seconds = time.monotonic() - started
    log.info("bootstrap done: %s", report.summary())
    return report


def _run_tasks(spark: Any, config: PipelineConfig, table: TableMetadata, tasks: list[SSTableSlice],
               store: ProgressFile, previous: dict[str, dict[str, Any]], progress: bool, limits: RecordLimits,
               task_hook: TaskHook | None) -> list[dict[str, Any]]:
    sc = (spark() if callable(spark) else spark).sparkContext
    settings = PublishSettings(config.kafka.bootstrap_servers, config.raw_topic, table,
                               config.kafka.librdkafka(config.kafka.producer), limits)
    # The largest first: the last tasks to start are short, so the cores finish together.
    ordered = sorted(tasks, key=lambda t: (-t.data_bytes, t.task_id))
    completed = sc.accumulator([], CompletedTasks())
    title = f"bootstrap {table.qualified_name}"
    sc.setJobDescription(f"{title}: {len(ordered)} SSTable tasks")
    rdd = sc.parallelize(ordered, len(ordered)).mapPartitions(
        partial(publish_tasks, settings=settings, completed=completed, hook=task_hook))
    tracker = Tracker(completed, store, previous, len(ordered), sum(t.data_bytes for t in ordered), progress,
                      title)
    try:
        with tracker:
            results = rdd.collect()
    except Exception as error:
        done = len(tracker.results)
        raise BootstrapError(f"bootstrap of {table.qualified_name} failed after {done} of {len(ordered)} "
                             f"tasks (recorded in {store.location}; run it again to resume): "
                             f"{_cause(error)}") from error
    finally:
        sc.setJobDescription(None)
    return results


def _add_results(report: BootstrapReport, results: list[dict[str, Any]]) -> None:
    report.task_results = results
    report.tasks_run = len(results)
    summed = [f.name for f in fields(RecordStats)] + ["data_bytes", "file_bytes", "cpu_seconds"]
    for name in summed:
        setattr(report, name, sum(r.get(name, 0) for r in results))


def _counts(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "task_id"}


def _cause(error: BaseException) -> str:
    """The worker's own error out of a Py4J/Spark error (the last Python exception line in it), if there."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        match = _PYTHON_EXCEPTION.match(line)
        if match and not match.group(1).startswith(("org.", "java.", "py4j.", "scala.")):
            return line
    return lines[0] if lines else type(error).__name__


_PYTHON_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failure)): ")


def progress_file_name(table: TableMetadata) -> str:
    """Where a table's bootstrap records its progress, relative to the checkpoint."""
    return f"bootstrap/{table.keyspace}.{table.name}.json"


def resolve_table(config: PipelineConfig, table_name: str,
                  schema_file: Path | Sequence[Path] | None) -> tuple[TableMetadata, bool]:
    """The definition of the table to bootstrap, and whether the schema topic has it already.

    The schema topic's definition wins: the pipeline decodes records with it. A schema file is needed
    only when the topic does not have the table yet (no agent has published it); when both have it,
    their table ids must agree.
    """
    keyspace, dot, name = table_name.partition(".")
    if not dot or not keyspace or not name:
        raise BootstrapError(f"--table {table_name!r}: expected KEYSPACE.TABLE")
    catalog = SchemaCatalog(config.kafka.bootstrap_servers, config.schema_topics_read,
                            config.kafka.librdkafka(config.kafka.consumer))
    try:
        catalog.refresh()
    except KafkaException as error:
        raise BootstrapError(f"cannot read the schema topics {', '.join(config.schema_topics_read)}: {error}"
                             ) from None
    topic_table = catalog.schema.table(keyspace, name)
    if schema_file is None:
        if topic_table is None:
            raise BootstrapError(f"no definition of {table_name} on the schema topic {config.schema_topic} "
                                 "(the agents publish it when they first see the table): give --schema "
                                 "FILE.cql")
        return topic_table, True
    files = [schema_file] if isinstance(schema_file, (str, Path)) else list(schema_file)
    where = ", ".join(map(str, files))
    try:
        schema = load_schema_files(files)
    except (OSError, SchemaError) as error:
        raise BootstrapError(f"cannot read the schema: {error}") from None
    table = schema.table(keyspace, name)
    if table is None:
        raise BootstrapError(f"{where} does not define {table_name}")
    if topic_table is None:
        return table, False
    if topic_table.id != table.id:
        raise BootstrapError(f"{table_name} has id {table.id} in {where} but {topic_table.id} on the schema "
                             f"topic {config.schema_topic}: the file describes another table")
    if topic_table.version_hash() != table.version_hash():
        log.warning("the schema topic %s has another definition of %s than %s: using the topic's, which the "
                    "pipeline decodes with", config.schema_topic, table_name, where)
    return topic_table, True


def ensure_topics(config: PipelineConfig) -> None:
    """Create the raw and schema topics if they do not exist yet (as the agents would)."""
    admin = admin_client(config.kafka.librdkafka(config.kafka.producer))
    try:
        create_missing_topics(admin, {config.raw_topic: (RAW_TOPIC_PARTITIONS, False),
                                      config.schema_topic: (1, True)}, KAFKA_TIMEOUT_SECONDS)
    except TopicCreationFailed as error:
        raise BootstrapError(str(error)) from None
    except KafkaException as error:
        raise BootstrapError(f"Kafka at {config.kafka.bootstrap_servers} does not answer: {error}") from None


def publish_schema(config: PipelineConfig, table: TableMetadata) -> None:
    """Publish the table's schema record, and wait for Kafka to acknowledge it."""
    failures: list[str] = []
    producer = Producer(config.kafka.librdkafka({"enable.idempotence": True, "acks": "all",
                                                 **config.kafka.producer}))
    record = SchemaRecord.of(table, SCHEMA_NODE)
    producer.produce(config.schema_topic, record.encode(), record.key,
                     on_delivery=lambda error, _: failures.append(str(error)) if error else None)
    remaining = producer.flush(KAFKA_TIMEOUT_SECONDS)
    if failures or remaining:
        raise BootstrapError(f"cannot publish the schema of {table.qualified_name} to {config.schema_topic}: "
                             f"{failures[0] if failures else 'not acknowledged in time'}")
    log.info("published the schema of %s (version %s) to %s", table.qualified_name, record.version,
             config.schema_topic)


__all__ = ["BootstrapReport", "ensure_topics", "progress_file_name", "publish_schema", "resolve_table",
           "run_bootstrap"]
