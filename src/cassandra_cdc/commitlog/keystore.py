"""Keys for encrypted segments, from a Java keystore as Cassandra's ``JKSKeyProvider`` reads them."""

from __future__ import annotations

from pathlib import Path

import jks

from .segment_errors import CommitLogError


class KeyStore:
    """Secret keys by alias: from a JCEKS/JKS keystore file, or given raw (``alias -> key bytes``)."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        # Java keystores lower-case aliases on lookup.
        self._keys = {alias.lower(): key for alias, key in keys.items()}

    @staticmethod
    def load(path: str | Path, store_password: str, key_password: str | None = None) -> "KeyStore":
        try:
            store = jks.KeyStore.load(str(path), store_password, try_decrypt_keys=False)
        except (OSError, jks.util.KeystoreException) as error:
            raise CommitLogError(f"cannot open keystore: {error}", str(path)) from error
        keys = {}
        for alias, entry in store.secret_keys.items():
            try:
                entry.decrypt(key_password or store_password)
            except jks.util.DecryptionFailureException as error:
                raise CommitLogError(f"wrong key password for alias {alias!r}", str(path)) from error
            keys[alias] = bytes(entry.key)
        return KeyStore(keys)

    def key(self, alias: str) -> bytes:
        try:
            return self._keys[alias.lower()]
        except KeyError:
            known = ", ".join(sorted(self._keys)) or "none"
            raise CommitLogError(f"no key for alias {alias!r} in the keystore (aliases: {known})") from None

    def __contains__(self, alias: str) -> bool:
        return alias.lower() in self._keys
