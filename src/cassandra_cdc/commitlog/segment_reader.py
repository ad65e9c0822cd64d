"""Reading a segment: sync sections, entry framing and damage, as ``CommitLogReader`` applies them.

docs/storage-format.md §4-§6. A segment is streamed: an uncompressed one through ``mmap``, a
compressed or encrypted one a section at a time, so memory stays bounded by the largest section.
"""

from __future__ import annotations

import enum
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..storage.codecs import ENCRYPTED_BLOCK_HEADER, EncryptionKey, compressor_for, decrypt_block
from .segment_descriptor import Descriptor, parse_segment_name
from .segment_errors import CommitLogError
from .keystore import KeyStore

SYNC_MARKER_SIZE = 8
ENTRY_OVERHEAD_SIZE = 12
# Mutations shorter than this cannot be valid (Mutation.serializer's smallest output).
MIN_MUTATION_SIZE = 10

_MARKER = struct.Struct(">iI")
_INT = struct.Struct(">i")
_SIZE_AND_CRC = struct.Struct(">iI")
_UINT = struct.Struct(">I")


class DamageKind(enum.Enum):
    """What Cassandra's reader would complain about, and how much of the segment it gives up."""

    # The segment stops here (nothing after it is read).
    UNREADABLE_HEADER = "segment header cannot be read"
    BAD_SYNC_MARKER_CRC = "sync marker CRC mismatch"
    SYNC_MARKER_PAST_END = "sync marker points outside the file (torn tail)"
    TRUNCATED_ENTRY_HEADER = "fewer than 4 bytes left for an entry size"
    # The rest of the section is skipped; reading resumes at the next sync marker.
    INVALID_MUTATION_SIZE = "invalid mutation size"
    SIZE_CRC_MISMATCH = "mutation size checksum failure"
    UNEXPECTED_END_OF_SECTION = "entry runs past the end of its section"
    UNREADABLE_SECTION = "section could not be decompressed or decrypted"
    # Only this entry is skipped.
    ENTRY_CRC_MISMATCH = "mutation checksum failure"
    # Reported by consumers that decode mutations (see MutationSerializer).
    UNDECODABLE_MUTATION = "mutation could not be decoded"
    SEGMENT_ID_MISMATCH = "segment id in the header differs from the file name"


@dataclass(frozen=True, slots=True)
class Damage:
    """A problem found in a segment: where (file, file offset, logical position) and what."""

    path: str
    kind: DamageKind
    detail: str
    file_offset: int  # of the sync section (or header field) concerned
    section: int  # 1-based index of the sync section; 0 for the header
    position: int | None = None  # logical position (Cassandra's), for entry-level damage
    raw: bytes = b""  # the damaged entry's bytes, when there are any to keep

    def __str__(self) -> str:
        where = f"{self.path} section {self.section} at file offset {self.file_offset}"
        if self.position is not None and self.position != self.file_offset:
            where += f" (position {self.position})"
        return f"{where}: {self.kind.value}: {self.detail}"


@dataclass(slots=True)
class Entry:
    """One commit log entry: a serialized mutation and where it is.

    ``position`` is the logical position just past the entry, as Cassandra reports it
    (``CommitLogPosition``); ``start`` is the logical position of its size field.
    """

    segment_id: int
    start: int
    position: int
    body: bytes
    section_offset: int  # file offset of the entry's sync section
    section: int  # 1-based index of that section


@dataclass(frozen=True, slots=True)
class Section:
    """A sync section's plain bytes; ``logical_start`` is the logical position of ``data[0]``."""

    file_offset: int
    logical_start: int
    logical_end: int
    data: bytes | memoryview
    # Cut short by the end of the file (a torn tail): its last entry may be incomplete.
    torn: bool = False


class SegmentReader:
    """Reads the entries of one segment file.

    ``start``: skip entries ending at or before this logical position (resume after a restart).
    ``limit``: read only sections ending at or before this logical position (the durable offset of a
    ``_cdc.idx`` file); None reads to the end. Damage is reported to ``on_damage`` and collected in
    ``damage``; reading goes on wherever Cassandra's own reader would.
    """

    def __init__(self, path: str | Path, keystore: KeyStore | None = None, *, start: int = 0,
                 limit: int | None = None, on_damage: Callable[[Damage], None] | None = None,
                 resume: tuple[int, int, int] | None = None) -> None:
        self.path = str(path)
        self.start = start
        self.limit = limit
        self.damage: list[Damage] = []
        self._on_damage = on_damage
        self._file = open(self.path, "rb")
        self._size = os.fstat(self._file.fileno()).st_size
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if self._size else b""
        try:
            self.descriptor = Descriptor.deserialize(self._map[:min(self._size, 65536 + 18)], self.path)
        except CommitLogError:
            self.close()
            raise
        self._key = self._encryption_key(keystore)
        self._decrypted_a_section = False
        self._compressor = None
        if self.descriptor.compression_class and not self.descriptor.encrypted:
            self._compressor = compressor_for(self.descriptor.compression_class)
        header = self.descriptor.header_size
        self._resume = resume or (header, header, 0)
        #: (file offset, logical position, sections before it) of the sync marker after the sections read
        #: completely: a later reader of the same segment can start there (``resume``) instead of walking them
        #: again
        self.resume_point = self._resume
        #: logical position up to which the segment has been read completely
        self.position = self._resume[1]
        #: True once the end of the segment was reached (not merely the limit)
        self.finished = False
        #: True when that end is a marker of Cassandra's (zeroed space where the next sync marker would be, or a
        #: zero entry size), not the end of the file
        self.ended_at_marker = False
        self._section_index = 0
        named = parse_segment_name(os.path.basename(self.path))
        if named and named[1] != self.descriptor.segment_id:
            self.report(DamageKind.SEGMENT_ID_MISMATCH,
                         f"header id {self.descriptor.segment_id}, file name id {named[1]}", 4)

    @property
    def file_size(self) -> int:
        return self._size

    @property
    def plain(self) -> bool:
        """Neither compressed nor encrypted: logical positions are file offsets."""
        return self._compressor is None and self._key is None

    @property
    def segment_id(self) -> int:
        return self.descriptor.segment_id

    @property
    def version(self) -> int:
        return self.descriptor.version

    def _encryption_key(self, keystore: KeyStore | None) -> EncryptionKey | None:
        if not self.descriptor.encrypted:
            return None
        params = self.descriptor.params
        if keystore is None:
            raise CommitLogError(f"segment is encrypted with key alias {params['encKeyAlias']!r}; "
                                 "give a keystore (--keystore) to read it", self.path)
        try:
            key = keystore.key(params["encKeyAlias"])
        except CommitLogError as error:
            raise CommitLogError(error.reason, self.path) from None
        return EncryptionKey(key, bytes.fromhex(params["encIV"]), params["encCipher"])

    def close(self) -> None:
        if isinstance(self._map, mmap.mmap):
            try:
                self._map.close()
            except BufferError:
                pass  # a section view is still referenced; the map is released with it
        self._file.close()

    def __enter__(self) -> "SegmentReader":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def report(self, kind: DamageKind, detail: str, file_offset: int, position: int | None = None,
                raw: bytes = b"") -> None:
        damage = Damage(self.path, kind, detail, file_offset, self._section_index, position, raw)
        self.damage.append(damage)
        if self._on_damage is not None:
            self._on_damage(damage)

    # --- sections -------------------------------------------------------------------------------

    def sections(self) -> Iterator[Section]:
        """The sync sections in order, stopping at the end of the segment, damage, or ``limit``."""
        data = self._map
        segment_id = self.descriptor.segment_id
        id_crc = zlib.crc32(struct.pack(">II", segment_id & 0xFFFFFFFF, (segment_id >> 32) & 0xFFFFFFFF))
        offset, logical, self._section_index = self._resume
        while True:
            self._section_index += 1
            if self.limit is not None and logical >= self.limit:
                return
            if offset > self._size - SYNC_MARKER_SIZE:
                self.finished = True
                return
            next_marker, crc = _MARKER.unpack_from(data, offset)
            if crc != zlib.crc32(_INT.pack(offset), id_crc):
                if next_marker == 0 and crc == 0:
                    self.finished = self.ended_at_marker = True  # zeroed space after the last section: a clean end
                else:
                    self.report(DamageKind.BAD_SYNC_MARKER_CRC, f"marker (next={next_marker}, crc={crc:#010x})",
                                 offset, logical)
                return
            if next_marker < offset or next_marker > self._size:
                torn = self.plain and next_marker > self._size and (self.limit is None or self._size <= self.limit)
                self.report(DamageKind.SYNC_MARKER_PAST_END,
                             f"next marker at {next_marker}, file is {self._size} bytes"
                             + ("; the entries up to the end of the file are read" if torn else ""),
                             offset, logical)
                if torn:
                    # As Cassandra's replay does: the intact entries before the cut are delivered (a
                    # compressed or encrypted section cannot be decoded in part).
                    body_start = offset + SYNC_MARKER_SIZE
                    body = memoryview(self._map)[body_start:]
                    yield Section(offset, body_start, self._size, body, torn=True)
                return
            section = self._section(offset, logical, next_marker)
            if section is None:
                return
            if self.limit is not None and section.logical_end > self.limit:
                return  # not yet durable: the idx file has not reached its end
            yield section
            offset, logical = next_marker, section.logical_end
            self.resume_point = (offset, logical, self._section_index)

    def _section(self, offset: int, logical: int, next_marker: int) -> Section | None:
        body_start = offset + SYNC_MARKER_SIZE
        if self.plain:
            return Section(offset, body_start, next_marker, memoryview(self._map)[body_start:next_marker])
        if next_marker - body_start < 4:
            self.report(DamageKind.UNREADABLE_SECTION, "section too short for its length field", offset, logical)
            return None
        (plain_length,) = _INT.unpack_from(self._map, body_start)
        logical_start = logical + SYNC_MARKER_SIZE
        logical_end = logical_start + plain_length
        if self.limit is not None and logical_end > self.limit:
            return Section(offset, logical_start, logical_end, b"")
        try:
            compressed = self._map[body_start + 4:next_marker]
            if self._key is not None:
                plain = self._decrypt(compressed, plain_length)
            else:
                plain = self._compressor.decompress(compressed, plain_length)  # type: ignore[union-attr]
            if len(plain) != plain_length:
                raise ValueError(f"got {len(plain)} bytes, the section header says {plain_length}")
        except Exception as error:  # every codec has its own exception types
            detail = f"{type(error).__name__}: {error}"
            if self._key is not None and not self._decrypted_a_section:
                # Nothing decrypts, from the first section on: far likelier a wrong key than damage.
                alias = self.descriptor.params["encKeyAlias"]
                detail = f"the key for alias {alias!r} does not decrypt this segment: wrong key? ({detail})"
            self.report(DamageKind.UNREADABLE_SECTION, detail, offset, logical)
            plain = b""
        else:
            self._decrypted_a_section = True
        return Section(offset, logical_start, logical_end, plain)

    def _decrypt(self, data: bytes, plain_length: int) -> bytes:
        chunks, pos = [], 0
        while pos < len(data) - 1:
            encrypted_length, block_plain_length = ENCRYPTED_BLOCK_HEADER.unpack_from(data, pos)
            pos += ENCRYPTED_BLOCK_HEADER.size
            chunks.append(decrypt_block(self._key, data[pos:pos + encrypted_length], block_plain_length))  # type: ignore[arg-type]
            pos += encrypted_length
        return b"".join(chunks)

    # --- entries --------------------------------------------------------------------------------

    def entries(self) -> Iterator[Entry]:
        """The intact entries, in order, applying Cassandra's framing rules (§6.2)."""
        segment_id = self.descriptor.segment_id
        start_after = self.start
        for section in self.sections():
            # Bodies are sliced from a memoryview with one copy (tobytes), not a view slice then bytes().
            data, end = memoryview(section.data), len(section.data)
            base = section.logical_start
            pos = 0
            while pos < end:
                if section.torn and end - pos < 8:
                    self._stop_at_the_cut(base + pos)
                    return
                if end - pos < 4:
                    self.report(DamageKind.TRUNCATED_ENTRY_HEADER, f"{end - pos} bytes left in the section",
                                 section.file_offset, base + pos)
                    self.finished = True
                    return
                if end - pos >= 8:
                    size, size_crc = _SIZE_AND_CRC.unpack_from(data, pos)
                else:
                    size, size_crc = _INT.unpack_from(data, pos)[0], None
                if size == 0:
                    self.finished = self.ended_at_marker = True  # LEGACY_END_OF_SEGMENT_MARKER
                    self.position = max(self.position, base + pos)
                    return
                if size < MIN_MUTATION_SIZE:
                    self.report(DamageKind.INVALID_MUTATION_SIZE, f"size {size}", section.file_offset, base + pos)
                    break
                # The entry CRC covers the size field then the body: the size CRC is its seed.
                size_field_crc = zlib.crc32(_INT.pack(size))
                if size_crc is None or size_crc != size_field_crc:
                    self.report(DamageKind.SIZE_CRC_MISMATCH, f"size {size}", section.file_offset, base + pos)
                    break
                entry_end = pos + ENTRY_OVERHEAD_SIZE + size
                if entry_end > end and section.torn:
                    self._stop_at_the_cut(base + pos)
                    return
                if entry_end > end:
                    self.report(DamageKind.UNEXPECTED_END_OF_SECTION,
                                 f"entry of {size} bytes needs {entry_end - end} more", section.file_offset, base + pos)
                    break
                position = base + entry_end
                if position <= start_after:
                    pos = entry_end  # delivered before (a resumed read): its CRC was checked then
                    continue
                body = data[pos + 8:pos + 8 + size].tobytes()
                (crc,) = _UINT.unpack_from(data, entry_end - 4)
                if crc != zlib.crc32(body, size_field_crc):
                    self.report(DamageKind.ENTRY_CRC_MISMATCH, f"entry of {size} bytes",
                                 section.file_offset, base + pos, raw=body)
                else:
                    yield Entry(segment_id, base + pos, position, body, section.file_offset, self._section_index)
                pos = entry_end
            self.position = max(self.position, section.logical_end)

    def _stop_at_the_cut(self, position: int) -> None:
        """At the entry that the end of the file cuts, in a torn section: the damage is reported already
        (the torn tail); what precedes it is read."""
        self.position = max(self.position, position)
