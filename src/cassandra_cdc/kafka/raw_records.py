"""Raw change records: one per partition update, as the agent publishes them (format version 1).

Documented in ``docs/raw-records.md``; that document and this module change together.

Kafka key: the 16-byte table id followed by the partition key bytes, so every change of one partition
goes to the same Kafka partition. Kafka value::

    offset  size  field
    0       1     format version (1)
    1       1     flags: 0x01 snapshot (written by bootstrap, not by a commit log)
    2       1     commit log version the update is serialized for (6, 7 or 8)
    3       1     length N of the node id
    4       16    MD5 of the partition update bytes: the replicas' copies of one write are the same
                  bytes, so consumers can drop copies by digest without decoding them
    20      8     segment id (int64, big-endian)
    28      8     position: logical position just past the entry in the segment (int64)
    36      8     write time: the update's smallest timestamp, in microseconds (int64)
    44      N     node id (UTF-8)
    44+N    ...   the partition update exactly as in the commit log: table id, then the partition
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

try:
    # CPython's own MD5: the same digest as OpenSSL's, without its per-call algorithm lookup (0.13 µs of the
    # agent's ~7 µs per record).
    from _md5 import md5
except ImportError:  # a Python built without it
    from hashlib import md5

from ..storage.binary_io import DataInput
from ..storage.partition_update import PartitionUpdate, PartitionUpdateSerializer, peek_min_timestamp_after_key
from ..storage.vint import read_unsigned_vint
from ..schema import Schema

FORMAT_VERSION = 1
FLAG_SNAPSHOT = 0x01
DIGEST_OFFSET = 4
DIGEST_SIZE = 16
_HEADER = struct.Struct(">BBBB16sqqq")
HEADER_SIZE = _HEADER.size  # 44, then the node id


class RawRecordError(ValueError):
    """A raw record whose value does not follow the format."""


class RawRecord(NamedTuple):
    """A decoded raw record (a named tuple: the pipeline decodes one per record, a frozen dataclass costs
    four times as much to make)."""

    node_id: str
    segment_id: int
    position: int
    commitlog_version: int
    write_time: int
    update: bytes  # the serialized partition update: table id, then the partition
    snapshot: bool = False

    @property
    def table_id(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.update[:16])

    @property
    def digest(self) -> bytes:
        return md5(self.update).digest()

    def encode(self) -> bytes:
        return encode_raw_record(self.node_id.encode("utf-8"), self.segment_id, self.position, self.commitlog_version,
                                 self.write_time, self.update, self.snapshot)

    @staticmethod
    def decode(value: bytes) -> "RawRecord":
        if len(value) < HEADER_SIZE + 17:
            raise RawRecordError(f"raw record of {len(value)} bytes is too short")
        version, flags, cl_version, node_length, digest, segment_id, position, write_time = _HEADER.unpack_from(value)
        if version != FORMAT_VERSION:
            raise RawRecordError(f"raw record format version {version} is not supported (expected {FORMAT_VERSION})")
        node_end = HEADER_SIZE + node_length
        update = bytes(value[node_end:])
        if md5(update).digest() != digest:
            raise RawRecordError("raw record digest does not match its partition update bytes")
        return RawRecord(value[HEADER_SIZE:node_end].decode("utf-8"), segment_id, position, cl_version, write_time,
                         update, bool(flags & FLAG_SNAPSHOT))


def decode_update(record_key: bytes, record: RawRecord, schema: Schema) -> PartitionUpdate:
    """The record's partition update, decoded strictly: damaged bytes under a valid header are refused.

    ``RawRecord.decode`` checked the digest: these are the bytes the agent sent. On top of what the
    decoder checks as it reads (flags, row count, column lists of the table's columns), the update must
    end where the bytes end, its partition key must be one of the table's, and the Kafka key must name
    its partition (the consumer keeps state per Kafka key). Raises ``MutationDecodeError``,
    ``RawRecordError`` or another ``ValueError`` (``EndOfData``) when one does not hold.
    """
    data = DataInput(record.update)
    update = PartitionUpdateSerializer.deserialize(data, schema, record.commitlog_version)
    if data.pos != data.end:
        raise RawRecordError(f"{data.end - data.pos} bytes follow the partition update")
    table, key = update.table, update.key
    values = table.split_partition_key(key)
    for column, value in zip(table.partition_key, values):
        fixed = column.type.fixed_length
        if fixed is not None and len(value) != fixed:
            raise RawRecordError(f"partition key {key.hex()} is no key of {table.qualified_name}: "
                                 f"{column.name} is {len(value)} bytes, not {fixed}")
    if not key:
        raise RawRecordError(f"empty partition key in an update of {table.qualified_name}")
    if record_key[16:] != key or record_key[:16] != record.update[:16]:
        raise RawRecordError(f"the Kafka key {record_key.hex()} does not name the partition of the update")
    return update


def encode_raw_record(node_id: bytes, segment_id: int, position: int, commitlog_version: int, write_time: int,
                      update: bytes, snapshot: bool = False) -> bytes:
    """The value of ``RawRecord(...).encode()``, without building the record: the agent's per-record path."""
    if len(node_id) > 255:
        raise RawRecordError(f"node id {node_id!r} is longer than 255 bytes")
    header = _HEADER.pack(FORMAT_VERSION, FLAG_SNAPSHOT if snapshot else 0, commitlog_version, len(node_id),
                          md5(update).digest(), segment_id, position, write_time)
    return header + node_id + update


def record_key(update: bytes) -> bytes:
    """Kafka key of a partition update: its table id and partition key bytes."""
    size, start = read_unsigned_vint(update, 16)
    return update[:16] + update[start:start + size]


def encode_update(node_id: bytes, segment_id: int, position: int, commitlog_version: int,
                  update: bytes) -> tuple[bytes, bytes]:
    """Kafka key and value of a partition update read from a commit log: ``record_key(update)``, and the raw
    record with the update's smallest timestamp as its write time (0 for an empty update).

    The agent's per-record path: the partition key's length is read once for both.
    """
    size, start = read_unsigned_vint(update, 16)
    end = start + size
    value = encode_raw_record(node_id, segment_id, position, commitlog_version,
                              peek_min_timestamp_after_key(update, end) or 0, update)
    return update[:16] + update[start:end], value
