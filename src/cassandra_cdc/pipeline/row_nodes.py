"""The leaves and inner nodes of wide partitions' rows (``merge.row_tree``), in a ``MapState`` of each group.

Each node is a value keyed by its partition key and its node id (a number of that partition's). Nodes are
read as a merge needs them, one exchange with the state server each (most writes to a wide partition need its
last leaf, or one other); nodes written are held until the group's pages are written back, then written in
one exchange with them, so that a node written twice in a batch is written once, and a node is read back
from here while it waits.
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
        self.reads = 0  # nodes read from the state store (the batch's figure for the metrics and benchmarks)
        self.bytes_written = 0

    def read(self, partition_key: bytes, node: int) -> bytes:
        key = (partition_key, node)
        value = self._written.get(key)
        if value is not None:
            return value
        if key in self._removed:
            raise KeyError(f"node {node} of partition {partition_key.hex()} was removed")
        [stored] = self._state.get_all([key])
        if stored is None:
            raise KeyError(f"node {node} of partition {partition_key.hex()} is not in the state store: the "
                           "checkpoint's state is incomplete")
        self.reads += 1
        return stored[0]

    def write(self, partition_key: bytes, nodes: dict[int, bytes]) -> None:
        for node, value in nodes.items():
            key = (partition_key, node)
            self._written[key] = value
            self._removed.discard(key)

    def remove(self, partition_key: bytes, nodes: Iterable[int]) -> None:
        for node in nodes:
            key = (partition_key, node)
            self._written.pop(key, None)
            self._removed.add(key)

    def flush(self) -> None:
        """Write the nodes held, and remove those removed, in one exchange each."""
        if self._written:
            self.bytes_written += sum(len(value) for value in self._written.values())
            self._state.update_all([(key, (value,)) for key, value in self._written.items()])
            self._written.clear()
        if self._removed:
            self._state.remove_all(list(self._removed))
            self._removed.clear()


__all__ = ["NODE_KEY_SCHEMA", "RowNodes"]
