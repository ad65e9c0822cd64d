"""``cassandra-cdc tail``: print what is on a topic, readably: events, raw records, schema records, dead letters."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import BaseModel, ConfigDict

from ..kafka.security import KafkaConnection
from ..kafka.topic_names import schema_topics

DEFAULT_BOOTSTRAP_SERVERS = "127.0.0.1:9092"


class _TailKafka(KafkaConnection):
    """What tail takes from a component's ``kafka`` section: how to reach and log in to the brokers."""

    model_config = ConfigDict(extra="ignore")


class _TailConfig(BaseModel):
    """An agent's or a pipeline's configuration file, of which tail reads the ``kafka`` section only."""

    model_config = ConfigDict(extra="ignore")
    kafka: _TailKafka


def tail(
    topic: Annotated[str, typer.Argument(help="The topic: <server>.<keyspace>.<table> (events), <server>.raw, "
                                              "<server> (schema changes), <server>.table-schemas or "
                                              "<server>.errors.")],
    bootstrap_servers: Annotated[Optional[str], typer.Option(
        help="Kafka bootstrap servers [default: the --config file's, else 127.0.0.1:9092].")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="The agent's or the pipeline's "
                                                   "configuration file: connect to Kafka as it does "
                                                   "(kafka.bootstrap_servers, kafka.security).")] = None,
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at the oldest record "
                                                 "(default: only new ones).")] = False,
    max_records: Annotated[Optional[int], typer.Option("--max", help="Stop after this many records.")] = None,
    until_end: Annotated[bool, typer.Option("--until-end", help="Stop at the end of the topic instead of waiting "
                                            "for more.")] = False,
    raw: Annotated[Optional[bool], typer.Option("--raw/--events", help="Decode raw change records (default: when "
                                                "TOPIC ends with .raw).")] = None,
    schema: Annotated[list[Path], typer.Option("--schema", "-s", help="CQL schema file to decode raw records with "
                                               "(default: the schema topic).")] = [],
    schema_topic: Annotated[Optional[str], typer.Option(help="Schema topic for raw records (default: SERVER, "
                                                        "then SERVER.table-schemas, with SERVER TOPIC "
                                                        "without .raw).")] = None,
) -> None:
    """Print the records of a topic, one readable line each.

    Events: the write time (UTC), op, table, primary key and what changed (before → after). Raw records
    (--raw): node, segment, position, write time and table, then, when the table's schema is known, the
    partition update as `cassandra-cdc dump` prints it. Other records are printed as JSON. Reads
    committed records only (the pipeline writes events in transactions). Ctrl-C stops.
    """
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition

    from ..kafka.consume import END_CHECK_SECONDS, PauseAtEnd
    from ..kafka.security import LoginCheck
    from ..settings import ConfigError, load_settings

    if max_records is not None and max_records < 1:
        raise typer.BadParameter("--max must be at least 1")
    try:
        servers = bootstrap_servers or (None if config else DEFAULT_BOOTSTRAP_SERVERS)
        kafka = load_settings(_TailConfig, config, {"kafka.bootstrap_servers": servers}).kafka
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    client = kafka.librdkafka()
    decode_raw = topic.endswith(".raw") if raw is None else raw
    printer = (_RawPrinter(client, schema, schema_topics(topic.removesuffix(".raw"), schema_topic))
               if decode_raw else None)
    login = LoginCheck()
    consumer = Consumer({**client, **login.settings(), "group.id": f"cassandra-cdc-tail-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        except KafkaException as error:
            typer.echo(f"error: {login.explain(consumer, kafka.bootstrap_servers, error)}", err=True)
            raise typer.Exit(2) from None
        if metadata is None or metadata.error is not None or not metadata.partitions:
            typer.echo(f"error: topic {topic} does not exist on {kafka.bootstrap_servers}", err=True)
            raise typer.Exit(2)
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        places = [(topic, p) for p in sorted(metadata.partitions)]
        consumer.assign([TopicPartition(topic, p, start) for _, p in places])
        ends = PauseAtEnd(consumer)  # no busy fetching of partitions read to their end
        printed = 0
        while max_records is None or printed < max_records:
            ends.check(places)
            if ends.all_paused(places):
                if until_end:
                    break
                time.sleep(END_CHECK_SECONDS)
                continue
            for message in consumer.consume(min(500, (max_records or 500) - printed), timeout=0.5):
                if message.error() is not None:
                    continue
                for line in (printer.lines(message) if printer else [_line(message)]):
                    typer.echo(line)
                printed += 1
                if max_records is not None and printed >= max_records:
                    break
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def _line(message: Any) -> str:
    """An event, or any other record as JSON (or hex when it is neither)."""
    from ..events.event_text import event_line, key_text

    key, value = message.key(), message.value()
    key_document = _json(key)
    key_row = key_document.get("payload") if isinstance(key_document, dict) and "payload" in key_document else None
    if value is None:
        return f"tombstone {key_text(key_row, None) if isinstance(key_row, dict) else _text(key)}"
    document = _json(value)
    payload = document.get("payload") if isinstance(document, dict) else None
    if isinstance(payload, dict) and "op" in payload:
        key_columns = list(key_row) if isinstance(key_row, dict) else None
        return event_line(payload, key_columns)
    if value[:1] == b"\x00" and len(value) > 5 and document is None:
        return f"{_text(key)}: Avro record of schema id {int.from_bytes(value[1:5], 'big')} (schema registry format)"
    if document is not None:
        return f"{_text(key)}: {json.dumps(document, ensure_ascii=False, separators=(',', ':'))}"
    return f"{_text(key)}: 0x{value[:64].hex()}{'…' if len(value) > 64 else ''} ({len(value)} bytes)"


def _json(data: bytes | None) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _text(data: bytes | None) -> str:
    if data is None:
        return "(no key)"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + data.hex()


class _RawPrinter:
    """Raw change records: a header line, then the partition update as ``dump`` prints it."""

    def __init__(self, client: dict[str, Any], schema_files: list[Path],
                 schema_topics: tuple[str, ...]) -> None:
        from ..schema import SchemaError, load_schema_files

        self.catalog = None
        self.schema = None
        if schema_files:
            try:
                self.schema = load_schema_files(schema_files)
            except (SchemaError, OSError) as error:
                typer.echo(f"error: {error}", err=True)
                raise typer.Exit(2)
        else:
            from ..kafka.schema_catalog import SchemaCatalog

            self.catalog = SchemaCatalog(client["bootstrap.servers"], schema_topics, client)

    def _table(self, table_id: uuid.UUID) -> Any:
        if self.schema is not None:
            return self.schema.table_by_id(table_id), self.schema
        assert self.catalog is not None
        found = self.catalog.table(table_id)
        return (found[0] if found else None), self.catalog.schema

    def lines(self, message: Any) -> list[str]:
        from ..events.event_text import micros_text
        from ..kafka.raw_records import RawRecord, RawRecordError
        from ..schema.types import json_text
        from ..storage import PartitionUpdateSerializer
        from ..storage.binary_io import DataInput
        from ..storage.partition_json import render_partition_update

        value = message.value()
        if value is None:
            return [f"tombstone {_text(message.key())}"]
        try:
            record = RawRecord.decode(value)
        except RawRecordError as error:
            return [f"not a raw record ({error}): {len(value)} bytes"]
        table, schema = self._table(record.table_id)
        name = table.qualified_name if table is not None else f"table {record.table_id}"
        kind = "snapshot" if record.snapshot else f"CommitLog-{record.commitlog_version}-{record.segment_id}.log"
        header = (f"{record.node_id} {kind}@{record.position} {micros_text(record.write_time)} {name} "
                  f"({len(record.update)} bytes)")
        if table is None:
            return [header + " — no schema for this table: give --schema"]
        source = {"node": record.node_id, "segment": record.segment_id, "position": record.position}
        try:
            update = PartitionUpdateSerializer.deserialize(DataInput(record.update), schema, record.commitlog_version)
            changes = ["  " + json_text(change)
                       for change in render_partition_update(update, source)]
        except Exception as error:  # an update the schema cannot decode: say so, go on with the next record
            return [f"{header} — cannot decode: {error}"]
        return [header] + changes
