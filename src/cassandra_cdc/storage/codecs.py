"""Section codecs: the compressors of ``commitlog_compression`` and transparent data encryption.

docs/storage-format.md §5.1-§5.2 (compressed sections) and §5.3 (encrypted sections).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Protocol

import cramjam
import lz4.block
import zstandard
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


class Compressor(Protocol):
    name: str

    def compress(self, data: bytes) -> bytes: ...

    def decompress(self, data: bytes, uncompressed_length: int) -> bytes: ...


class LZ4Compressor:
    """4-byte little-endian uncompressed length, then a raw LZ4 block (lz4-java's format)."""

    name = "LZ4Compressor"

    def compress(self, data: bytes) -> bytes:
        return lz4.block.compress(data, mode="default", store_size=True)

    def decompress(self, data: bytes, uncompressed_length: int) -> bytes:
        return lz4.block.decompress(data)


class SnappyCompressor:
    name = "SnappyCompressor"

    def compress(self, data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(data))

    def decompress(self, data: bytes, uncompressed_length: int) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(data))


class DeflateCompressor:
    """A zlib stream, as java.util.zip.Deflater writes by default."""

    name = "DeflateCompressor"

    def compress(self, data: bytes) -> bytes:
        return zlib.compress(data)

    def decompress(self, data: bytes, uncompressed_length: int) -> bytes:
        return zlib.decompress(data)


class ZstdCompressor:
    """A zstd frame with a content checksum (``Zstd.compress(dst, src, level, true)``)."""

    name = "ZstdCompressor"

    def __init__(self, level: int = 3) -> None:
        self.level = level

    def compress(self, data: bytes) -> bytes:
        return zstandard.ZstdCompressor(level=self.level, write_checksum=True).compress(data)

    def decompress(self, data: bytes, uncompressed_length: int) -> bytes:
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=uncompressed_length)


class NoopCompressor:
    name = "NoopCompressor"

    def compress(self, data: bytes) -> bytes:
        return bytes(data)

    def decompress(self, data: bytes, uncompressed_length: int) -> bytes:
        return bytes(data)


_COMPRESSORS: dict[str, type] = {c.name: c for c in
                                 (LZ4Compressor, SnappyCompressor, DeflateCompressor, ZstdCompressor, NoopCompressor)}


def compressor_for(class_name: str) -> Compressor:
    """The compressor named in a segment header (short or fully qualified Java class name)."""
    short = class_name.rsplit(".", 1)[-1]
    if short not in _COMPRESSORS:
        raise ValueError(f"unknown commit log compressor {class_name!r}; known: {', '.join(_COMPRESSORS)}")
    return _COMPRESSORS[short]()


@dataclass(frozen=True)
class EncryptionKey:
    """The AES key and IV of an encrypted segment (``encKeyAlias``, ``encIV`` in its header)."""

    key: bytes
    iv: bytes
    cipher: str = "AES/CBC/PKCS5Padding"

    def __post_init__(self) -> None:
        if self.cipher != "AES/CBC/PKCS5Padding":
            raise ValueError(f"unsupported commit log cipher {self.cipher!r} (only AES/CBC/PKCS5Padding)")

    def _cipher(self) -> Cipher:
        return Cipher(algorithms.AES(self.key), modes.CBC(self.iv))

    def encrypt(self, plain: bytes) -> bytes:
        padder = padding.PKCS7(128).padder()
        encryptor = self._cipher().encryptor()
        return encryptor.update(padder.update(plain) + padder.finalize()) + encryptor.finalize()

    def decrypt(self, encrypted: bytes) -> bytes:
        decryptor = self._cipher().decryptor()
        padded = decryptor.update(encrypted) + decryptor.finalize()
        unpadder = padding.PKCS7(128).unpadder()
        return unpadder.update(padded) + unpadder.finalize()


# Encrypted sections: each block is ``int32 encryptedLength, int32 plainLength, ciphertext``; the plain
# text of a block is ``int32 uncompressedLength`` then LZ4Compressor output (EncryptionUtils.compress).
ENCRYPTED_BLOCK_HEADER = struct.Struct(">ii")
_LZ4 = LZ4Compressor()


def encrypt_block(key: EncryptionKey, chunk: bytes) -> bytes:
    plain = struct.pack(">i", len(chunk)) + _LZ4.compress(chunk)
    encrypted = key.encrypt(plain)
    return ENCRYPTED_BLOCK_HEADER.pack(len(encrypted), len(plain)) + encrypted


def decrypt_block(key: EncryptionKey, encrypted: bytes, plain_length: int) -> bytes:
    plain = key.decrypt(encrypted)[:plain_length]
    (uncompressed_length,) = struct.unpack_from(">i", plain)
    chunk = _LZ4.decompress(plain[4:], uncompressed_length)
    if len(chunk) != uncompressed_length:
        raise ValueError(f"encrypted block decompressed to {len(chunk)} bytes, expected {uncompressed_length}")
    return chunk
