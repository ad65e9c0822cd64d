"""``CompressionInfo.db`` and reading Data.db chunk by chunk, compressed or not, checking every checksum.

CompressionInfo.db (``CompressionMetadata``): ``writeUTF`` compressor class name, ``int32`` option count and
that many ``writeUTF`` key/value pairs, ``int32`` chunk length, from 4.0 (``na``) ``int32``
maxCompressedLength, ``int64`` uncompressed data length, ``int32`` chunk count and one ``int64`` file offset
per chunk. In Data.db each chunk is followed by the CRC32 of its (compressed) bytes; from 4.0 a chunk whose
compressed form would be at least maxCompressedLength bytes is stored uncompressed.

An uncompressed Data.db is checked against ``CRC.db``: ``int32`` block size, then the CRC32 of each block.
``Digest.crc32`` holds the CRC32 of the whole Data.db file as decimal text.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..storage.codecs import Compressor, compressor_for
from .sstable_descriptor import Version
from .sstable_errors import ChecksumError, SSTableError, UnsupportedSSTableError

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
READ_BLOCK = 1 << 16  # read size for uncompressed Data.db without CRC.db


@dataclass(frozen=True)
class CompressionInfo:
    compressor: str
    options: dict[str, str]
    chunk_length: int
    max_compressed_length: int
    data_length: int  # uncompressed
    chunk_offsets: array = field(repr=False)  # array('q'): file offset of each chunk in Data.db

    @property
    def chunk_count(self) -> int:
        return len(self.chunk_offsets)

    @staticmethod
    def read(path: Path, version: Version) -> "CompressionInfo":
        try:
            data = path.read_bytes()
        except OSError as error:
            raise SSTableError(f"cannot read: {error.strerror or error}", path) from None
        pos = 0

        def take(size: int) -> bytes:
            nonlocal pos
            if pos + size > len(data):
                raise SSTableError(f"truncated: needed {size} bytes, {len(data) - pos} left", path, pos)
            pos += size
            return data[pos - size:pos]

        def utf() -> str:
            return take(struct.unpack(">H", take(2))[0]).decode("utf-8")

        compressor = utf()
        options = {utf(): utf() for _ in range(_INT.unpack(take(4))[0])}
        chunk_length = _INT.unpack(take(4))[0]
        max_compressed = _INT.unpack(take(4))[0] if version.has_max_compressed_length else (1 << 31) - 1
        data_length = _LONG.unpack(take(8))[0]
        count = _INT.unpack(take(4))[0]
        offsets = array("q")
        offsets.frombytes(take(8 * count))
        if offsets.itemsize != 8:
            raise SSTableError("this platform's array('q') is not 64-bit", path)
        if struct.pack("=h", 1) != struct.pack(">h", 1):
            offsets.byteswap()
        if chunk_length <= 0 or count != -(-data_length // chunk_length):
            raise SSTableError(f"{count} chunks of {chunk_length} bytes cannot hold {data_length} bytes", path)
        return CompressionInfo(compressor, options, chunk_length, max_compressed, data_length, offsets)

    def serialize(self, version: Version) -> bytes:
        out = bytearray(_utf(self.compressor))
        out += _INT.pack(len(self.options))
        for key, value in self.options.items():
            out += _utf(key) + _utf(value)
        out += _INT.pack(self.chunk_length)
        if version.has_max_compressed_length:
            out += _INT.pack(self.max_compressed_length)
        out += _LONG.pack(self.data_length) + _INT.pack(self.chunk_count)
        for offset in self.chunk_offsets:
            out += _LONG.pack(offset)
        return bytes(out)


def _utf(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack(">H", len(data)) + data


def compress_data(data: bytes, compressor: str, version: Version, chunk_length: int = 1 << 16,
                  max_compressed_length: int = (1 << 31) - 1) -> tuple[bytes, CompressionInfo]:
    """A compressed Data.db and its CompressionInfo for uncompressed ``data`` (what Cassandra's
    ``CompressedSequentialWriter`` writes): each chunk compressed, or kept as is when its compressed form
    is at least ``max_compressed_length`` bytes (4.0+), followed by the CRC32 of the stored bytes."""
    codec = compressor_for(compressor)
    out = bytearray()
    offsets = array("q")
    for start in range(0, len(data), chunk_length):
        chunk = data[start:start + chunk_length]
        stored = codec.compress(chunk)
        if version.has_max_compressed_length and len(stored) >= max_compressed_length:
            stored = chunk
        offsets.append(len(out))
        out += stored + struct.pack(">I", zlib.crc32(stored))
    info = CompressionInfo(compressor, {}, chunk_length, max_compressed_length, len(data), offsets)
    return bytes(out), info


def checksum_blocks(data: bytes, block: int = 1 << 16) -> bytes:
    """The CRC.db of an uncompressed Data.db: the block size, then the CRC32 of each block."""
    crcs = [zlib.crc32(data[i:i + block]) for i in range(0, len(data), block)]
    return _INT.pack(block) + b"".join(struct.pack(">I", crc) for crc in crcs)


@dataclass
class ReadCounters:
    """What the chunk readers checked: filled in as data is read."""

    chunks: int = 0
    compressed_bytes: int = 0
    digest_verified: bool = False
    crc_checked: bool = False


class CompressedChunks:
    """The decompressed chunks of a compressed Data.db, from the one holding uncompressed offset ``start``.

    Chunks are read lazily, in order, one at a time; each one's CRC32 is checked before decompressing it.
    When reading starts at the first chunk and runs to the end, the file's CRC32 is compared with ``digest``
    (the content of Digest.crc32) too.
    """

    def __init__(self, path: Path, info: CompressionInfo, start: int = 0, digest: int | None = None,
                 counters: ReadCounters | None = None) -> None:
        self.path = path
        self.info = info
        self.first_chunk = min(start // info.chunk_length, info.chunk_count)
        self.digest = digest if self.first_chunk == 0 else None
        self.counters = counters if counters is not None else ReadCounters()
        try:
            self.compressor: Compressor = compressor_for(info.compressor)
        except ValueError:
            raise UnsupportedSSTableError(f"unknown SSTable compressor {info.compressor!r} in CompressionInfo.db "
                                          "(LZ4, Snappy, Deflate and Zstd are supported)", path) from None

    @property
    def start_offset(self) -> int:
        """Uncompressed offset of the first chunk read."""
        return self.first_chunk * self.info.chunk_length

    def __iter__(self) -> Iterator[bytes]:
        info, path = self.info, self.path
        offsets = info.chunk_offsets
        try:
            file = path.open("rb")
        except OSError as error:
            raise SSTableError(f"cannot read: {error.strerror or error}", path) from None
        with file:
            file_length = file.seek(0, 2)
            file.seek(offsets[self.first_chunk] if self.first_chunk < info.chunk_count else file_length)
            running = 0
            for index in range(self.first_chunk, info.chunk_count):
                offset = offsets[index]
                next_offset = offsets[index + 1] if index + 1 < info.chunk_count else file_length
                length = next_offset - offset - 4
                if length < 0 or next_offset > file_length:
                    raise SSTableError(f"chunk {index} of {length + 4} bytes runs past the end of the file "
                                       f"({file_length} bytes)", path, offset)
                if file.tell() != offset:
                    file.seek(offset)
                block = file.read(length + 4)
                if len(block) != length + 4:
                    raise SSTableError(f"chunk {index} is truncated", path, offset)
                compressed = memoryview(block)[:length]
                stored = _INT.unpack_from(block, length)[0] & 0xFFFFFFFF
                computed = zlib.crc32(compressed)
                if computed != stored:
                    raise ChecksumError(f"checksum mismatch in chunk {index} (stored {stored:#010x}, "
                                        f"computed {computed:#010x})", path, offset, index)
                if self.digest is not None:
                    running = zlib.crc32(block, running)
                expected = min(info.chunk_length, info.data_length - index * info.chunk_length)
                if length >= info.max_compressed_length:
                    chunk = bytes(compressed)  # stored uncompressed (4.0+)
                else:
                    try:
                        chunk = self.compressor.decompress(bytes(compressed), expected)
                    except Exception as error:  # the codecs raise their own exception types
                        raise SSTableError(f"chunk {index} does not decompress with {info.compressor}: {error}",
                                           path, offset) from None
                if len(chunk) != expected:
                    raise SSTableError(f"chunk {index} holds {len(chunk)} bytes, expected {expected}", path, offset)
                self.counters.chunks += 1
                self.counters.compressed_bytes += length + 4
                self.counters.crc_checked = True
                yield chunk
            if self.digest is not None:
                if file.tell() != file_length:
                    raise SSTableError(f"{file_length - file.tell()} bytes after the last chunk", path, file.tell())
                _check_digest(path, running, self.digest)
                self.counters.digest_verified = True


class UncompressedBlocks:
    """The blocks of an uncompressed Data.db from the one holding ``start``, checked against CRC.db when there
    is one (and against ``digest`` when read whole)."""

    def __init__(self, path: Path, crc_path: Path | None, start: int = 0, digest: int | None = None,
                 counters: ReadCounters | None = None) -> None:
        self.path = path
        self.counters = counters if counters is not None else ReadCounters()
        self.crcs: array | None = None
        self.block = READ_BLOCK
        if crc_path is not None and crc_path.exists():
            data = crc_path.read_bytes()
            if len(data) < 4 or (len(data) - 4) % 4:
                raise SSTableError(f"CRC.db of {len(data)} bytes is not a block size and CRC32s", crc_path)
            self.block = _INT.unpack_from(data)[0]
            if self.block <= 0:
                raise SSTableError(f"CRC.db names a block size of {self.block}", crc_path)
            self.crcs = array("i")
            self.crcs.frombytes(data[4:])
            if struct.pack("=h", 1) != struct.pack(">h", 1):
                self.crcs.byteswap()
        self.length = path.stat().st_size
        self.first_block = min(start, self.length) // self.block
        self.digest = digest if self.first_block == 0 else None

    @property
    def start_offset(self) -> int:
        return self.first_block * self.block

    def __iter__(self) -> Iterator[bytes]:
        path, crcs = self.path, self.crcs
        with path.open("rb") as file:
            position = file.seek(self.start_offset)
            index = self.first_block
            running = 0
            while position < self.length:
                data = file.read(self.block)
                if not data:
                    raise SSTableError("file ends early", path, position)
                if crcs is not None:
                    if index >= len(crcs):
                        raise SSTableError(f"block {index} has no CRC in CRC.db", path, position)
                    stored, computed = crcs[index] & 0xFFFFFFFF, zlib.crc32(data)
                    if stored != computed:
                        raise ChecksumError(f"checksum mismatch in block {index} (stored {stored:#010x}, "
                                            f"computed {computed:#010x}, CRC.db)", path, position, index)
                    self.counters.crc_checked = True
                if self.digest is not None:
                    running = zlib.crc32(data, running)
                self.counters.chunks += 1
                self.counters.compressed_bytes += len(data)
                position += len(data)
                index += 1
                yield data
            if self.digest is not None:
                _check_digest(path, running, self.digest)
                self.counters.digest_verified = True


def read_digest(path: Path) -> int | None:
    """The CRC32 of Data.db recorded in Digest.crc32 (None without that file)."""
    try:
        text = path.read_text("ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise SSTableError(f"unreadable digest: {error}", path) from None
    if not text.isdigit():
        raise SSTableError(f"digest {text[:40]!r} is not a decimal CRC32", path)
    return int(text) & 0xFFFFFFFF


def _check_digest(path: Path, computed: int, stored: int) -> None:
    if computed != stored:
        raise ChecksumError(f"checksum mismatch of the whole file (Digest.crc32 says {stored}, computed "
                            f"{computed})", path)
