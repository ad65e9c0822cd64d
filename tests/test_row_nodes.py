"""The leaves of wide partitions as the processor keeps them between a read and the batch's end (RowNodes):
what was written is what is read back, what was removed is gone, what was read ahead is read once."""

from __future__ import annotations

import pytest

from cassandra_cdc.pipeline.row_nodes import RowNodes
from cassandra_cdc.pipeline.state_requests import MapStateRequests


class MapState:
    """PySpark's ``MapState`` calls, on a dict, counting the reads."""

    def __init__(self, values: dict[tuple[bytes, int], bytes]) -> None:
        self.values = {key: (value,) for key, value in values.items()}
        self.reads = 0

    def getValue(self, key: tuple[bytes, int]) -> tuple[bytes] | None:  # noqa: N802 (PySpark's names)
        self.reads += 1
        return self.values.get(key)

    def updateValue(self, key: tuple[bytes, int], value: tuple[bytes]) -> None:  # noqa: N802
        self.values[key] = value

    def removeKey(self, key: tuple[bytes, int]) -> None:  # noqa: N802
        self.values.pop(key, None)


def test_nodes_read_ahead_written_and_removed_are_read_as_they_are_now() -> None:
    state = MapState({(b"k", 1): b"one", (b"k", 2): b"two", (b"k", 3): b"three"})
    nodes = RowNodes(MapStateRequests(state, "rows"))
    nodes.read_ahead([(b"k", 1), (b"k", 2), (b"k", 3)])
    assert state.reads == 3 and nodes.available(b"k", 1) and not nodes.available(b"k", 4)
    nodes.write(b"k", {2: b"two again", 4: b"four"})
    nodes.remove(b"k", [3])
    assert [nodes.read(b"k", node) for node in (1, 2, 4)] == [b"one", b"two again", b"four"]
    assert state.reads == 3  # nothing asked again
    with pytest.raises(KeyError, match="node 3 of partition 6b was removed"):
        nodes.read(b"k", 3)
    assert nodes.read(b"k", 1) == b"one" and state.reads == 4  # read ahead once: then from the store
    nodes.flush()
    assert state.values == {(b"k", 1): (b"one",), (b"k", 2): (b"two again",), (b"k", 4): (b"four",)}
    with pytest.raises(KeyError, match="node 9 of partition 6b is not in the state store"):
        nodes.read(b"k", 9)
