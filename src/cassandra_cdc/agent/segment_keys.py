"""The keys of encrypted segments: every segment still to read must decrypt with the keys the agent is
given."""

from __future__ import annotations

from ..commitlog import KeyStore, SegmentReader
from ..commitlog.segment_errors import CommitLogError, DescriptorError
from ..commitlog.segment_reader import DamageKind
from .agent_config import AgentConfig, ConfigError
from .cdc_raw import CdcSegment, read_cdc_index


def load_keystore(config: AgentConfig) -> KeyStore:
    encryption = config.encryption
    if encryption.keystore is not None:
        try:
            return KeyStore.load(encryption.keystore, encryption.keystore_password or "",
                                 encryption.key_password)
        except CommitLogError as error:
            raise ConfigError(f"encryption.keystore: {error}: check the file and "
                              "encryption.keystore_password / encryption.key_password") from None
    try:
        return KeyStore({alias: bytes.fromhex(key) for alias, key in encryption.keys.items()})
    except ValueError:
        raise ConfigError("encryption.keys: every key must be hexadecimal") from None


def ensure_key(segment: CdcSegment, keystore: KeyStore) -> None:
    """A ConfigError unless the keys given can read the segment."""
    problem = _key_problem(segment, keystore)
    if problem is not None:
        raise ConfigError(key_error(segment, problem))


def _key_problem(segment: CdcSegment, keystore: KeyStore) -> str | None:
    """Why the keys given cannot read a segment: its alias missing, or its first section not decrypting.

    Only a durable first section is tried (a 3.x segment is whole; a live one up to its idx offset): one being
    written may not decrypt yet.
    """
    index = read_cdc_index(segment.index_path)
    durable: int | None = 0  # 4.0+ without an idx: no CDC data yet
    if index is not None:
        durable = index.offset
    elif segment.version == 6:
        durable = None  # 3.x: whole once in cdc_raw
    try:
        reader = SegmentReader(segment.path, keystore, limit=durable)
    except (FileNotFoundError, DescriptorError, ValueError):
        return None  # gone, or not a key problem: the segment is kept whole when it is read
    except CommitLogError as error:
        return error.reason
    with reader:
        if reader.descriptor.encrypted:
            next(reader.sections(), None)
            if any(damage.kind is DamageKind.UNREADABLE_SECTION for damage in reader.damage):
                return (f"its first section does not decrypt with the key of alias "
                        f"{reader.descriptor.params['encKeyAlias']!r} (a wrong key?)")
    return None


def key_error(segment: CdcSegment, problem: str) -> str:
    return (f"{segment.path}: encrypted, and {problem}: give the node's keystore (encryption.keystore) or "
            "key (encryption.keys), then start the agent again; the segment stays in cdc_raw")
