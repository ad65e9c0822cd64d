"""Where partitions start in Data.db, from the primary index: Index.db (big) or Partitions.db/Rows.db (bti).

Index.db (``RowIndexEntry``): per partition, in Data.db order, ``uint16`` key length, key, ``uvint`` position
in Data.db, ``uvint`` size of the promoted (row) index and that many bytes.

Partitions.db (``PartitionIndex``, a trie of unique key prefixes, see BtiFormat.md): the file ends with
``int64`` position of the first/last keys, ``int64`` key count, ``int64`` root node position. Each node
starts with a byte of 4 type bits and 4 payload bits; children are stored before their parents, as
distances back from the parent. A payload (payload bits >= 8: a hash byte, then a ``bits - 7``-byte signed
integer; fewer: a ``bits``-byte one) is ``~position`` in Data.db when negative, else the position of the
partition's entry in Rows.db, which starts with the key (``uint16`` length) and its ``uvint`` Data.db
position. Walking the trie in order lists the partitions in Data.db order.
"""

from __future__ import annotations

import mmap
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..storage.binary_io import DataInput
from .sstable_errors import SSTableError

_LONG = struct.Struct(">q")

# TrieNode.Types: ordinal -> (kind, bytes per pointer; 0 = 12 bits or 4 bits)
PAYLOAD_ONLY, SINGLE, SPARSE, DENSE = range(4)
_NODE_TYPES = {
    0: (PAYLOAD_ONLY, 0), 1: (SINGLE, -4), 2: (SINGLE, 1), 3: (SINGLE, -12), 4: (SINGLE, 2),
    5: (SPARSE, 1), 6: (SPARSE, -12), 7: (SPARSE, 2), 8: (SPARSE, 3), 9: (SPARSE, 5),
    10: (DENSE, -12), 11: (DENSE, 2), 12: (DENSE, 3), 13: (DENSE, 4), 14: (DENSE, 5), 15: (DENSE, 8),
}


@contextmanager
def _mapped(path: Path) -> Iterator[bytes | mmap.mmap]:
    try:
        file = path.open("rb")
    except OSError as error:
        raise SSTableError(f"cannot read: {error.strerror or error}", path) from None
    with file:
        if file.seek(0, 2) == 0:
            yield b""
            return
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            yield mapped


def big_index_entries(path: Path) -> Iterator[tuple[bytes, int]]:
    """(key, Data.db position) of each partition, from Index.db."""
    with _mapped(path) as buf:
        inp = DataInput(buf)
        while inp.remaining:
            start = inp.pos
            try:
                key = inp.raw(inp.uint16())
                position = inp.uvint()
                promoted_index_size = inp.uvint()
                inp.pos += promoted_index_size
            except (ValueError, IndexError) as error:
                raise SSTableError(f"unreadable index entry: {error}", path, start) from None
            if inp.pos > inp.end:
                raise SSTableError("index entry runs past the end of the file", path, start)
            yield key, position


def bti_index_entries(partitions_path: Path, rows_path: Path) -> Iterator[tuple[bytes | None, int]]:
    """(key or None, Data.db position) of each partition, walking Partitions.db in order.

    The key is read from Rows.db for partitions with a row index, None for the others (their key is only
    in Data.db).
    """
    with _mapped(partitions_path) as buf, _rows(rows_path) as rows:
        if len(buf) < 24:
            raise SSTableError(f"Partitions.db of {len(buf)} bytes has no footer", partitions_path)
        count = _LONG.unpack_from(buf, len(buf) - 16)[0]
        root = _LONG.unpack_from(buf, len(buf) - 8)[0]
        if count == 0:
            return
        found = 0
        for payload in _trie_payloads(buf, root, partitions_path):
            found += 1
            if payload < 0:
                yield None, ~payload
                continue
            if rows is None:
                raise SSTableError("Partitions.db points into Rows.db, which is missing", partitions_path)
            try:
                entry = DataInput(rows, payload)
                key = entry.raw(entry.uint16())
                yield key, entry.uvint()
            except (ValueError, IndexError) as error:
                raise SSTableError(f"unreadable row index entry: {error}", rows_path, payload) from None
        if found != count:
            raise SSTableError(f"the trie holds {found} partitions, the footer says {count}", partitions_path)


@contextmanager
def _rows(path: Path) -> Iterator[bytes | mmap.mmap | None]:
    if not path.exists():
        yield None
        return
    with _mapped(path) as buf:
        yield buf


def _trie_payloads(buf: bytes | mmap.mmap, root: int, path: Path) -> Iterator[int]:
    """The payloads of an on-disk trie (``TrieNode``), in key order."""
    stack = [root]
    while stack:
        node = stack.pop()
        if not 0 <= node < len(buf):
            raise SSTableError(f"trie node position {node} is outside the file", path)
        try:
            payload, children = _read_node(buf, node)
        except (IndexError, struct.error) as error:
            raise SSTableError(f"unreadable trie node: {error}", path, node) from None
        if payload is not None:
            yield payload
        stack.extend(reversed(children))


def _read_node(buf: bytes | mmap.mmap, node: int) -> tuple[int | None, list[int]]:
    """A node's payload (None if it has none) and the positions of its children in transition order."""
    head = buf[node]
    kind, width = _NODE_TYPES[head >> 4]
    payload_bits = head & 0x0F
    if kind == PAYLOAD_ONLY:
        return _payload(buf, node + 1, payload_bits), []
    if kind == SINGLE:
        if width == -4:
            return None, [node - payload_bits]
        if width == -12:
            return None, [node - (((head & 0x0F) << 8) | buf[node + 1])]
        delta = int.from_bytes(buf[node + 2:node + 2 + width], "big")
        return _payload(buf, node + 2 + width, payload_bits), [node - delta]
    if kind == SPARSE:
        count = buf[node + 1]
        pointers = node + 2 + count
        if width == -12:
            deltas = [_read12(buf, pointers, i) for i in range(count)]
            end = node + 2 + (5 * count + 1) // 2
        else:
            deltas = [int.from_bytes(buf[pointers + i * width:pointers + (i + 1) * width], "big") for i in range(count)]
            end = pointers + width * count
        return _payload(buf, end, payload_bits), [node - d for d in deltas]
    length = buf[node + 2] + 1  # DENSE: first transition byte, length - 1, then pointers (0: no child)
    pointers = node + 3
    if width == -12:
        deltas = [_read12(buf, pointers, i) for i in range(length)]
        end = pointers + (3 * length + 1) // 2
    else:
        deltas = [int.from_bytes(buf[pointers + i * width:pointers + (i + 1) * width], "big") for i in range(length)]
        end = pointers + width * length
    return _payload(buf, end, payload_bits), [node - d for d in deltas if d]


def _read12(buf: bytes | mmap.mmap, base: int, index: int) -> int:
    at = base + (3 * index) // 2
    word = (buf[at] << 8) | buf[at + 1]
    return (word >> 4 if index % 2 == 0 else word) & 0xFFF


def _payload(buf: bytes | mmap.mmap, at: int, bits: int) -> int | None:
    """Partition index payload: an optional hash byte, then a sign-extended position of ``bits & 7`` bytes."""
    if bits == 0:
        return None
    if bits >= 8:
        at, size = at + 1, bits - 7
    else:
        size = bits
    return int.from_bytes(buf[at:at + size], "big", signed=True)
