"""The pipeline's configuration: one YAML file (``pipeline.yaml``), validated before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..settings import ConfigError, load_settings
from ..kafka import ServerTopics

__all__ = ["ConfigError", "PipelineConfig", "load_config"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KafkaSettings(_Section):
    bootstrap_servers: str = Field(..., description="Kafka bootstrap servers, host:port[,host:port].")
    raw_topic: str | None = Field(None, description="Raw change topic the agents publish to. Default: <server>.raw")
    schema_topic: str | None = Field(None, description="Table schema topic. Default: <server>")
    errors_topic: str | None = Field(None, description="Undecodable records go here. Default: <server>.errors")
    commit_topic: str | None = Field(None, description="Compacted topic of committed micro-batches (exactly-once "
                                                       "output). Default: <server>.pipeline-commits")
    events_topic_partitions: int = Field(6, ge=1, description="Partitions of an event topic the pipeline creates.")
    source: Literal["auto", "python", "kafka"] = Field(
        "auto", description="Read Kafka with Spark's built-in 'kafka' format (needs its jar), the Python data "
                            "source over confluent-kafka, or 'auto': the built-in one when its jar is there.")
    max_offsets_per_trigger: int = Field(200_000, ge=1, description="Raw records per micro-batch at most.")
    starting_offsets: Literal["earliest", "latest"] = Field("earliest", description="Where a new query starts.")
    consumer: dict[str, Any] = Field(default_factory=dict, description="Extra consumer settings (security).")
    producer: dict[str, Any] = Field(default_factory=dict, description="Extra producer settings (security).")


class SparkSettings(_Section):
    master: str | None = Field(None, description="Spark master; default local[2]. Ignored under spark-submit, "
                                                 "which sets its own.")
    shuffle_partitions: int = Field(2, ge=1, description="State store partitions, i.e. the tasks that merge in "
                                                         "parallel (fixed once a checkpoint exists).")
    state_pages: int = Field(256, ge=1, le=1 << 20,
                             description="Pages of merge state per raw topic partition: "
                             "a micro-batch reads and writes the pages its records touch; more pages make "
                             "small batches write less and large batches cost more state calls (fixed once a "
                             "checkpoint exists).")
    trigger_interval: str = Field("1 second", description="Micro-batch interval.")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings.")


class OutputSettings(_Section):
    format: Literal["json", "avro"] = Field("json", description="Kafka Connect JSON (schema + payload) or Avro.")
    schema_registry_url: str | None = Field(None, description="Avro: register schemas here and use the Confluent "
                                                              "wire format; without it, self-describing Avro.")
    tombstones: bool = Field(False, description="Follow each delete event with a tombstone (null value).")
    exactly_once: bool = Field(True, description="Transactional output per micro-batch (consumers use "
                                                 "isolation.level=read_committed); false: at-least-once.")


class PipelineConfig(ServerTopics, _Section):
    server: str = Field(..., description="Logical cluster name, as the agents use it; prefix of every topic.")
    cluster: str | None = Field(None, description="Cassandra cluster name shown in events. Default: server")
    checkpoint: str = Field(..., description="Spark checkpoint directory (offsets and merge state): a local "
                                             "path or a Hadoop URI (file://, hdfs://, s3a://...), given to "
                                             "Spark as is.")
    reset_checkpoint: bool = Field(False, description="Start with an empty checkpoint even though the "
                                                      "commit topic shows an earlier run's output: every "
                                                      "event of the raw topic is written again.")
    kafka: KafkaSettings
    spark: SparkSettings = Field(default_factory=SparkSettings)
    output: OutputSettings = Field(default_factory=OutputSettings)

    @property
    def commit_topic(self) -> str:
        return self.kafka.commit_topic or f"{self.server}.pipeline-commits"

    @property
    def cluster_name(self) -> str:
        return self.cluster or self.server


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    return load_settings(PipelineConfig, path, overrides)
