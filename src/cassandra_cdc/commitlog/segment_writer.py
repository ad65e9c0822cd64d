"""Writing segments the way a Cassandra node does: plain (mmap), compressed or encrypted, with CDC index.

Layout as ``CommitLogSegment`` allocates it: the header, then sync sections. Each section starts with
a sync marker that is reserved when the section opens and filled in when it is synced; entries are
appended in between. A plain segment is a pre-sized file whose entries reach it as soon as they are
added (like writes to Cassandra's mapped buffer) while its markers only appear at sync. Compressed and
encrypted segments grow by one section per sync. ``_cdc.idx`` gets the synced (logical) position, and
``COMPLETED`` when the segment is closed.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from ..storage.codecs import Compressor, EncryptionKey, compressor_for, encrypt_block
from .segment_descriptor import Descriptor, cdc_index_file_name
from .segment_reader import ENTRY_OVERHEAD_SIZE, SYNC_MARKER_SIZE

DEFAULT_SEGMENT_SIZE = 32 * 1024 * 1024
DEFAULT_ENCRYPTION_CHUNK = 64 * 1024
DEFAULT_CIPHER = "AES/CBC/PKCS5Padding"


class SegmentFull(Exception):
    """The entry does not fit in what is left of the segment: close it and start the next one."""


def sync_marker(segment_id: int, marker_offset: int, next_marker: int) -> bytes:
    """The 8 bytes at ``marker_offset``: the next marker's offset and a CRC of (id, own offset)."""
    crc = zlib.crc32(struct.pack(">IIi", segment_id & 0xFFFFFFFF, (segment_id >> 32) & 0xFFFFFFFF, marker_offset))
    return struct.pack(">iI", next_marker, crc)


def entry_bytes(mutation: bytes) -> bytes:
    """A framed entry: size, CRC of the size, the mutation, CRC of size and mutation."""
    size = struct.pack(">i", len(mutation))
    size_crc = zlib.crc32(size)
    return size + struct.pack(">I", size_crc) + mutation + struct.pack(">I", zlib.crc32(mutation, size_crc))


def write_cdc_index(path: str | Path, offset: int, completed: bool) -> None:
    """Rewrite a ``_cdc.idx`` file in place (truncate + write, not atomic, as Cassandra does)."""
    with open(path, "w", encoding="ascii") as index:
        index.write(str(offset) + ("\nCOMPLETED" if completed else ""))


class SegmentWriter:
    """Appends mutations to one segment file.

    ``compression``: a compressor class name (``LZ4Compressor``, ``SnappyCompressor``,
    ``DeflateCompressor``, ``ZstdCompressor``, ``NoopCompressor``). ``encryption``: (key alias, key) plus
    ``iv``; encryption wins over compression, as in Cassandra. ``cdc_index_directory``: where
    ``_cdc.idx`` is written at every sync (Cassandra 4.0+ ``cdc_raw``); None writes no index.
    """

    def __init__(self, directory: str | Path, segment_id: int, version: int = 7, *,
                 segment_size: int = DEFAULT_SEGMENT_SIZE, compression: str | None = None,
                 encryption: tuple[str, bytes] | None = None, iv: bytes | None = None,
                 encryption_chunk_size: int = DEFAULT_ENCRYPTION_CHUNK,
                 cdc_index_directory: str | Path | None = None) -> None:
        params: dict[str, object] = {}
        self._compressor: Compressor | None = None
        self._key: EncryptionKey | None = None
        if encryption is not None:
            alias, key = encryption
            iv = iv if iv is not None else os.urandom(16)
            self._key = EncryptionKey(key, iv, DEFAULT_CIPHER)
            params.update(encCipher=DEFAULT_CIPHER, encIV=iv.hex(), encKeyAlias=alias)
        elif compression is not None:
            self._compressor = compressor_for(compression)
            params.update(compressionClass=compression, compressionParameters={})
        self.descriptor = Descriptor.create(version, segment_id, params)
        self.path = Path(directory) / self.descriptor.file_name
        self.cdc_index_path = (Path(cdc_index_directory) / cdc_index_file_name(version, segment_id)
                               if cdc_index_directory is not None else None)
        self.segment_size = segment_size
        self.encryption_chunk_size = encryption_chunk_size
        header = self.descriptor.serialize()
        # Logical (buffer) positions, as Cassandra counts them.
        self._section_start = len(header)  # where the open section's marker is reserved
        self._position = len(header) + SYNC_MARKER_SIZE  # end of the data added so far
        self.synced_position = len(header)
        self.closed = False
        self._pending: list[bytes] = []  # entries of the open section (compressed/encrypted)
        self._file = open(self.path, "w+b")
        self._file.write(header)
        if self._plain:
            self._file.truncate(segment_size)
        self._file_position = len(header)  # where the next section goes in a growing file

    @property
    def _plain(self) -> bool:
        return self._compressor is None and self._key is None

    @property
    def position(self) -> int:
        """Logical position just past the last entry added."""
        return self._position

    def fits(self, mutation_size: int) -> bool:
        return self._position + ENTRY_OVERHEAD_SIZE + mutation_size <= self.segment_size

    def add(self, mutation: bytes) -> int:
        """Append one serialized mutation; return its position (just past the entry)."""
        if self.closed:
            raise SegmentFull(f"{self.path} is closed")
        if not self.fits(len(mutation)):
            raise SegmentFull(f"{len(mutation)}-byte mutation does not fit in {self.path}")
        entry = entry_bytes(mutation)
        if self._plain:
            self._file.seek(self._position)
            self._file.write(entry)
        else:
            self._pending.append(entry)
        self._position += len(entry)
        return self._position

    def sync(self) -> int:
        """Make everything added durable as one section; return the synced logical position."""
        if self.closed:
            return self.synced_position
        if self._position == self._section_start + SYNC_MARKER_SIZE and self.synced_position == self._section_start:
            return self.synced_position  # nothing new since the last sync
        if self._position + SYNC_MARKER_SIZE > self.segment_size:
            return self.close()
        self._write_section(self._position)
        # The next section's marker is reserved right after this section's data.
        self._section_start = self._position
        self._position += SYNC_MARKER_SIZE
        self._write_cdc_index(self.synced_position, completed=False)
        return self.synced_position

    def close(self) -> int:
        """Close the segment: the last section ends at the end of the data; the idx says COMPLETED."""
        if not self.closed:
            self._write_section(self._position)
            self.closed = True
            self._file.close()
            self._write_cdc_index(self.synced_position, completed=True)
        return self.synced_position

    def _write_section(self, section_end: int) -> None:
        start = self._section_start
        if self._plain:
            self._file.seek(start)
            # The pre-sized file is still zero after the data: the chain of markers ends there.
            self._file.write(sync_marker(self.descriptor.segment_id, start, section_end))
        else:
            self._write_encoded_section(b"".join(self._pending))
            self._pending.clear()
        self._file.flush()
        os.fsync(self._file.fileno())
        self.synced_position = section_end

    def _write_encoded_section(self, plain: bytes) -> None:
        if self._key is not None:
            chunk = self.encryption_chunk_size
            body = b"".join(encrypt_block(self._key, plain[i:i + chunk]) for i in range(0, len(plain), chunk))
        else:
            body = self._compressor.compress(plain)  # type: ignore[union-attr]
        marker_offset = self._file_position
        next_marker = marker_offset + SYNC_MARKER_SIZE + 4 + len(body)
        self._file.seek(marker_offset)
        self._file.write(sync_marker(self.descriptor.segment_id, marker_offset, next_marker)
                         + struct.pack(">i", len(plain)) + body)
        self._file_position = next_marker

    def _write_cdc_index(self, offset: int, completed: bool) -> None:
        if self.cdc_index_path is not None:
            write_cdc_index(self.cdc_index_path, offset, completed)

    def __enter__(self) -> "SegmentWriter":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
