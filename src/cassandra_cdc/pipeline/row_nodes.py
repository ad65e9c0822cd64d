"""The leaves and inner nodes of wide partitions' rows (``merge.row_tree``), in a ``MapState`` of each group.

Each node is a value keyed by its partition key and its node id (a number of that partition's). The nodes a
run of records will need are read ahead, many in one exchange with the state server (``read_ahead``); others
as a merge needs them (a range deletion's leaves), one exchange each. Nodes written are held until the group's
pages are written back, then written in one exchange with them, so that a node written twice in a batch is
written once, and a node is read back from here while it waits.
"""

from __future__ import annotations

from typing import Iterable

from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from .state_requests import MapStateRequests

NODE_KEY_SCHEMA = StructType([StructField("partition", BinaryType()), StructField("node", IntegerType())])


class RowNodes:
    """The row nodes of one group: read, written and removed through its ``MapState``."""

    def __init__(self, state: MapStateRequests) -> None:
        self._state = state
        self._written: dict[tuple[bytes, int], bytes] = {}
        self._removed: set[tuple[bytes, int]] = set()
        self._read_ahead: dict[tuple[bytes, int], bytes] = {}  # read, until the tree that needs it takes it

    def available(self, partition_key: bytes, node: int) -> bool:
        """Whether a node can be read without asking the state store."""
        key = (partition_key, node)
        return key in self._written or key in self._read_ahead

    def read_ahead(self, keys: Iterable[tuple[bytes, int]]) -> None:
        """Read ``(partition key, node)``s in one exchange, for ``read`` to give without asking again."""
        wanted = [key for key in keys if key not in self._written and key not in self._read_ahead
                  and key not in self._removed]
        for key, stored in zip(wanted, self._state.get_all(wanted)):
            self._read_ahead[key] = self._found(key, stored)

    def read(self, partition_key: bytes, node: int) -> bytes:
        key = (partition_key, node)
        value = self._written.get(key)
        if value is not None:
            return value
        value = self._read_ahead.pop(key, None)
        if value is not None:
            return value
        if key in self._removed:
            raise KeyError(f"node {node} of partition {partition_key.hex()} was removed")
        [stored] = self._state.get_all([key])
        return self._found(key, stored)

    @staticmethod
    def _found(key: tuple[bytes, int], stored: tuple[bytes] | None) -> bytes:
        if stored is None:
            raise KeyError(f"node {key[1]} of partition {key[0].hex()} is not in the state store: the "
                           "checkpoint's state is incomplete")
        return stored[0]

    def write(self, partition_key: bytes, nodes: dict[int, bytes]) -> None:
        for node, value in nodes.items():
            key = (partition_key, node)
            self._written[key] = value
            self._removed.discard(key)
            self._read_ahead.pop(key, None)

    def remove(self, partition_key: bytes, nodes: Iterable[int]) -> None:
        for node in nodes:
            key = (partition_key, node)
            self._written.pop(key, None)
            self._read_ahead.pop(key, None)
            self._removed.add(key)

    def flush(self) -> None:
        """Write the nodes held, and remove those removed, in one exchange each."""
        if self._written:
            self._state.update_all([(key, (value,)) for key, value in self._written.items()])
            self._written.clear()
        if self._removed:
            self._state.remove_all(list(self._removed))
            self._removed.clear()


__all__ = ["NODE_KEY_SCHEMA", "RowNodes"]
