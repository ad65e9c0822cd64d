"""Raw change records: one per partition update, as the agent publishes them (format version 1).

Documented in ``docs/raw-records.md``; that document and this module change together.

Kafka key: the 16-byte table id followed by the partition key bytes, so every change of one partition
goes to the same Kafka partition. Kafka value::

    offset  size  field
    0       1     format version (1)
    1       1     flags: 0x01 snapshot (written by bootstrap, not by a commit log); 0x02 truncation
    2       1     commit log version the update is serialized for (6, 7 or 8; 0 for a truncation)
    3       1     length N of the node id
    4       16    MD5 of the partition update bytes: the replicas' copies of one write are the same
                  bytes, so consumers can drop copies by digest without decoding them
    20      8     segment id (int64, big-endian)
    28      8     position: logical position just past the entry in the segment (int64)
    36      8     write time: the update's smallest timestamp, in microseconds (int64)
    44      N     node id (UTF-8)
    44+N    ...   the partition update exactly as in the commit log: table id, then the partition

A truncation record (flag 0x02, ``TruncationRecord``) says that its node truncated a table: its Kafka key is
the 16-byte table id alone (no partition key), the segment id and position are the commit log position the
truncation covers, the write time is the truncation time (the node's clock, in milliseconds, times 1000) and
the body after the node id is the table id. The agent sends it to every partition of the raw topic.
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

try:
    # CPython's own MD5: the same digest as OpenSSL's, without its per-call algorithm lookup, on the agent's
    # per-record path.
    from _md5 import md5
except ImportError:  # a Python built without it
    from hashlib import md5

from ..storage.binary_io import DataInput
from ..storage.partition_update import PartitionUpdate, PartitionUpdateSerializer, peek_min_timestamp_after_key
from ..storage.vint import read_unsigned_vint
from ..schema import Schema

FORMAT_VERSION = 1
FLAG_SNAPSHOT = 0x01
FLAG_TRUNCATION = 0x02
FLAGS_OFFSET = 1
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
        flags, cl_version, node_id, segment_id, position, write_time, update = _decode_value(value)
        if flags & FLAG_TRUNCATION:
            raise RawRecordError("a truncation record, not a partition update")
        return RawRecord(node_id, segment_id, position, cl_version, write_time, update,
                         bool(flags & FLAG_SNAPSHOT))


class TruncationRecord(NamedTuple):
    """A node's truncation of a table (``TRUNCATE``): everything of the table its node held up to
    ``truncated_at_ms`` is gone, and its commit log holds no mutation saying so."""

    node_id: str
    table_id: bytes  # 16 bytes
    segment_id: int  # the commit log position the truncation covers
    position: int
    truncated_at_ms: int  # the node's clock

    def key(self) -> bytes:
        """The Kafka key: the table id without a partition key, which no update's key is."""
        return self.table_id

    def encode(self) -> bytes:
        node_id = self.node_id.encode("utf-8")
        if len(node_id) > 255:
            raise RawRecordError(f"node id {node_id!r} is longer than 255 bytes")
        header = _HEADER.pack(FORMAT_VERSION, FLAG_TRUNCATION, 0, len(node_id), md5(self.table_id).digest(),
                              self.segment_id, self.position, self.truncated_at_ms * 1000)
        return header + node_id + self.table_id

    @staticmethod
    def decode(value: bytes) -> "TruncationRecord":
        flags, _, node_id, segment_id, position, write_time, body = _decode_value(value)
        if not flags & FLAG_TRUNCATION:
            raise RawRecordError("a partition update, not a truncation record")
        if len(body) != 16:
            raise RawRecordError(f"a truncation record's body is {len(body)} bytes, not a 16-byte table id")
        return TruncationRecord(node_id, body, segment_id, position, write_time // 1000)


def is_truncation(value: bytes) -> bool:
    """Whether a raw record's value is a truncation record (by its flags alone: the per-record test)."""
    return len(value) > FLAGS_OFFSET and bool(value[FLAGS_OFFSET] & FLAG_TRUNCATION)


def segment_and_position(value: bytes) -> tuple[str, int]:
    """The commit log segment file a raw record was read from and the position in it, from its header alone
    (for messages naming a record)."""
    _, _, cl_version, _, _, segment_id, position, _ = _HEADER.unpack_from(value)
    return f"CommitLog-{cl_version}-{segment_id}.log", position


def _decode_value(value: bytes) -> tuple[int, int, str, int, int, int, bytes]:
    """A raw record's flags, commit log version, node id, segment id, position, write time and body, its
    version and digest checked."""
    if len(value) < HEADER_SIZE + 17:
        raise RawRecordError(f"raw record of {len(value)} bytes is too short")
    version, flags, cl_version, node_length, digest, segment_id, position, write_time = _HEADER.unpack_from(
        value)
    if version != FORMAT_VERSION:
        raise RawRecordError(f"raw record format version {version} is not supported "
                             f"(expected {FORMAT_VERSION})")
    node_end = HEADER_SIZE + node_length
    body = bytes(value[node_end:])
    if md5(body).digest() != digest:
        raise RawRecordError("raw record digest does not match its partition update bytes")
    node_id = value[HEADER_SIZE:node_end].decode("utf-8")
    return flags, cl_version, node_id, segment_id, position, write_time, body


def stored_digest(value: bytes) -> bytes:
    """The digest a raw record's header holds: once ``RawRecord.decode`` has checked it against the update, the
    update's identity, without computing MD5 again."""
    return value[DIGEST_OFFSET:DIGEST_OFFSET + DIGEST_SIZE]


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
