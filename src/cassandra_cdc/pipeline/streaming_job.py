"""The pipeline job: raw topic → merge per partition (RocksDB state) → per-table event topics.

The same code runs in ``local[*]`` and under ``spark-submit``: ``cassandra-cdc pipeline`` builds the
session itself; under spark-submit the session's master and settings come from spark-submit.
"""

from __future__ import annotations

import json
import logging
import math
import re
import signal
import threading
import time
from typing import Callable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from pyspark import Accumulator
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from ..kafka.admin import admin_client
from ..kafka.outage import KafkaOutage, names_unreachable_kafka, unreachable
from ..kafka.security import KafkaUnreachable, broker_metadata
from ..observability import serve_metrics
from .checkpoint_files import CheckpointFiles, checkpoint_files
from .raw_topic_gap import RawTopicGap, RawTopicGapError, check_retention, find_gap, resume_offsets
from .pipeline_config import ConfigError, PipelineConfig
from .change_processor import OUTPUT_SCHEMA, ChangeProcessor, ProcessorSettings
from .event_sink import SinkSettings, partitions_committed
from .heartbeat import Heartbeats
from .kafka_source import KafkaDataSource, SourceOptions
from .pipeline_metrics import PipelineMetrics, PipelineTally
from .schema_changes import SchemaChanges
from .spark_session import kafka_format_available, session_master, spark_session

log = logging.getLogger(__name__)

APP_NAME = "cassandra-cdc"
# What versions before the query was named after its server named every query (hence its transactional ids
# and commit markers, event_sink.py): a checkpoint they wrote is read with it.
EARLIER_QUERY_NAME = APP_NAME


def query_name(server: str) -> str:
    """The streaming query's name, which names its Kafka transactional ids: one per server, so that the
    pipelines of two servers never fence each other on one Kafka cluster."""
    return f"{APP_NAME}.{server}"


# Raw topic partitions the job can group by; the agents' default is 12.
MAX_RAW_PARTITIONS = 1024
METADATA_TIMEOUT = 30.0


def read_raw(spark: SparkSession, config: PipelineConfig) -> tuple[DataFrame, SourceOptions | None]:
    """The raw topic as a stream: records through Spark's ``kafka`` format when its jar is there, else
    offset ranges through ours (the processor then reads the records itself, with the options returned)."""
    kafka = config.kafka
    builtin = kafka.source == "kafka" or (kafka.source == "auto" and kafka_format_available(spark))
    # Spark's source is the Java client, ours librdkafka: each takes its own client's settings, prefixed.
    client = kafka.java_client(kafka.consumer) if builtin else kafka.librdkafka(kafka.consumer)
    # failOnDataLoss stays true (both sources' default), deliberately: with false, offsets a source cannot
    # find (a broker back without them) are taken for lost data and skipped. Kafka out of reach fails the
    # query instead (Spark's source after its fetchOffset.numRetries and kafkaConsumer.pollTimeoutMs), and
    # ``run`` waits for Kafka, then resumes from the checkpoint. Only a gap the configuration accepts
    # (raw_topic_gap.py) is skipped.
    options = {"subscribe": config.raw_topic, "startingOffsets": kafka.starting_offsets,
               "failOnDataLoss": "false" if kafka.accept_gap else "true",
               "maxOffsetsPerTrigger": str(kafka.max_offsets_per_trigger),
               **{f"kafka.{name}": str(value) for name, value in client.items()}}
    if builtin:
        reader, columns, ranges = spark.readStream.format("kafka"), ["key", "value", "partition", "offset"], None
    else:
        spark.dataSource.register(KafkaDataSource)
        options["emit"] = "offsetRanges"
        reader, columns = spark.readStream.format(KafkaDataSource.name()), ["partition", "startOffset", "endOffset"]
        ranges = SourceOptions.parse(options)
    log.info("reading %s with the %s Kafka source", config.raw_topic, "built-in" if builtin else "Python")
    return reader.options(**options).load().select(*columns), ranges


def change_events(spark: SparkSession, config: PipelineConfig,
                  tally: Accumulator[PipelineTally] | None = None) -> DataFrame:
    """The merge of the raw records per partition key, which writes the change events to Kafka itself (and
    adds what it wrote to ``tally``).

    The result has no rows; running it (any sink) runs the pipeline."""
    raw, ranges = read_raw(spark, config)
    kafka = config.kafka
    sink = sink_settings(config)
    settings = ProcessorSettings(
        server=config.server, cluster=config.cluster_name, bootstrap_servers=kafka.bootstrap_servers,
        schema_topics=config.schema_topics_read, errors_topic=config.errors_topic,
        format=config.output.format,
        schema_registry=tuple(sorted(config.output.registry_client_settings().items())),
        tombstones=config.output.tombstones, type_modes=config.output.type_modes,
        columns=config.output.column_rules, skipped_operations=frozenset(config.output.skipped_operations),
        static_only_rows=config.output.static_only_rows,
        consumer=tuple(sorted(kafka.librdkafka(kafka.consumer).items())), sink=sink, ranges=ranges,
        tally=tally, state_pages=config.spark.state_pages)
    keys = balanced_group_keys(spark, MAX_RAW_PARTITIONS, config.spark.shuffle_partitions)
    # One SQL literal, not an expression per key: each of those would be a call into the JVM.
    group = F.element_at(F.expr(f"array({', '.join(f'{key}L' for key in keys)})"), (F.col("partition") + 1).cast("int"))
    return raw.withColumn("group", group).groupBy("group").transformWithStateInPandas(
        ChangeProcessor(settings), OUTPUT_SCHEMA, "Update", "ProcessingTime")


def sink_settings(config: PipelineConfig) -> SinkSettings:
    kafka = config.kafka
    return SinkSettings(kafka.bootstrap_servers, config.commit_topic, query_name(config.server),
                        (EARLIER_QUERY_NAME,), config.output.exactly_once,
                        tuple(sorted(kafka.librdkafka(kafka.producer).items())),
                        kafka.events_topic_partitions, config.output.compacted_topics, (config.errors_topic,))


def balanced_group_keys(spark: SparkSession, groups: int, partitions: int) -> list[int]:
    """The grouping key of each raw topic partition, chosen so that the state partitions get equal shares.

    Spark places a grouping key in partition ``pmod(hash(key), partitions)``: partition numbers used as
    keys land unevenly (12 over 2 state partitions: 7 and 5), and the fullest state partition sets the
    pace of every micro-batch. Group ``g`` gets the smallest unused key that Spark places in partition
    ``g % partitions``, asked of Spark itself so as to follow its hash exactly.
    """
    wanted = -(-groups // partitions)  # keys per partition
    candidates = spark.range(8 * wanted * partitions).select(
        "id", F.pmod(F.hash("id"), F.lit(partitions)).alias("partition")).collect()
    by_partition: dict[int, list[int]] = {}
    for row in candidates:
        by_partition.setdefault(row.partition, []).append(row.id)
    if any(len(by_partition.get(partition, ())) < wanted for partition in range(partitions)):
        raise RuntimeError(f"cannot spread {groups} groups over {partitions} partitions")
    return [by_partition[group % partitions][group // partitions] for group in range(groups)]


STATE_LAYOUT_FILE = "cassandra-cdc-state.json"
# 5: grouped by raw topic partition, each group's state in pages that split as it grows, a wide partition's
# rows in leaves beside them; 4: the same, pages fixed in number, every partition's rows inline (read by
# version 5: those pages have not split yet, rows inline are a tree of one leaf); 3:
# the same, each group's state one value (read by version 5, which pages a group as it writes it); 2: by hash
# bucket; 1 (no file): by bucket number
STATE_LAYOUT_VERSION = 5
INLINE_ROWS_STATE_LAYOUT_VERSION = 4
UNPAGED_STATE_LAYOUT_VERSION = 3


def check_state_layout(files: CheckpointFiles, config: PipelineConfig, raw_partitions: int | None) -> None:
    """Refuse a checkpoint whose state was laid out otherwise than this job would read it.

    Each raw topic partition's partition keys are one group of the state, placed in one of the
    ``spark.shuffle_partitions`` state partitions. Both are fixed once a checkpoint has state: with
    other placements, the merge would start from missing state and emit wrong events. A partition added
    to the raw topic moves partition keys to other raw partitions, hence other groups, the same way.
    So is the number of pages of a group's state. A new checkpoint records the layout (the raw topic's
    partitions once the topic exists). A checkpoint of version 4, whose partitions' rows are all inline, is
    recorded as version 5: the processor moves the rows of a partition to leaves as it grows. One of version 3,
    whose groups are stored whole, is recorded as version 5 with the configured pages: the processor pages
    each group as it writes it.
    """
    checkpoint = config.checkpoint
    layout = {"version": STATE_LAYOUT_VERSION, "spark.shuffle_partitions": config.spark.shuffle_partitions,
              "spark.state_pages": config.spark.state_pages, "raw_topic.partitions": raw_partitions}
    recorded_file = files.location(STATE_LAYOUT_FILE)
    read: object = None
    if files.exists(STATE_LAYOUT_FILE):
        try:
            read = json.loads(files.read_text(STATE_LAYOUT_FILE))
        except (OSError, ValueError) as error:
            raise ConfigError(f"{recorded_file} cannot be read ({error}): it records how the checkpoint's state is "
                              "laid out; restore the checkpoint from a backup, or start a new one") from None
        if not isinstance(read, dict):
            raise ConfigError(f"{recorded_file} is not what the pipeline wrote (a JSON object): restore the "
                              "checkpoint from a backup, or start a new one")
        recorded = dict(read)
    elif files.batch_files("offsets"):
        recorded = {"version": 1}
    else:
        recorded = {name: value for name, value in layout.items() if name != "raw_topic.partitions"}
    if recorded.get("version") == UNPAGED_STATE_LAYOUT_VERSION:
        recorded.update({"version": STATE_LAYOUT_VERSION, "spark.state_pages": config.spark.state_pages})
    if recorded.get("version") == INLINE_ROWS_STATE_LAYOUT_VERSION:
        recorded["version"] = STATE_LAYOUT_VERSION
    if recorded.get("version") != STATE_LAYOUT_VERSION:
        raise ConfigError(f"checkpoint {checkpoint} was written by an earlier version of the pipeline, whose merge "
                          "state this one cannot read: start a new checkpoint (and bootstrap the tables again)")
    if recorded.get("raw_topic.partitions") is None:
        recorded["raw_topic.partitions"] = raw_partitions  # the raw topic is there now, or still is not
    changed = [f"{name} {recorded.get(name)} → {value}" for name, value in layout.items()
               if value is not None and recorded.get(name) != value]
    if changed:
        raise ConfigError(f"checkpoint {checkpoint} holds state laid out for other settings ({', '.join(changed)}): "
                          "keep them, or start a new checkpoint (and bootstrap the tables again)")
    if recorded != read:
        files.write_text(STATE_LAYOUT_FILE, json.dumps(recorded))


def raw_topic_partitions(config: PipelineConfig, timeout: float = METADATA_TIMEOUT) -> int | None:
    """How many partitions the raw topic has; None when it does not exist (yet)."""
    metadata = broker_metadata(config.kafka.librdkafka(config.kafka.consumer), config.kafka.bootstrap_servers,
                               timeout, config.raw_topic).topics[config.raw_topic]
    if metadata.error is not None:
        if metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise ConfigError(f"cannot read the metadata of the raw topic {config.raw_topic}: {metadata.error.str()}")
    count = len(metadata.partitions)
    if count > MAX_RAW_PARTITIONS:
        raise ConfigError(f"the raw topic {config.raw_topic} has {count} partitions; the pipeline reads at most "
                          f"{MAX_RAW_PARTITIONS}")
    return count


def check_not_restarted_from_scratch(files: CheckpointFiles, config: PipelineConfig) -> None:
    """Refuse a checkpoint without progress when the pipeline's output says it ran before.

    With a lost or deleted checkpoint, Spark starts a new query from the raw topic's start: every event
    is written again, and, the new query id not being the old one, the sink's markers do not stop it
    (sink.py), so read_committed consumers see each one twice. The markers of the query's state
    partitions in the commit topic show that it ran: only ``reset_checkpoint`` starts over then.
    (Without ``exactly_once`` there are no markers, and no check.)
    """
    if config.reset_checkpoint or files.batch_files("offsets"):
        return
    committed = partitions_committed(sink_settings(config))
    if committed:
        raise ConfigError(f"checkpoint {config.checkpoint} is empty or missing, but {committed} state "
                          "partition(s) "
                          f"of an earlier run committed output to Kafka (topic {config.commit_topic}): "
                          "starting over would write every event again; restore the checkpoint, or pass "
                          "--reset-checkpoint (reset_checkpoint: true) to reprocess the raw topic from its "
                          "start")


# Spark's logs of planned and of completed micro-batches: per batch a file named by its id, a version
# line ("v1"), then one JSON value per line ("-" for a source without an offset).
CHECKPOINT_LOGS = ("offsets", "commits")


def check_checkpoint_logs(files: CheckpointFiles) -> None:
    """Refuse a checkpoint whose batch logs Spark could not read, naming the file: Spark would fail the
    query with a Java stack trace that does not say which file."""
    for log_name in CHECKPOINT_LOGS:
        for name in files.batch_files(log_name):
            try:
                version, *values = files.read_text(name).splitlines()
                if not (version.startswith("v") and version[1:].isdigit()) or not values:
                    raise ValueError("no version line and values")
                for value in values:
                    if value != "-":
                        json.loads(value)
            except (OSError, ValueError) as error:
                raise ConfigError(f"checkpoint file {files.location(name)} is damaged ({error}): restore "
                                  "the checkpoint from a backup, or start a new one (see --reset-checkpoint)"
                                  ) from None


def check_checkpoint(config: PipelineConfig, spark: SparkSession | None = None,
                     kafka_timeout: float = METADATA_TIMEOUT, on_gap: Callable[[RawTopicGap], None] | None = None
                     ) -> None:
    """What ``start`` checks before it starts the query. The CLI calls it before Spark starts too, when
    only a local checkpoint can be checked: a checkpoint elsewhere is checked once the session exists.

    With ``on_gap`` (``start``'s check), the raw topic too: its retention, and whether records the query
    has still to read are gone (``on_gap`` gets the gap; ``RawTopicGapError`` unless kafka.accept_gap)."""
    files = checkpoint_files(config.checkpoint, spark)
    if files is None:
        return
    check_checkpoint_logs(files)
    try:
        partitions = raw_topic_partitions(config, kafka_timeout)
        check_not_restarted_from_scratch(files, config)
        gap = None
        if on_gap is not None:
            admin = admin_client(config.kafka.librdkafka(config.kafka.consumer))
            check_retention(admin, config.raw_topic, kafka_timeout)
            gap = raw_topic_gap(files, config, admin, kafka_timeout)
    except KafkaException as error:
        message = f"cannot reach Kafka at {config.kafka.bootstrap_servers}: {error}"
        raise (KafkaUnreachable if unreachable(error) else ConfigError)(message) from error
    check_state_layout(files, config, partitions)
    if gap is not None and on_gap is not None:
        on_gap(gap)
        if not config.kafka.accept_gap:
            raise RawTopicGapError(gap)
        log.warning("%s; reading on past it (kafka.accept_gap)", gap.describe())


def raw_topic_gap(files: CheckpointFiles, config: PipelineConfig, admin: AdminClient,
                  timeout: float) -> RawTopicGap | None:
    """The raw records deleted before the query read them, if any (raw_topic_gap.py)."""
    resume = resume_offsets(files, config.raw_topic)
    return None if resume is None else find_gap(admin, config.raw_topic, resume, timeout)


def start(spark: SparkSession, config: PipelineConfig, tally: Accumulator[PipelineTally] | None = None,
          on_gap: Callable[[RawTopicGap], None] = lambda gap: None) -> StreamingQuery:
    check_checkpoint(config, spark, on_gap=on_gap)
    query = (change_events(spark, config, tally).writeStream
             .queryName(query_name(config.server))
             .format("noop")
             .outputMode("update")
             .option("checkpointLocation", config.checkpoint)
             .trigger(processingTime=config.spark.trigger_interval)
             .start())
    if config.output.heartbeat_interval_ms:
        Heartbeats(config, sink_settings(config), query).start()
    if config.output.include_schema_changes:
        if config.schema_topic == config.server:  # the catalog is there: no schema changes among its records
            log.warning("no schema change events: the schema topic is %s, the schema change topic",
                        config.server)
        else:
            SchemaChanges(config, sink_settings(config), query).start()
    return query


def run(config: PipelineConfig, duration: float | None = None) -> int:
    """Run the pipeline until stopped (Ctrl-C / SIGTERM) or for ``duration`` seconds.

    Kafka out of reach never ends it: before the query starts, and whenever the query fails because of it
    (a task or the driver that could not reach the brokers, at any step of a micro-batch), the pipeline
    waits until Kafka answers, then starts the query again from its checkpoint, which replays the batch
    that failed (its output is committed once: event_sink.py)."""
    spark = spark_session(session_master(config.spark.master), APP_NAME, config.spark.shuffle_partitions,
                          config.spark.conf)
    metrics = PipelineMetrics(spark, config)
    server = serve_metrics(config.metrics.host, config.metrics.port, metrics.registry, metrics.not_ready)
    terminated = threading.Event()
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (systemd, Kubernetes) stops the query between batches, as Ctrl-C does, but noted
        # rather than raised: an exception in the middle of a call into the JVM breaks its connection.
        signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    deadline = math.inf if duration is None else time.monotonic() + duration
    outage = KafkaOutage(config.kafka.bootstrap_servers,
                         "the pipeline waits for it, then resumes from its checkpoint", log)
    failure: Exception | None = None
    gap: RawTopicGap | None = None
    retries_without_progress = 0
    try:
        while not terminated.is_set() and time.monotonic() < deadline:
            try:
                raw_topic_partitions(config, KAFKA_PROBE_TIMEOUT)  # Kafka answers: the query can start
                query = start(spark, config, metrics.tally,
                              lambda found: metrics.raw_records_deleted.inc(found.records))
            except KafkaUnreachable as error:
                outage.down(str(error))
                terminated.wait(min(KAFKA_RETRY_SECONDS, max(0.0, deadline - time.monotonic())))
                continue
            outage.back()
            log.info("pipeline running: %s → %s.<keyspace>.<table>, checkpoint %s", config.raw_topic,
                     config.server, config.checkpoint)
            failure = _serve(query, metrics, terminated, deadline)
            if failure is None:
                break
            retries_without_progress = 0 if query.lastProgress is not None else retries_without_progress + 1
            if not _failed_for_kafka(config, failure, retries_without_progress):
                break
            outage.down("the streaming query failed for it")
            failure = None
        # A query that failed on records deleted before it read them: said as at a start, with the remedy.
        gap = None if failure is None else _gap_after_failure(spark, config)
        if gap is not None:
            metrics.raw_records_deleted.inc(gap.records)
    finally:
        metrics.stopped()
        if server is not None:
            server.stop()
    if gap is not None:
        log.error("the pipeline stopped: %s", gap.describe())
        return 1
    if failure is not None:
        log.error("the pipeline failed: %s (checkpoint %s); once the cause is fixed, start it again: it "
                  "resumes from its checkpoint", failure_cause(failure), config.checkpoint)
        return 1
    return 0


def _gap_after_failure(spark: SparkSession, config: PipelineConfig) -> RawTopicGap | None:
    """A gap in the raw topic past where the failed query resumes (retention deleted records while it was
    behind); None when there is none or Kafka does not tell."""
    files = checkpoint_files(config.checkpoint, spark)
    if files is None or config.kafka.accept_gap:
        return None
    try:
        return raw_topic_gap(files, config, admin_client(config.kafka.librdkafka(config.kafka.consumer)),
                             KAFKA_PROBE_TIMEOUT)
    except KafkaException:
        return None


def _serve(query: StreamingQuery, metrics: PipelineMetrics, terminated: threading.Event,
           deadline: float) -> Exception | None:
    """Run ``query`` until it fails (its failure returned), or is stopped, or until ``deadline``."""
    try:
        while query.isActive and not terminated.is_set() and time.monotonic() < deadline:
            metrics.update(query)
            query.awaitTermination(1)
    except StreamingQueryException:
        pass  # the query failed: its failure is returned below
    except KeyboardInterrupt:
        terminated.set()
    finally:
        if terminated.is_set():
            log.info("stopping the pipeline")
        if query.isActive:
            query.stop()
    return query.exception()


# While Kafka is out of reach, the pipeline asks again this often whether it answers, waiting this long for
# an answer (one comes in milliseconds from a broker that is up).
KAFKA_RETRY_SECONDS = 2.0
KAFKA_PROBE_TIMEOUT = 5.0
# A query failure that names Kafka out of reach while Kafka answers is retried this many times in a row
# without a completed micro-batch: past that, it is taken for what it is, a failure, and the pipeline stops.
RETRIES_WITHOUT_PROGRESS = 5


def _failed_for_kafka(config: PipelineConfig, failure: Exception, retries_without_progress: int) -> bool:
    """Whether the query's ``failure`` is Kafka's absence (then the pipeline starts it again)."""
    try:
        raw_topic_partitions(config, KAFKA_PROBE_TIMEOUT)
    except KafkaUnreachable:
        return True  # away now: whatever failed the query, nothing can run until it is back
    return names_unreachable_kafka(str(failure)) and retries_without_progress <= RETRIES_WITHOUT_PROGRESS


def failure_cause(failure: Exception) -> str:
    """What a failed query's exception says went wrong, in one line: Spark's message starts with the query's
    ids and goes on with the query's plan, over many lines."""
    first_line = str(failure).splitlines()[0] if str(failure) else repr(failure)
    cause = re.search(r"terminated with exception: (.*?)(?: SQLSTATE: \w+)?$", first_line)
    return cause.group(1) if cause else first_line
