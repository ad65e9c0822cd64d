"""Which SSTables a bootstrap reads, and how they are cut into tasks.

Each ``--sstables`` value is one node's snapshot of the table: a directory of SSTables (``nodetool
snapshot`` leaves them in ``<data>/<keyspace>/<table>-<id>/snapshots/<tag>/``), one SSTable's Data.db, a
glob matching several of those, or ``NODE=PATH`` to name the node. Without a name, a node is named
after the first path component that tells the directories apart (``/backup/node1/...``,
``/backup/node2/...``: ``node1``, ``node2``).

Every SSTable is one task, except that a Data.db larger than ``target_bytes`` (uncompressed) is split
at partition boundaries (:meth:`SSTable.chunk_ranges`) into tasks of about that size. A task's id is
its Data.db path and start offset: stable across runs, which is what resuming relies on.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..schema import TableMetadata
from ..sstable import DataRange, SSTable, SSTableError, find_sstables
from ..sstable.sstable_descriptor import COMPONENT_NAME
from .bootstrap_errors import BootstrapError

DEFAULT_TASK_BYTES = 64 << 20  # uncompressed Data.db bytes per task: enough work to outweigh a task's start
_GLOB_CHARACTERS = set("*?[")


@dataclass(frozen=True)
class SSTableSlice:
    """One Spark task: the partitions of one SSTable starting in ``[start, end)`` (end None: to its end)."""

    task_id: str
    node_id: str
    path: str  # the SSTable's Data.db
    start: int
    end: int | None
    data_bytes: int  # uncompressed Data.db bytes the task covers

    @property
    def data_range(self) -> DataRange:
        return DataRange(self.start, self.end)


@dataclass(frozen=True)
class Snapshot:
    """One node's SSTables of the table."""

    node_id: str
    path: Path


def plan(sstable_dirs: Sequence[str | Path], table: TableMetadata,
         target_bytes: int = DEFAULT_TASK_BYTES) -> list[SSTableSlice]:
    """The tasks reading every SSTable of ``table`` in ``sstable_dirs`` (see the module's docstring).

    Checks, on the driver, that each SSTable is readable and belongs to ``table`` (its Statistics.db
    header, and the table id its directory names if it names one).
    """
    tasks: list[SSTableSlice] = []
    seen: set[Path] = set()
    for snapshot in resolve_snapshots(sstable_dirs):
        for sstable in _sstables_of(snapshot.path):
            data_path = sstable.data_path.resolve()
            if data_path in seen:
                continue
            seen.add(data_path)
            check_sstable(sstable, table)
            length = sstable.data_length
            ranges = [DataRange(0, None)]
            if length > target_bytes:
                ranges = sstable.chunk_ranges(target_bytes=target_bytes)
            for data_range in ranges:
                end = length if data_range.end is None else data_range.end
                tasks.append(SSTableSlice(f"{data_path}@{data_range.start}", snapshot.node_id, str(data_path),
                                  data_range.start, data_range.end, end - data_range.start))
    return tasks


def resolve_snapshots(items: Iterable[str | Path]) -> list[Snapshot]:
    """``NODE=PATH`` / ``PATH`` / glob values as snapshots, each with its node id."""
    named: list[tuple[str | None, Path]] = []
    for item in items:
        text = str(item)
        node, separator, rest = text.partition("=")
        if separator and node and "/" not in node and not Path(text).exists():
            node_id, text = node, rest
        else:
            node_id = None
        if not Path(text).exists() and _GLOB_CHARACTERS & set(text):
            matches = sorted(glob.glob(text))
            if not matches:
                raise BootstrapError(f"{text}: the pattern matches nothing")
            if node_id is not None and len(matches) > 1:
                raise BootstrapError(f"{item}: a node name for a pattern matching {len(matches)} paths")
            named += [(node_id, Path(m)) for m in matches]
        elif not Path(text).exists():
            raise BootstrapError(f"{text} does not exist")
        else:
            named.append((node_id, Path(text)))
    if not named:
        raise BootstrapError("no SSTable directory given")
    unnamed = [path for node_id, path in named if node_id is None]
    derived = iter(_distinguishing_names(unnamed))
    snapshots = [Snapshot(node_id if node_id is not None else next(derived), path) for node_id, path in named]
    return snapshots


def check_sstable(sstable: SSTable, table: TableMetadata) -> None:
    """Raise BootstrapError unless ``sstable`` can be one of ``table``'s."""
    descriptor = sstable.descriptor
    if descriptor.table_id is not None and descriptor.table_id != table.id:
        if descriptor.table == table.name and descriptor.keyspace == table.keyspace:
            raise BootstrapError(
                f"{sstable.data_path}: its directory names table id {descriptor.table_id}, but "
                f"{table.qualified_name} has id {table.id}: SSTables of an earlier table of that name "
                "(dropped and created again)?")
        raise BootstrapError(f"{sstable.data_path}: an SSTable of {descriptor.keyspace}.{descriptor.table} "
                             f"(id {descriptor.table_id}), not of {table.qualified_name}")
    try:
        sstable.data_header(table)
    except SSTableError as error:
        raise BootstrapError(f"cannot read {sstable.data_path} as an SSTable of {table.qualified_name}: "
                             f"{error.reason}") from None


def _sstables_of(path: Path) -> list[SSTable]:
    try:
        if path.is_file():
            match = COMPONENT_NAME.match(path.name)
            if match is None:
                raise BootstrapError(f"{path} is not an SSTable component file")
            return [SSTable(path)]
        found = find_sstables(path)
    except SSTableError as error:
        raise BootstrapError(str(error)) from None
    if not found:
        hint = ""
        snapshots = path / "snapshots"
        if snapshots.is_dir():
            tags = sorted(p.name for p in snapshots.iterdir() if p.is_dir())
            hint = f" (its snapshots: {', '.join(tags) or 'none'}; give {snapshots}/<tag>)"
        raise BootstrapError(f"{path} holds no SSTable (no *-Data.db file){hint}")
    return found


def _distinguishing_names(paths: list[Path]) -> list[str]:
    """Node ids for unnamed snapshot paths: the first path component in which they differ."""
    if not paths:
        return []
    if len(paths) == 1:
        return ["snapshot"]
    parts = [p.resolve().parts for p in paths]
    for index in range(min(len(p) for p in parts)):
        names = [p[index] for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"snapshot{i}" for i in range(1, len(paths) + 1)]


__all__ = ["DEFAULT_TASK_BYTES", "Snapshot", "SSTableSlice", "check_sstable", "plan", "resolve_snapshots"]
