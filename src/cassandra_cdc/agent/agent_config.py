"""The agent's configuration: one YAML file, validated before anything starts."""

from __future__ import annotations

import fnmatch
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..settings import ConfigError, load_settings, readable_file
from ..kafka import RAW_TOPIC_PARTITIONS, ServerTopics
from ..kafka.security import KafkaConnection

__all__ = ["AgentConfig", "ConfigError", "load_config"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CqlTls(_Section):
    ca_file: Path = Field(..., description="PEM file of the CA certificates that signed the nodes' "
                                           "(client_encryption_options).")
    cert_file: Path | None = Field(None, description="PEM client certificate, for nodes that require client "
                                                     "certificates (with key_file).")
    key_file: Path | None = Field(None, description="PEM private key of cert_file.")
    key_password: str | None = Field(None, description="Password of an encrypted key_file.")
    verify_hostname: bool = Field(True, description="Check that a node's certificate names the address "
                                                    "connected to.")

    _readable = field_validator("ca_file", "cert_file", "key_file")(readable_file)

    @model_validator(mode="after")
    def _key_with_certificate(self) -> "CqlTls":
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give cert_file and key_file together")
        if self.key_password is not None and self.key_file is None:
            raise ValueError("key_password needs key_file")
        return self


class CassandraSchemaSource(_Section):
    contact_points: list[str] = Field(default_factory=lambda: ["127.0.0.1"],
                                      description="Cassandra hosts to read system_schema from; the first is "
                                                  "the node beside the agent, whose truncations it reads.")
    port: int = Field(9042, description="CQL native port.")
    username: str | None = Field(None, description="CQL user (PasswordAuthenticator).")
    password: str | None = Field(None, description="CQL password (see password_file).")
    tls: CqlTls | None = Field(None, description="Connect with TLS (the nodes' client_encryption_options).")
    local_dc: str | None = Field(None, description="Datacenter of the node the agent runs beside: the only "
                                                   "one queried. Default: the contact points' datacenter.")

    @model_validator(mode="after")
    def _user_with_password(self) -> "CassandraSchemaSource":
        if (self.username is None) != (self.password is None):
            raise ValueError("give username and password together")
        return self


class SchemaSource(_Section):
    file: Path | None = Field(None, description="CQL schema file (what DESCRIBE SCHEMA WITH INTERNALS prints).")
    cassandra: CassandraSchemaSource | None = Field(None, description="Read table metadata from the cluster.")

    @model_validator(mode="after")
    def _one_source(self) -> "SchemaSource":
        if (self.file is None) == (self.cassandra is None):
            raise ValueError("give exactly one of schema.file or schema.cassandra")
        return self


class TableFilter(_Section):
    include: list[str] = Field(default_factory=list,
                               description="ks.table patterns (fnmatch) to publish; empty: every CDC table.")
    exclude: list[str] = Field(default_factory=list, description="ks.table patterns never to publish.")

    def accepts(self, qualified_name: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(qualified_name, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(qualified_name, p) for p in self.exclude)


# Producer settings the agent's no-loss and acknowledgement logic depends on (publisher.py, deliveries.py).
PRODUCER_GUARANTEES = frozenset({"enable.idempotence", "enable.gapless.guarantee", "acks", "message.timeout.ms",
                                 "partitioner"})


class KafkaSettings(KafkaConnection, _Section):
    raw_topic: str | None = Field(None, description="Raw change topic. Default: <server>.raw")
    schema_topic: str | None = Field(None, description="Compacted table schema topic. "
                                                       "Default: <server>.table-schemas")
    errors_topic: str | None = Field(None, description="Dead-letter topic. Default: <server>.errors")
    raw_topic_partitions: int = Field(RAW_TOPIC_PARTITIONS, ge=1, description="Partitions of the raw topic when the agent creates it.")
    producer: dict[str, Any] = Field(default_factory=dict,
                                     description="Extra librdkafka producer settings (batching); they "
                                                 "override what kafka.security sets.")
    max_buffered_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024,
                                    description="Unacknowledged bytes held in memory before reading pauses.")
    accept_lost_records: bool = Field(
        False, description="Start even though the raw topic lost records Kafka had acknowledged to this agent "
                           "(logged and counted); without it the agent stops with exit status 1.")

    @field_validator("producer")
    @classmethod
    def _keeps_the_delivery_guarantees(cls, value: dict[str, Any]) -> dict[str, Any]:
        fixed = sorted(PRODUCER_GUARANTEES & value.keys())
        if fixed:
            raise ValueError(f"{', '.join(fixed)} cannot be changed: the agent relies on them never to lose a record")
        return value


class Cleanup(_Section):
    mode: Literal["delete", "archive", "command", "keep"] = Field(
        "delete", description="What to do with a segment once it is COMPLETED and fully acknowledged.")
    archive_dir: Path | None = Field(None, description="Where 'archive' moves segments and idx files.")
    command: str | None = Field(None, description="'command': run with {segment} and {index} substituted; "
                                                  "the files are deleted when it exits 0.")

    @model_validator(mode="after")
    def _complete(self) -> "Cleanup":
        if self.mode == "archive" and self.archive_dir is None:
            raise ValueError("cleanup.mode 'archive' needs cleanup.archive_dir")
        if self.mode == "command" and not self.command:
            raise ValueError("cleanup.mode 'command' needs cleanup.command")
        return self


class Encryption(_Section):
    keystore: Path | None = Field(None, description="JCEKS keystore of transparent_data_encryption_options.")
    keystore_password: str | None = Field(None, description="Keystore password.")
    key_password: str | None = Field(None, description="Key password, if different.")
    keys: dict[str, str] = Field(default_factory=dict, description="Raw AES keys by alias, as hex.")


class Metrics(_Section):
    port: int = Field(9103, ge=0, le=65535, description="Port of the Prometheus metrics, /healthz and "
                                                        "/readyz; 0 disables the endpoint.")
    host: str = Field("0.0.0.0", description="Address the metrics endpoint binds.")


class AgentConfig(ServerTopics, _Section):
    server: str = Field(..., description="Logical name of the Cassandra cluster; prefix of every topic.")
    node_id: str = Field(default_factory=socket.gethostname, description="This node's id in raw records.",
                         json_schema_extra={"default_text": "the host name"})
    cdc_raw: Path = Field(..., description="The node's cdc_raw_directory.")
    state_dir: Path = Field(..., description="Where the agent keeps its positions (durable, local disk).")
    quarantine_dir: Path | None = Field(
        None, description="Damaged entries' bytes and reports, and segments that could not be read whole. "
                          "Default: <state_dir>/quarantine")
    schema_: SchemaSource = Field(..., alias="schema", description="Where table metadata comes from.")
    tables: TableFilter = Field(default_factory=TableFilter)
    kafka: KafkaSettings
    cleanup: Cleanup = Field(default_factory=Cleanup)
    encryption: Encryption = Field(default_factory=Encryption)
    metrics: Metrics = Field(default_factory=Metrics)
    cdc_total_space_mb: int | None = Field(
        None, ge=1, description="The node's cdc_total_space in MiB. Read from the node by CQL with "
                                "schema.cassandra (a value given here that differs is reported); give it "
                                "with schema.file.",
        json_schema_extra={"default_text": "the node's; 4096 with schema.file"})
    commitlog_segment_size_mb: int | None = Field(
        None, ge=1, description="The node's commitlog_segment_size in MiB: read from the node, as "
                                "cdc_total_space.",
        json_schema_extra={"default_text": "the node's; 32 with schema.file"})
    cdc_block_writes: bool | None = Field(
        None, description="The node's cdc_block_writes (false: it deletes its oldest CDC segments when "
                          "cdc_raw is full): read from the node, as cdc_total_space.",
        json_schema_extra={"default_text": "the node's; true with schema.file"})
    max_mutation_size_mb: int | None = Field(
        None, ge=1, description="The node's max_mutation_size in MiB, which sizes the raw topic's "
                                "max.message.bytes and the producer's message.max.bytes: read from the node, as "
                                "cdc_total_space.",
        json_schema_extra={"default_text": "the node's; half of commitlog_segment_size_mb with schema.file"})
    space_warning_percent: int = Field(80, ge=1, le=100,
                                       description="Warn when cdc_raw uses this much of cdc_total_space "
                                                   "(and, whatever this says, one segment before the node "
                                                   "acts on a full cdc_raw).")
    segment_loss: Literal["continue", "stop"] = Field(
        "continue", description="When segments left cdc_raw before the agent published them (the node "
                                "deletes its oldest with cdc_block_writes: false): 'continue' reports and "
                                "counts the loss and publishes on; 'stop' reports it and exits with status 1 "
                                "until started with --accept-segment-loss. A stopped agent on a node that "
                                "deletes segments loses more.")
    accept_segment_loss: bool = Field(
        False, description="Go on past the segment losses found at this start (logged and counted) although "
                           "segment_loss is 'stop'.")
    poll_interval_ms: int = Field(1000, ge=10, description="Fallback polling when no file system event comes.")
    state_flush_ms: int = Field(200, ge=1, description="How often acknowledged positions are saved.")
    stale_segment_seconds: float = Field(
        60.0, gt=0, description="A segment never COMPLETED (node crash) is read to its end once a newer segment "
                                "has data and it has not changed for this long.")
    unknown_table_wait_seconds: float = Field(
        60.0, ge=0, description="A mutation of a table the schema does not know holds reading back while "
                                "the schema is reloaded, for up to this long, before it is skipped as "
                                "Cassandra skips a dropped table's. Also how long after a schema change "
                                "the node logged, and a read did not show, records are checked against the "
                                "schema and one that needs a newer definition waits for it.")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("server")
    @classmethod
    def _topic_safe(cls, value: str) -> str:
        if not value or any(c not in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-" for c in value):
            raise ValueError("use letters, digits, '.', '_' and '-' only (it prefixes Kafka topic names)")
        return value

    @field_validator("node_id")
    @classmethod
    def _fits_raw_records(cls, value: str) -> str:
        if not value or len(value.encode("utf-8")) > 255:
            raise ValueError("must be 1 to 255 bytes of UTF-8 (raw records carry it with a one-byte length)")
        return value

    @field_validator("cdc_raw")
    @classmethod
    def _existing_directory(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"{value} is not a directory (Cassandra's cdc_raw_directory)")
        return value

    @property
    def quarantine(self) -> Path:
        return self.quarantine_dir or self.state_dir / "quarantine"


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> AgentConfig:
    """Read and validate the agent's YAML file (if any) with command-line overrides on top."""
    return load_settings(AgentConfig, path, overrides)
