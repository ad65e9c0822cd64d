"""The pipeline job: raw topic → merge per partition (RocksDB state) → per-table event topics.

The same code runs in ``local[*]`` and under ``spark-submit``: ``cassandra-cdc pipeline`` builds the
session itself; under spark-submit the session's master and settings come from spark-submit.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from .config import ConfigError, PipelineConfig
from .processor import OUTPUT_SCHEMA, ChangeProcessor, ProcessorSettings, with_copy_identity
from .sink import KafkaAtLeastOnceSink, KafkaTransactionalSink
from .source import KafkaDataSource
from .spark import kafka_format_available, spark_session

log = logging.getLogger(__name__)

QUERY_NAME = "cassandra-cdc"


def read_raw(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """The raw topic as a stream, through Spark's ``kafka`` format when its jar is there, else ours."""
    kafka = config.kafka
    builtin = kafka.source == "kafka" or (kafka.source == "auto" and kafka_format_available(spark))
    if builtin:
        reader = spark.readStream.format("kafka")
    else:
        spark.dataSource.register(KafkaDataSource)
        read_tasks = kafka.read_tasks or spark.sparkContext.defaultParallelism
        reader = spark.readStream.format(KafkaDataSource.name()).option("maxPartitions", str(read_tasks))
    reader = (reader.option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("subscribe", config.raw_topic)
              .option("startingOffsets", kafka.starting_offsets)
              .option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger)))
    for name, value in kafka.consumer.items():
        reader = reader.option(f"kafka.{name}", str(value))
    log.info("reading %s with the %s Kafka source", config.raw_topic, "built-in" if builtin else "Python")
    return reader.load().select("key", "value", "partition", "offset")


def change_events(spark: SparkSession, config: PipelineConfig) -> DataFrame:
    """Events (``topic``, ``key``, ``value``) from the raw records, merged per partition key."""
    settings = ProcessorSettings(
        server=config.server, cluster=config.cluster_name, bootstrap_servers=config.kafka.bootstrap_servers,
        schema_topic=config.schema_topic, errors_topic=config.errors_topic, format=config.output.format,
        schema_registry_url=config.output.schema_registry_url, tombstones=config.output.tombstones,
        consumer=tuple(sorted(config.kafka.consumer.items())))
    raw = with_copy_identity(read_raw(spark, config))
    keys = balanced_bucket_keys(spark, config.state.buckets, config.spark.shuffle_partitions)
    bucket = F.element_at(F.array(*(F.lit(key) for key in keys)).cast("array<bigint>"),
                          (F.pmod(F.xxhash64("key"), F.lit(len(keys))) + 1).cast("int"))
    return raw.withColumn("bucket", bucket).groupBy("bucket").transformWithStateInPandas(
        ChangeProcessor(settings), OUTPUT_SCHEMA, "Update", "ProcessingTime")


def balanced_bucket_keys(spark: SparkSession, buckets: int, partitions: int) -> list[int]:
    """The grouping key of each state bucket, chosen so that the state partitions get equal shares.

    Spark places a grouping key in partition ``pmod(hash(key), partitions)``: bucket numbers used as
    keys land unevenly (16 buckets over 2 partitions: 7 and 9; 8 buckets: 3 and 5), and the fullest
    partition sets the pace of every micro-batch. Bucket ``b`` gets the smallest unused key that Spark
    places in partition ``b % partitions``, asked of Spark itself so as to follow its hash exactly.
    """
    wanted = -(-buckets // partitions)  # keys per partition
    candidates = spark.range(8 * wanted * partitions).select(
        "id", F.pmod(F.hash("id"), F.lit(partitions)).alias("partition")).collect()
    by_partition: dict[int, list[int]] = {}
    for row in candidates:
        by_partition.setdefault(row.partition, []).append(row.id)
    if any(len(by_partition.get(partition, ())) < wanted for partition in range(partitions)):
        raise RuntimeError(f"cannot spread {buckets} state buckets over {partitions} partitions")
    return [by_partition[bucket % partitions][bucket // partitions] for bucket in range(buckets)]


STATE_LAYOUT_FILE = "cassandra-cdc-state.json"
STATE_LAYOUT_VERSION = 2  # 2: buckets keyed by balanced_bucket_keys; 1 (no file): by bucket number


def check_state_layout(config: PipelineConfig) -> None:
    """Refuse a checkpoint whose state was laid out otherwise than this job would read it.

    The number of buckets, the number of state partitions and the way records map to buckets are
    fixed once a checkpoint has state: with others, the merge would start from missing state and emit
    wrong events. A new checkpoint records them.
    """
    checkpoint = Path(config.checkpoint)
    layout = {"version": STATE_LAYOUT_VERSION, "state.buckets": config.state.buckets,
              "spark.shuffle_partitions": config.spark.shuffle_partitions}
    recorded_file = checkpoint / STATE_LAYOUT_FILE
    if recorded_file.exists():
        recorded = json.loads(recorded_file.read_text())
        changed = [f"{name} {recorded.get(name)} → {value}" for name, value in layout.items() if recorded.get(name) != value]
        if changed:
            raise ConfigError(f"checkpoint {checkpoint} was written with other state settings ({', '.join(changed)}): "
                              "keep them, or start a new checkpoint")
        return
    if any((checkpoint / "offsets").glob("[0-9]*")):
        raise ConfigError(f"checkpoint {checkpoint} was written by an earlier version of the pipeline, whose merge "
                          "state this one cannot read: start a new checkpoint (and bootstrap the tables again)")
    checkpoint.mkdir(parents=True, exist_ok=True)
    recorded_file.write_text(json.dumps(layout))


def start(spark: SparkSession, config: PipelineConfig) -> StreamingQuery:
    check_state_layout(config)
    kafka = config.kafka
    if config.output.exactly_once:
        sink = KafkaTransactionalSink(kafka.bootstrap_servers, config.commit_topic, QUERY_NAME, kafka.producer,
                                      topic_partitions=kafka.events_topic_partitions)
    else:
        sink = KafkaAtLeastOnceSink(kafka.bootstrap_servers, kafka.producer,
                                    topic_partitions=kafka.events_topic_partitions)
    return (change_events(spark, config).writeStream
            .queryName(QUERY_NAME)
            .foreachBatch(sink.write_batch)
            .option("checkpointLocation", str(config.checkpoint))
            .trigger(processingTime=config.spark.trigger_interval)
            .start())


def run(config: PipelineConfig, duration: float | None = None) -> int:
    """Run the pipeline until stopped (Ctrl-C / SIGTERM) or for ``duration`` seconds."""
    spark = spark_session(config.spark.master or "local[2]", QUERY_NAME, config.spark.shuffle_partitions,
                          config.spark.conf)
    query = start(spark, config)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (systemd, Kubernetes) stops the query between batches as Ctrl-C does.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    log.info("pipeline running: %s → %s.<keyspace>.<table>, checkpoint %s", config.raw_topic, config.server,
             config.checkpoint)
    deadline = None if duration is None else time.monotonic() + duration
    try:
        while query.isActive and (deadline is None or time.monotonic() < deadline):
            query.awaitTermination(1)
    except KeyboardInterrupt:
        log.info("stopping the pipeline")
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        log.error("the pipeline failed: %s", query.exception())
        return 1
    return 0
