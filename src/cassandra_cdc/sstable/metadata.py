"""``Statistics.db``: the SSTable's metadata components (``MetadataSerializer``).

Layout: ``int32 count``, then ``count`` entries ``int32 MetadataType ordinal, int32 offset`` (the table of
contents), then the components at their offsets. From 4.0 (``na``) a CRC32 follows the count (of its 4
bytes), the table of contents (of count and entries together) and each component (of its bytes).

Components: VALIDATION (partitioner, bloom filter false-positive chance), COMPACTION (cardinality estimate),
STATS (histograms, commit log position, min/max timestamps, ...) and HEADER, the ``SerializationHeader``
every row of Data.db is written with: its ``EncodingStats``, the partition key type, the clustering types
and the static and regular columns with their types, all types as Java class names.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

from ..storage.serialization_header import EncodingStats
from ..storage.binary_io import DataInput, DataOutput
from .sstable_descriptor import Version
from .sstable_errors import ChecksumError, SSTableError


_T = TypeVar("_T")
_CRC = struct.Struct(">I")


class MetadataType(enum.IntEnum):
    VALIDATION = 0
    COMPACTION = 1
    STATS = 2
    HEADER = 3


@dataclass(frozen=True)
class HeaderComponent:
    """The ``SerializationHeader.Component`` of Statistics.db: how Data.db was written.

    Column names are the stored name bytes; types are Java class names (see
    :func:`~cassandra_cdc.schema.types.type_from_class_name`). Columns are in the order stored, which need not
    be the order rows are encoded in (see :func:`~cassandra_cdc.sstable.table.serialization_header`).
    """

    stats: EncodingStats
    key_type: str
    clustering_types: tuple[str, ...]
    static_columns: dict[bytes, str] = field(default_factory=dict)
    regular_columns: dict[bytes, str] = field(default_factory=dict)

    @staticmethod
    def deserialize(inp: DataInput) -> "HeaderComponent":
        stats = EncodingStats.deserialize(inp)
        key_type = _read_type(inp)
        clustering = tuple(_read_type(inp) for _ in range(inp.uvint()))
        statics = {inp.bytes_vint(): _read_type(inp) for _ in range(inp.uvint())}
        regulars = {inp.bytes_vint(): _read_type(inp) for _ in range(inp.uvint())}
        return HeaderComponent(stats, key_type, clustering, statics, regulars)


    def serialize(self, out: DataOutput) -> None:
        self.stats.serialize(out)
        out.bytes_vint(self.key_type.encode("utf-8"))
        out.uvint(len(self.clustering_types))
        for class_name in self.clustering_types:
            out.bytes_vint(class_name.encode("utf-8"))
        for columns in (self.static_columns, self.regular_columns):
            out.uvint(len(columns))
            for name, class_name in columns.items():
                out.bytes_vint(name)
                out.bytes_vint(class_name.encode("utf-8"))


def _read_type(inp: DataInput) -> str:
    return inp.bytes_vint().decode("utf-8")


@dataclass(frozen=True)
class ValidationMetadata:
    partitioner: str
    bloom_filter_fp_chance: float

    @staticmethod
    def deserialize(inp: DataInput) -> "ValidationMetadata":
        partitioner = inp.raw(inp.uint16()).decode("utf-8")  # writeUTF: ASCII class names
        (fp_chance,) = struct.unpack(">d", inp.raw(8))
        return ValidationMetadata(partitioner, fp_chance)


@dataclass(frozen=True)
class StatsMetadata:
    """The start of ``StatsMetadata``, the same in every version since 3.0: what a reader uses of it."""

    min_timestamp: int
    max_timestamp: int
    commit_log_upper_bound: tuple[int, int]  # (segment id, position) of the last write flushed into it

    @staticmethod
    def deserialize(inp: DataInput) -> "StatsMetadata":
        for _ in range(2):  # estimated partition sizes and cell counts: int32 n, n x (int64 offset, int64 count)
            inp.raw(16 * inp.int32())
        segment, position = inp.int64(), inp.int32()
        return StatsMetadata(inp.int64(), inp.int64(), (segment, position))


@dataclass(frozen=True)
class SSTableMetadata:
    validation: ValidationMetadata | None
    stats: StatsMetadata | None
    header: HeaderComponent

    @property
    def partitioner(self) -> str | None:
        return self.validation.partitioner if self.validation else None


def read_metadata(path: Path, version: Version) -> SSTableMetadata:
    """Read Statistics.db, checking its CRCs (4.0+); the HEADER component is required."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SSTableError(f"cannot read: {error.strerror or error}", path) from None
    checksummed = version.has_metadata_checksum
    inp = DataInput(data)
    try:
        count = inp.int32()
        if checksummed:
            _check_crc(path, data[:4], inp.int32(), "table of contents count", 0)
        toc_start = inp.pos
        toc = [(inp.int32(), inp.int32()) for _ in range(count)]
        if checksummed:  # one CRC runs over the count and the entries (not over the count's own CRC)
            _check_crc(path, data[:4] + data[toc_start:inp.pos], inp.int32(), "table of contents", toc_start)
    except ValueError as error:
        raise SSTableError(f"truncated table of contents: {error}", path) from None
    bounds = sorted(offset for _, offset in toc) + [len(data)]
    components: dict[int, DataInput] = {}
    for ordinal, offset in toc:
        end = bounds[bounds.index(offset) + 1]
        if not 0 <= offset <= end <= len(data):
            raise SSTableError(f"metadata component {ordinal} has offset {offset} outside the file", path)
        if checksummed:
            end -= 4
            stored = struct.unpack_from(">i", data, end)[0] & 0xFFFFFFFF
            _check_crc(path, data[offset:end], stored, f"metadata component {_type_name(ordinal)}", offset)
        components[ordinal] = DataInput(data, offset, end)
    if MetadataType.HEADER not in components:
        raise SSTableError("no serialization header (HEADER component) in Statistics.db", path)
    return SSTableMetadata(
        _component(path, components, MetadataType.VALIDATION, ValidationMetadata.deserialize, required=False),
        _component(path, components, MetadataType.STATS, StatsMetadata.deserialize, required=False),
        _component(path, components, MetadataType.HEADER, HeaderComponent.deserialize, required=True),
    )


def serialize_metadata(header: HeaderComponent, version: Version) -> bytes:
    """A Statistics.db holding the serialization header alone (all that reading Data.db needs), with the
    CRCs of 4.0+."""
    component = DataOutput()
    header.serialize(component)
    checksummed = version.has_metadata_checksum
    out = DataOutput()
    out.int32(1)
    if checksummed:
        out += _CRC.pack(zlib.crc32(out))
    toc_start = len(out)
    out.int32(MetadataType.HEADER)
    out.int32(toc_start + 8 + (4 if checksummed else 0))
    if checksummed:
        out += _CRC.pack(zlib.crc32(out[toc_start:], zlib.crc32(out[:4])))
    out += component
    if checksummed:
        out += _CRC.pack(zlib.crc32(component))
    return bytes(out)


def _component(path: Path, components: dict[int, DataInput], kind: MetadataType,
               read: Callable[[DataInput], _T], required: bool) -> _T | None:
    inp = components.get(kind)
    if inp is None:
        return None
    start = inp.pos
    try:
        return read(inp)
    except (ValueError, IndexError, struct.error) as error:
        if required:
            raise SSTableError(f"unreadable {kind.name} metadata component: {error}", path, start) from None
        return None


def _check_crc(path: Path, data: bytes, stored: int, what: str, start: int) -> None:
    stored &= 0xFFFFFFFF
    computed = zlib.crc32(data)
    if computed != stored:
        raise ChecksumError(f"checksum mismatch in {what} (stored {stored:#010x}, computed {computed:#010x})",
                            path, start)


def _type_name(ordinal: int) -> str:
    try:
        return MetadataType(ordinal).name
    except ValueError:
        return str(ordinal)
