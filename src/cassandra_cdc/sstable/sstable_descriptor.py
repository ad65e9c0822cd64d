"""SSTable file names, versions and what each version changes (``Descriptor``, ``BigFormat``/``BtiFormat``).

A component file is named ``<version>-<generation>-<format>-<Component>``, e.g. ``nb-1-big-Data.db`` or, with
5.0's UUID-based generation ids, ``oa-3gfz_0x8h_1vhm82g1h8nfkpc7nl-big-Data.db``. The directories around it
name the table: ``<data dir>/<keyspace>/<table>-<table id>/`` (and ``.../snapshots/<tag>/``, ``.../backups/``).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from .sstable_errors import UnsupportedSSTableError

COMPONENT_NAME = re.compile(r"^([a-z]{2})-([0-9a-z_]+)-(big|bti)-([A-Za-z0-9_.+-]+)$")
# Names of Cassandra before 2.2 ("la"): <keyspace>-<table>-<version>-<generation>-<component>.
LEGACY_NAME = re.compile(r"^(?:.+-)?([a-k][a-z])-(\d+)-(Data\.db|Statistics\.db)$")
TABLE_DIRECTORY = re.compile(r"^(.+)-([0-9a-f]{32})$")

# "big" versions since 3.0 (BigFormat.BigVersion): ma 3.0.0, mb 3.0.7/3.7, mc 3.0.8/3.9, md 3.0.18/3.11.4,
# me 3.0.25/3.11.11, na 4.0-rc1, nb 4.0.0, nc and oa 5.0; "bti" (BtiFormat): da 5.0.
BIG_VERSIONS = ("ma", "mb", "mc", "md", "me", "na", "nb", "nc", "oa")
BTI_VERSIONS = ("da",)


@dataclass(frozen=True)
class Version:
    """An SSTable format version and the features it has, as ``BigVersion``/``BtiVersion`` name them."""

    name: str
    format: str = "big"

    def __post_init__(self) -> None:
        known = BIG_VERSIONS if self.format == "big" else BTI_VERSIONS if self.format == "bti" else ()
        if self.name not in known:
            raise UnsupportedSSTableError(
                f"SSTable version {self.name!r} of format {self.format!r} is not supported "
                f"(big: {', '.join(BIG_VERSIONS)}; bti: {', '.join(BTI_VERSIONS)})")

    @property
    def has_uint_deletion_time(self) -> bool:
        """5.0 ``oa``/``da``: local deletion times are unsigned, a partition deletion is 1 or 12 bytes."""
        return self.format == "bti" or self.name >= "oa"

    @property
    def has_max_compressed_length(self) -> bool:
        """4.0+: CompressionInfo.db records maxCompressedLength; chunks at least that long are stored raw."""
        return self.format == "bti" or self.name >= "na"

    @property
    def has_metadata_checksum(self) -> bool:
        """4.0+: Statistics.db carries a CRC32 after its table of contents and after each component."""
        return self.format == "bti" or self.name >= "na"

    @property
    def header_version(self) -> int:
        """The commit log/messaging version whose delta coding of deletion times the rows use."""
        return 8 if self.has_uint_deletion_time else 7

    def __str__(self) -> str:
        return f"{self.name} ({self.format})"


@dataclass(frozen=True)
class Descriptor:
    """One SSTable: its directory, version, generation and format, and the table its directory names."""

    directory: Path
    version: Version
    generation: str
    keyspace: str | None = None
    table: str | None = None
    table_id: uuid.UUID | None = None

    @property
    def prefix(self) -> str:
        return f"{self.version.name}-{self.generation}-{self.version.format}"

    def path(self, component: str) -> Path:
        """The file of a component, e.g. ``path("Data.db")``."""
        return self.directory / f"{self.prefix}-{component}"

    @staticmethod
    def from_path(path: str | Path) -> "Descriptor":
        """The SSTable a component file belongs to (the file need not exist)."""
        path = Path(path)
        match = COMPONENT_NAME.match(path.name)
        if match is None:
            legacy = LEGACY_NAME.match(path.name)
            if legacy:
                raise UnsupportedSSTableError(f"SSTable version {legacy.group(1)!r} (Cassandra before 3.0) is "
                                              "not supported; upgrade it with nodetool upgradesstables", path)
            raise UnsupportedSSTableError("not an SSTable component name "
                                          "(<version>-<generation>-<big|bti>-<Component>)", path)
        version_name, generation, fmt, _ = match.groups()
        keyspace, table, table_id = table_of_directory(path.parent)
        return Descriptor(path.parent, Version(version_name, fmt), generation, keyspace, table, table_id)


def table_of_directory(directory: Path) -> tuple[str | None, str | None, uuid.UUID | None]:
    """Keyspace, table and table id named by an SSTable's directory (``<ks>/<table>-<id>/``, snapshots and
    backups included); the id is None for directories without one (such as those of ``sstableloader``)."""
    parts = directory.absolute().parts
    if len(parts) >= 3 and parts[-2] == "snapshots":
        parts = parts[:-2]
    elif len(parts) >= 2 and parts[-1] == "backups":
        parts = parts[:-1]
    if len(parts) < 3:
        return None, None, None
    table_dir, keyspace = parts[-1], parts[-2]
    match = TABLE_DIRECTORY.match(table_dir)
    if match:
        return keyspace, match.group(1), uuid.UUID(match.group(2))
    return keyspace, table_dir, None


def is_data_file(path: Path) -> bool:
    match = COMPONENT_NAME.match(path.name)
    return match is not None and match.group(4) == "Data.db"
