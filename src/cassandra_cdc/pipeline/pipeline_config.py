"""The pipeline's configuration: one YAML file (``pipeline.yaml``), validated before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator,
                      model_validator)

from ..events.column_rules import HASH_ALGORITHMS, ColumnRules, HashMask, checked_patterns, hash_algorithm
from ..events.field_mapping import CompositeMode, DecimalMode, IntervalMode, MapMode, TypeModes, VarintMode
from ..settings import ConfigError, load_settings, readable_file, setting_text
from ..kafka import ServerTopics
from ..kafka.security import KafkaConnection

__all__ = ["ConfigError", "PipelineConfig", "load_config"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _comma_separated(value: Any) -> Any:
    """A list as Debezium gives one, comma-separated text (``a,b``), or as a YAML list."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# Regular expressions matched, whole and case-insensitively, against <keyspace>.<table>.<column>.
ColumnPatterns = Annotated[tuple[str, ...], BeforeValidator(_comma_separated),
                           AfterValidator(checked_patterns)]
Operation = Literal["c", "u", "d", "t"]


class HashMaskSettings(_Section):
    algorithm: str = Field(..., description=f"Java's MessageDigest name: {', '.join(HASH_ALGORITHMS)}.")
    salt: str = Field(..., description="Hashed before each value (its UTF-8 bytes); a secret (salt_file).")
    version: Literal[1, 2] = Field(1, description="1: the value as Java serializes a string (Debezium's "
                                                  "column.mask.hash); 2: its UTF-8 bytes "
                                                  "(column.mask.hash.v2).")
    columns: ColumnPatterns = Field(..., description="The columns hashed (as column_exclude_list).")

    @field_validator("algorithm")
    @classmethod
    def _known(cls, algorithm: str) -> str:
        hash_algorithm(algorithm)
        return algorithm


class KafkaSettings(KafkaConnection, _Section):
    raw_topic: str | None = Field(None, description="Raw change topic the agents publish to. Default: <server>.raw")
    schema_topic: str | None = Field(None, description="Table schema topic. Default: <server>.table-schemas, "
                                                       "read after <server> (earlier versions' schema topic)")
    errors_topic: str | None = Field(None, description="Undecodable records go here. Default: <server>.errors")
    commit_topic: str | None = Field(None, description="Compacted topic of committed micro-batches (exactly-once "
                                                       "output). Default: <server>.pipeline-commits")
    events_topic_partitions: int = Field(6, ge=1, description="Partitions of an event topic the pipeline creates.")
    source: Literal["auto", "python", "kafka"] = Field(
        "auto", description="Read Kafka with Spark's built-in 'kafka' format (needs its jar), the Python data "
                            "source over confluent-kafka, or 'auto': the built-in one when its jar is there.")
    max_offsets_per_trigger: int = Field(200_000, ge=1, description="Raw records per micro-batch at most.")
    starting_offsets: Literal["earliest", "latest"] = Field("earliest", description="Where a new query starts.")
    consumer: dict[str, Any] = Field(default_factory=dict, description=(
        "Extra consumer settings, over what kafka.security sets: librdkafka's, and with source 'kafka' the "
        "Java client's."))
    producer: dict[str, Any] = Field(default_factory=dict, description="Extra librdkafka producer settings, "
                                     "over what kafka.security sets.")
    accept_gap: bool = Field(
        False, description="Start although raw records were deleted (retention) before the pipeline read them: the "
                           "gap is logged and counted, and the Kafka source skips what is gone for this run. Set it "
                           "once, after bootstrapping the tables; without it the pipeline does not start.")


class SparkSettings(_Section):
    master: str | None = Field(None, description=(
        "Spark master; default local[2]. A local master retries each failed task as a cluster does: "
        "local[N] runs as local[N,F], F the spark.task.maxFailures of conf (default 4). Ignored under "
        "spark-submit, which sets its own."))
    shuffle_partitions: int = Field(2, ge=1, description="State store partitions, i.e. the tasks that merge in "
                                                         "parallel (fixed once a checkpoint exists).")
    state_pages: int = Field(256, ge=1, le=1 << 20,
                             description="Pages of merge state each raw topic partition starts with; they split "
                             "as the state grows, so that a page holds about 1 KB whatever the table's size "
                             "(fixed once a checkpoint exists; the default suits any table: docs/pipeline.md, "
                             "State).")
    trigger_interval: str = Field("1 second", description="Micro-batch interval.")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings; YAML numbers and "
                                 "booleans reach Spark as text (`256`, `true`).")

    @field_validator("conf", mode="before")
    @classmethod
    def _values_as_spark_reads_them(cls, conf: Any) -> Any:
        """YAML's numbers and booleans as the strings Spark reads (``true``, not ``True``)."""
        if not isinstance(conf, dict):
            return conf
        return {key: setting_text(value) if isinstance(value, (bool, int, float)) else value
                for key, value in conf.items()}

    @field_validator("conf")
    @classmethod
    def _task_attempts_a_count(cls, conf: dict[str, str]) -> dict[str, str]:
        attempts = str(conf.get("spark.task.maxFailures", "1")).strip()
        if not attempts.isdigit() or int(attempts) < 1:
            raise ValueError(f"spark.task.maxFailures must be a whole number of attempts ≥ 1, not {attempts!r}")
        return conf


class SchemaRegistrySettings(_Section):
    url: str = Field(..., description="The registry's URL (a Confluent-compatible API).")
    username: str | None = Field(None, description="HTTP basic authentication user (with password).")
    password: str | None = Field(None, description="HTTP basic authentication password (see password_file).")
    ca_file: Path | None = Field(None, description="PEM file of the CA certificates that signed an https "
                                                   "registry's; default: the system's.")
    cert_file: Path | None = Field(None, description="PEM client certificate, for a registry that "
                                                     "authenticates clients by TLS (with key_file).")
    key_file: Path | None = Field(None, description="PEM private key of cert_file.")
    key_password: str | None = Field(None, description="Password of an encrypted key_file.")

    _readable = field_validator("ca_file", "cert_file", "key_file")(readable_file)

    @model_validator(mode="after")
    def _complete(self) -> "SchemaRegistrySettings":
        if (self.username is None) != (self.password is None):
            raise ValueError("give username and password together")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give cert_file and key_file together")
        return self

    def client_settings(self) -> dict[str, str]:
        """confluent-kafka's ``SchemaRegistryClient`` settings."""
        settings = {"url": self.url}
        if self.username is not None:
            settings["basic.auth.user.info"] = f"{self.username}:{self.password}"
        for key, value in (("ssl.ca.location", self.ca_file), ("ssl.certificate.location", self.cert_file),
                           ("ssl.key.location", self.key_file), ("ssl.key.password", self.key_password)):
            if value is not None:
                settings[key] = str(value)
        return settings


class OutputSettings(_Section):
    format: Literal["json", "avro"] = Field("json", description="Kafka Connect JSON (schema + payload) or Avro.")
    schema_registry_url: str | None = Field(None, description="Avro: register schemas here and use the "
                                                              "Confluent wire format (Avro needs a "
                                                              "registry). Short for schema_registry.url.")
    schema_registry: SchemaRegistrySettings | None = Field(
        None, description="Avro: the schema registry, with its login and TLS.")
    tombstones: bool = Field(
        True, description="Follow each delete event with a tombstone (null value), as Debezium does by "
                          "default, so that compaction forgets the row.")
    compacted_topics: bool = Field(
        True, description="Create the event topics compacted (cleanup.policy=compact): each keeps the latest "
                          "event of every row (the errors topic is never compacted).")
    static_only_rows: Literal["emit", "skip"] = Field(
        "emit", description="A partition with static values and no rows: emit it as a row with null "
                            "clustering columns (as SELECT * shows it), or skip it (for JDBC sinks, whose "
                            "primary key refuses nulls; the static values still come with every real row).")
    decimal_handling_mode: DecimalMode = Field(
        "precise", description="decimal columns as Debezium's decimal.handling.mode: precise "
                               "(io.debezium.data.VariableScaleDecimal), double, or string (digits, no "
                               "exponent).")
    varint_handling_mode: VarintMode = Field(
        "precise", description="varint columns: precise (Connect Decimal, scale 0), long (its low 64 bits, "
                               "as Debezium's Cassandra connector by default), or string.")
    interval_handling_mode: IntervalMode = Field(
        "string", description="duration columns: string (io.debezium.time.Interval, ISO 8601, exact) or "
                              "numeric (io.debezium.time.NanoDuration, a month counted as 30 days).")
    composite_handling_mode: CompositeMode = Field(
        "nested", description="user types, tuples and collections holding those or collections: nested "
                              "(structs, arrays, maps) or json (io.debezium.data.Json: the text of CQL's "
                              "toJson, which Debezium's JDBC sink writes into a json column).")
    map_handling_mode: MapMode = Field(
        "map", description="map columns: map (a Connect map; in Avro a map, or an array of key and value "
                           "records for keys that are not text) or json (io.debezium.data.Json: the text of "
                           "CQL's toJson, keys as text, which Debezium's JDBC sink writes into a json "
                           "column, exactly).")
    skipped_operations: Annotated[tuple[Operation, ...], BeforeValidator(_comma_separated)] = Field(
        (), description="Debezium's skipped.operations: the events not written, of c (inserts), u (updates), "
                        "d (deletes, with their tombstones), t (truncations); comma-separated or a list; "
                        "none: every event is written.")
    column_exclude_list: ColumnPatterns = Field(
        (), description="Debezium's column.exclude.list: regular expressions matched, whole and "
                        "case-insensitively, against <keyspace>.<table>.<column>; the columns they match are "
                        "left out of the events' rows and schemas (a primary key column stays in the key).")
    column_truncate_to_chars: dict[int, ColumnPatterns] = Field(
        default_factory=dict, description="Debezium's column.truncate.to.N.chars, as {N: columns}: text, "
                                          "varchar and ascii values longer than N characters cut to N.")
    column_mask_with_chars: dict[int, ColumnPatterns] = Field(
        default_factory=dict, description="Debezium's column.mask.with.N.chars, as {N: columns}: text, "
                                          "varchar and ascii values (null too) replaced by N asterisks.")
    column_mask_hash: list[HashMaskSettings] = Field(
        default_factory=list, description="Debezium's column.mask.hash[.v2].<algorithm>.with.salt.<salt>: "
                                          "text, varchar and ascii values replaced by the hexadecimal hash "
                                          "of the salt and the value (docs/events.md, Column options).")
    include_schema_changes: bool = Field(
        True, description="Debezium's include.schema.changes: write a schema change event (Debezium's "
                          "SchemaChangeKey/SchemaChangeValue) to the <server> topic for each version of a "
                          "table the agents publish, once.")
    heartbeat_interval_ms: int = Field(
        0, ge=0, description="Debezium's heartbeat.interval.ms: while the pipeline runs, write a heartbeat "
                             "(key {serverName}, value {ts_ms}, Debezium's schemas) to "
                             "<heartbeat_topic_prefix>.<server> this often; 0: no heartbeats.")
    heartbeat_topic_prefix: str = Field("__debezium-heartbeat",
                                        description="Debezium's topic.heartbeat.prefix.")
    exactly_once: bool = Field(True, description="Transactional output per micro-batch (consumers use "
                                                 "isolation.level=read_committed); false: at-least-once.")

    @model_validator(mode="after")
    def _one_registry(self) -> "OutputSettings":
        if self.schema_registry_url is not None and self.schema_registry is not None:
            raise ValueError("give schema_registry_url or schema_registry.url, not both")
        # Avro without a registry has no form that Kafka's deserializers read (they take a schema id).
        if self.format == "avro" and self.schema_registry_url is None and self.schema_registry is None:
            raise ValueError("format avro needs a schema registry: set output.schema_registry_url "
                             "(or output.schema_registry)")
        return self

    def registry_client_settings(self) -> dict[str, str]:
        """The schema registry client's settings; empty without a registry."""
        if self.schema_registry is not None:
            return self.schema_registry.client_settings()
        return {"url": self.schema_registry_url} if self.schema_registry_url else {}

    @field_validator("skipped_operations", mode="before")
    @classmethod
    def _none_is_empty(cls, operations: Any) -> Any:
        return () if operations in ("none", ["none"]) else operations

    @field_validator("column_truncate_to_chars", "column_mask_with_chars")
    @classmethod
    def _lengths_not_negative(cls, rules: dict[int, tuple[str, ...]]) -> dict[int, tuple[str, ...]]:
        for length in rules:
            if length < 0:
                raise ValueError(f"a length of characters is 0 or more, not {length}")
        return rules

    @property
    def column_rules(self) -> ColumnRules:
        hashes = tuple(HashMask(h.algorithm, h.salt, h.columns, h.version) for h in self.column_mask_hash)
        return ColumnRules(self.column_exclude_list, tuple(sorted(self.column_truncate_to_chars.items())),
                           tuple(sorted(self.column_mask_with_chars.items())), hashes)

    @property
    def type_modes(self) -> TypeModes:
        return TypeModes(self.decimal_handling_mode, self.varint_handling_mode, self.interval_handling_mode,
                         self.composite_handling_mode, self.map_handling_mode)


class MetricsSettings(_Section):
    port: int = Field(0, ge=0, le=65535, description="Port of the driver's Prometheus metrics, /healthz and "
                                                     "/readyz (e.g. 9104); 0: no endpoint.")
    host: str = Field("0.0.0.0", description="Address the metrics endpoint binds.")


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
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)

    @property
    def commit_topic(self) -> str:
        return self.kafka.commit_topic or f"{self.server}.pipeline-commits"

    @property
    def cluster_name(self) -> str:
        return self.cluster or self.server


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    return load_settings(PipelineConfig, path, overrides)
