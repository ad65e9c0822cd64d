"""The row and partition format that commit log segments and SSTables share (Cassandra's ``db/rows`` and
``db/partitions``): partition updates, rows, range tombstone markers, cells, deletion times, the
serialization header, and the binary input and output they are read from and written to.
Byte format: docs/storage-format.md §9-§14.
"""

from .binary_io import DataInput, DataOutput, EndOfData
from .cells import Cell, ComplexColumn, DeletionTime, LivenessInfo
from .decode_errors import MutationDecodeError, UnknownTableError
from .partition_update import PartitionUpdate, PartitionUpdateSerializer
from .rows import BoundKind, RangeTombstoneMarker, Row

__all__ = [
    "BoundKind", "Cell", "ComplexColumn", "DataInput", "DataOutput", "DeletionTime", "EndOfData", "LivenessInfo",
    "MutationDecodeError", "PartitionUpdate", "PartitionUpdateSerializer", "RangeTombstoneMarker", "Row",
    "UnknownTableError",
]
