"""``cassandra-cdc dump``: print the changes in commit log segments as JSON lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..commitlog import CommitLogError, KeyStore, SegmentReader, parse_segment_name
from ..commitlog.render import render_partition_update
from ..commitlog.replay import ReplayStats, replay
from ..schema import SchemaError, load_schema_files


def segment_paths(paths: list[Path]) -> list[Path]:
    """The segment files named, directories expanded, in segment id order."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(p for p in path.iterdir() if parse_segment_name(p.name))
        elif path.exists():
            found.append(path)
        else:
            raise typer.BadParameter(f"{path} does not exist", param_hint="SEGMENT")
    return sorted(found, key=lambda p: (parse_segment_name(p.name) or (0, 0))[1])


def parse_raw_keys(keys: list[str]) -> dict[str, bytes]:
    raw = {}
    for item in keys:
        alias, sep, hex_key = item.rpartition("=")
        try:
            raw[alias] = bytes.fromhex(hex_key)
        except ValueError:
            sep = ""
        if not sep or len(raw.get(alias, b"")) not in (16, 24, 32):
            raise typer.BadParameter(f"{item!r} is not ALIAS=HEX with a 16, 24 or 32-byte AES key",
                                     param_hint="--key")
    return raw


def dump(
    segments: Annotated[list[Path], typer.Argument(help="Segment files (CommitLog-*.log) or directories of them.")],
    schema: Annotated[list[Path], typer.Option(
        "--schema", "-s", help="CQL schema file (what DESCRIBE prints); repeat for several.")],
    keystore: Annotated[Optional[Path], typer.Option(help="JCEKS keystore holding the key of encrypted segments.")] = None,
    keystore_password: Annotated[str, typer.Option(envvar="CASSANDRA_CDC_KEYSTORE_PASSWORD",
                                                   help="Keystore password (env CASSANDRA_CDC_KEYSTORE_PASSWORD).")] = "",
    key_password: Annotated[Optional[str], typer.Option(help="Key password, if not the keystore password.")] = None,
    key: Annotated[list[str], typer.Option(help="Raw AES key of encrypted segments as ALIAS=HEX (instead of a keystore).")] = [],
    limit: Annotated[Optional[int], typer.Option(help="Read only up to this position (e.g. a _cdc.idx offset).")] = None,
) -> None:
    """Print every row-level change in commit log segments as one JSON object per line.

    Each line names keyspace, table, the partition key and clustering columns by name, every cell
    with its value, timestamp, TTL/expiry or tombstone, row, partition and range deletions, and the
    segment and position it came from. A summary per segment goes to stderr. Mutations of tables
    missing from the schema are skipped and counted, as Cassandra skips them. Damage (bad CRCs,
    torn tails, undecodable entries) is reported with file and offset, and every intact entry is
    still printed. Exit status: 0, or 1 when any segment had damage.
    """
    try:
        tables = load_schema_files(schema)
        keys = KeyStore.load(keystore, keystore_password, key_password) if keystore else KeyStore(parse_raw_keys(key))
    except (SchemaError, CommitLogError, OSError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    damaged = False
    out = sys.stdout
    for path in segment_paths(segments):
        stats = ReplayStats()
        try:
            with SegmentReader(path, keys, limit=limit) as segment:
                for entry, mutation in replay(segment, tables, stats):
                    source = {"segment": path.name, "position": entry.position}
                    for update in mutation.updates:
                        for change in render_partition_update(update, source):
                            out.write(json.dumps(change, ensure_ascii=False) + "\n")
                summary = _summary(path, segment, stats)
                damaged |= bool(segment.damage)
        except CommitLogError as error:
            damaged = True
            summary = f"{path}: {error.reason}"
        typer.echo(summary, err=True)
    raise typer.Exit(1 if damaged else 0)


def _summary(path: Path, segment: SegmentReader, stats: ReplayStats) -> str:
    lines = [f"{path.name}: commit log version {segment.version}, {stats.entries} entries, "
             f"{stats.mutations} mutations, {stats.partition_updates} partition updates, "
             f"read to position {segment.position}" + (" (end of segment)" if segment.finished else "")]
    for table_id, count in stats.skipped_unknown_tables.most_common():
        lines.append(f"  skipped {count} mutations of unknown table {table_id}")
    lines.extend(f"  damage: {damage}" for damage in segment.damage)
    return "\n".join(lines)
