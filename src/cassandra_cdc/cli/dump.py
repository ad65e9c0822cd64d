"""``cassandra-cdc dump``: print the changes in commit log segments, or the rows of SSTables, as JSON lines."""

from __future__ import annotations

import collections
import stat
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, Iterable, Optional

import typer

from ..commitlog import CommitLogError, DamageKind, KeyStore, SegmentReader, parse_segment_name
from ..storage.partition_update import PartitionUpdate
from ..storage.partition_json import KeyDecodeError, render_partition_update
from ..commitlog.replay import ReplayStats, replay
from ..schema import Schema, SchemaError, TableMetadata, load_schema_files
from ..schema.types import json_text
from ..sstable import SSTable, SSTableError, SSTableReadStats
from ..sstable.sstable_descriptor import COMPONENT_NAME, is_data_file


def split_inputs(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """Commit log segments and SSTable Data.db files among the paths (directories expanded, not recursed).

    A file named like an SSTable component stands for its SSTable's Data.db; any other file is read as a
    segment. A directory holding neither is an error, so that nothing is skipped silently; so is an input
    that is not a regular file (a FIFO would block the read forever).
    """
    segments: list[Path] = []
    sstables: dict[Path, None] = {}
    for path in paths:
        if not path.exists():
            raise typer.BadParameter(f"{path} does not exist", param_hint="PATHS")
        if path.is_dir():
            found_segments = [_regular_file(p) for p in path.iterdir() if parse_segment_name(p.name)]
            found_sstables = sorted(_regular_file(p) for p in path.iterdir() if is_data_file(p))
            if not found_segments and not found_sstables:
                raise typer.BadParameter(f"{path} holds no commit log segment and no SSTable", param_hint="PATHS")
            segments.extend(found_segments)
            sstables.update(dict.fromkeys(found_sstables))
        elif match := COMPONENT_NAME.match(_regular_file(path).name):
            sstables[path.with_name(f"{match.group(1)}-{match.group(2)}-{match.group(3)}-Data.db")] = None
        else:
            segments.append(_regular_file(path))
    segments.sort(key=lambda p: (parse_segment_name(p.name) or (0, 0))[1])
    return segments, list(sstables)


def _regular_file(path: Path) -> Path:
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "not a regular file")
        raise typer.BadParameter(f"{path} is {kind}: only regular files are read as commit log segments or "
                                 "SSTables", param_hint="PATHS")
    return path


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
    paths: Annotated[list[Path], typer.Argument(
        help="Commit log segments (CommitLog-*.log), SSTables (their Data.db), or directories of either.")],
    schema: Annotated[list[Path], typer.Option(
        "--schema", "-s", help="CQL schema file (what DESCRIBE prints); repeat for several. Required for "
                               "commit log segments; for SSTables it gives column names, else Statistics.db does.")] = [],
    table: Annotated[Optional[str], typer.Option(
        help="KEYSPACE.TABLE of the SSTables given, when their directories do not name it.")] = None,
    keystore: Annotated[Optional[Path], typer.Option(help="JCEKS keystore holding the key of encrypted segments.")] = None,
    keystore_password: Annotated[str, typer.Option(envvar="CASSANDRA_CDC_KEYSTORE_PASSWORD",
                                                   help="Keystore password (env CASSANDRA_CDC_KEYSTORE_PASSWORD).")] = "",
    key_password: Annotated[Optional[str], typer.Option(help="Key password, if not the keystore password.")] = None,
    key: Annotated[list[str], typer.Option(help="Raw AES key of encrypted segments as ALIAS=HEX (instead of a keystore).")] = [],
    limit: Annotated[Optional[int], typer.Option(
        min=0, help="Read segments only up to this position (e.g. a _cdc.idx offset).")] = None,
) -> None:
    """Print every row-level change in commit log segments, or every row of SSTables, as one JSON object per line.

    Each line names keyspace, table, the partition key and clustering columns by name, every cell
    with its value, timestamp, TTL/expiry or tombstone, row, partition and range deletions, and where
    it came from: segment and position, or SSTable and the offset of the partition in its Data.db.
    A summary per file goes to stderr. Mutations of tables missing from the schema are skipped and
    counted, as Cassandra skips them. Damage (bad CRCs, torn tails, undecodable entries) is reported
    with file and offset, and every intact entry is still printed; an SSTable is read up to its first
    damage. SSTable values are decoded with the types its Statistics.db records; without the table in
    the schema, key and clustering columns are named key, column1, column2... A key or clustering value
    that its type in the schema cannot decode is reported as damage, its change not printed.

    Exit status: 0; 1 when any input had damage; 2 for bad arguments, and when the segments hold
    mutations but none of a table in the schema (its table ids are not those of the cluster).
    """
    segments, sstables = split_inputs(paths)
    if segments and not schema:
        typer.echo("error: --schema is required to read commit log segments", err=True)
        raise typer.Exit(2)
    try:
        tables = load_schema_files(schema) if schema else Schema()
        keys = KeyStore.load(keystore, keystore_password, key_password) if keystore else KeyStore(parse_raw_keys(key))
    except (SchemaError, CommitLogError, OSError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)
    override = _table_option(table)
    damaged = False
    out = sys.stdout
    decoded = 0
    unknown_tables: collections.Counter[uuid.UUID] = collections.Counter()
    for path in segments:
        stats = ReplayStats()
        try:
            with SegmentReader(path, keys, limit=limit) as segment:
                for entry, mutation in replay(segment, tables, stats):
                    try:
                        _write(out, mutation.updates, {"segment": path.name, "position": entry.position})
                    except KeyDecodeError as error:
                        segment.report(DamageKind.UNDECODABLE_MUTATION, str(error), entry.section_offset,
                                       entry.start, entry.body)
                summary = _summary(path, segment, stats)
                damaged |= bool(segment.damage)
        except CommitLogError as error:
            damaged = True
            summary = f"{path}: {error.reason}"
        typer.echo(summary, err=True)
        decoded += stats.mutations
        unknown_tables.update(stats.skipped_unknown_tables)
    for path in sstables:
        ok, summary = _dump_sstable(out, path, tables, override, bool(schema))
        damaged |= not ok
        typer.echo(summary, err=True)
    if unknown_tables and not decoded:
        seen = ", ".join(f"{table_id} ({count} mutations)"
                         for table_id, count in unknown_tables.most_common())
        typer.echo(f"error: no mutation read is of a table in the schema; tables not in it: {seen}. Give the "
                   "schema of the cluster that wrote the segments: table ids must match", err=True)
        raise typer.Exit(2)
    raise typer.Exit(1 if damaged else 0)


def _write(out: Any, updates: Iterable[PartitionUpdate], source: dict[str, Any]) -> None:
    """Print the changes, all or (KeyDecodeError) none."""
    lines = [json_text(change) + "\n"
             for update in updates for change in render_partition_update(update, source)]
    out.writelines(lines)


def _table_option(text: str | None) -> tuple[str, str] | None:
    if text is None:
        return None
    keyspace, dot, name = text.partition(".")
    if not dot or not keyspace or not name:
        raise typer.BadParameter(f"{text!r} is not KEYSPACE.TABLE", param_hint="--table")
    return keyspace, name


def _dump_sstable(out: Any, path: Path, tables: Schema, override: tuple[str, str] | None,
                  have_schema: bool) -> tuple[bool, str]:
    stats = SSTableReadStats()
    note = ""
    try:
        sstable = SSTable(path)
        keyspace, name = override or (sstable.descriptor.keyspace, sstable.descriptor.table)
        table = schema_table_of(sstable, tables, keyspace, name)
        if table is None:
            table = sstable.table_from_header(keyspace, name)
            if have_schema:
                note = f"\n  {table.qualified_name} is not in the schema: names and types from Statistics.db"
        for offset, update in sstable.partitions_with_offsets(table, stats=stats):
            _write(out, (update,), {"sstable": str(path), "position": offset})
    except SSTableError as error:
        return False, f"{error}\n  read {stats.partitions} partitions before the error"
    except KeyDecodeError as error:
        return False, f"{path}: {error}\n  read {stats.partitions} partitions before the error"
    checks = "chunk checksums" if stats.chunk_crcs_checked else "no chunk checksums (no CRC.db)"
    checks += ", Digest.crc32" if stats.digest_checked else ", no Digest.crc32"
    return True, (f"{path}: SSTable {sstable.version}, table {table.qualified_name}, {stats.partitions} partitions, "
                  f"{stats.rows} rows, {stats.range_tombstone_markers} range tombstone markers; {checks} verified"
                  + note)


def schema_table_of(sstable: SSTable, tables: Schema, keyspace: str | None, name: str | None) -> TableMetadata | None:
    """The schema's table for an SSTable: by the keyspace and table name given (or its directories
    name), else by the table id in its directory name."""
    if keyspace and name:
        found = tables.table(keyspace, name)
        if found is not None:
            return found
    if sstable.descriptor.table_id is not None:
        return tables.table_by_id(sstable.descriptor.table_id)
    return None


def _summary(path: Path, segment: SegmentReader, stats: ReplayStats) -> str:
    lines = [f"{path.name}: commit log version {segment.version}, {stats.entries} entries, "
             f"{stats.mutations} mutations, {stats.partition_updates} partition updates, "
             f"read to position {segment.position}" + (" (end of segment)" if segment.finished else "")]
    for table_id, count in stats.skipped_unknown_tables.most_common():
        lines.append(f"  skipped {count} mutations of unknown table {table_id}")
    lines.extend(f"  damage: {damage}" for damage in segment.damage)
    return "\n".join(lines)
