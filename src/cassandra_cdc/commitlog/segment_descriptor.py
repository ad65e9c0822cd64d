"""The segment header (``CommitLogDescriptor``) and segment file names (docs/storage-format.md §2.1, §3)."""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from .segment_errors import DescriptorError

# Commit log versions whose mutations decode: Cassandra 3.0-3.11, 4.0-5.0, 5.0 in compatibility mode NONE.
MUTATION_VERSIONS = {6: "3.0-3.11", 7: "4.0-5.0", 8: "5.0 (storage_compatibility_mode NONE)"}
# Version 5 (Cassandra 2.2) has the same header, sections and entry framing; only its mutation bodies
# use the pre-3.0 layout. Reading its framing lets damage detection be checked on real 2.2 files.
FRAMING_VERSIONS = (5, *MUTATION_VERSIONS)

SEGMENT_NAME = re.compile(r"CommitLog-(\d+)-(\d+)\.log$")
CDC_INDEX_NAME = re.compile(r"CommitLog-(\d+)-(\d+)_cdc\.idx$")

_HEAD = struct.Struct(">iqH")


@dataclass(frozen=True)
class Descriptor:
    version: int
    segment_id: int
    params: dict[str, Any] = field(default_factory=dict)
    # The params JSON exactly as stored, so a re-written header is byte-identical.
    params_json: str = "{}"

    @property
    def header_size(self) -> int:
        return 18 + len(self.params_json.encode("utf-8"))

    @property
    def compression_class(self) -> str | None:
        return self.params.get("compressionClass")

    @property
    def encrypted(self) -> bool:
        return "encKeyAlias" in self.params and "encCipher" in self.params

    @property
    def file_name(self) -> str:
        return segment_file_name(self.version, self.segment_id)

    @staticmethod
    def create(version: int, segment_id: int, params: dict[str, Any] | None = None) -> "Descriptor":
        params = params or {}
        # Cassandra writes the params sorted by key (a TreeMap); 3.x/4.x escape '/' as json-simple does.
        text = json.dumps(dict(sorted(params.items())), separators=(",", ":"))
        if version < 8:
            text = text.replace("/", "\\/")
        return Descriptor(version, segment_id, params, text)

    def serialize(self) -> bytes:
        params = self.params_json.encode("utf-8")
        head = _HEAD.pack(self.version, self.segment_id, len(params))
        return head + params + struct.pack(">I", _header_crc(self.version, self.segment_id, params))

    @staticmethod
    def deserialize(data: bytes, path: str = "") -> "Descriptor":
        if len(data) < _HEAD.size:
            raise DescriptorError(f"file too short for a commit log header ({len(data)} bytes)", path, 0)
        version, segment_id, params_length = _HEAD.unpack_from(data)
        if version not in FRAMING_VERSIONS:
            known = ", ".join(f"{v} (Cassandra {c})" for v, c in MUTATION_VERSIONS.items())
            hint = " (pre-2.2 commit logs are not supported)" if 0 < version < 5 else ""
            raise DescriptorError(f"unsupported commit log version {version}{hint}; supported: {known}", path, 0)
        end = _HEAD.size + params_length
        if len(data) < end + 4:
            raise DescriptorError("file too short for the commit log header's parameters", path, _HEAD.size)
        params = bytes(data[_HEAD.size:end])
        (crc,) = struct.unpack_from(">I", data, end)
        if crc != _header_crc(version, segment_id, params):
            raise DescriptorError("commit log header CRC mismatch", path, end)
        try:
            text = params.decode("utf-8")
            parsed = json.loads(text)
        except ValueError as error:
            raise DescriptorError(f"commit log header parameters are not JSON: {error}", path, _HEAD.size)
        if not isinstance(parsed, dict):
            raise DescriptorError("commit log header parameters are not a JSON object", path, _HEAD.size)
        return Descriptor(version, segment_id, parsed, text)


def _header_crc(version: int, segment_id: int, params: bytes) -> int:
    # The id is fed low half first, and the params length as a 4-byte int although stored in 2.
    crc = zlib.crc32(struct.pack(">iIIi", version, segment_id & 0xFFFFFFFF, (segment_id >> 32) & 0xFFFFFFFF,
                                 len(params)))
    return zlib.crc32(params, crc)


def segment_file_name(version: int, segment_id: int) -> str:
    return f"CommitLog-{version}-{segment_id}.log"


def cdc_index_file_name(version: int, segment_id: int) -> str:
    return f"CommitLog-{version}-{segment_id}_cdc.idx"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """(version, segment id) of a segment file name, or None if it is not one."""
    match = SEGMENT_NAME.search(name)
    return (int(match.group(1)), int(match.group(2))) if match else None
