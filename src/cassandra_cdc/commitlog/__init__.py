"""Pure-Python reader and writer of Cassandra commit log segments (commit log versions 6, 7 and 8).

Reading::

    with SegmentReader(path, keystore) as segment:
        for entry in segment.entries():
            mutation = MutationSerializer.deserialize(entry.body, schema, segment.version)

Writing (what a Cassandra node would write)::

    with SegmentWriter(directory, segment_id, version=7, compression="LZ4Compressor") as segment:
        segment.add(MutationSerializer.serialize(mutation, 7))
        segment.sync()
"""

from .cells import Cell, ComplexColumn, DeletionTime, LivenessInfo
from .descriptor import Descriptor, cdc_index_file_name, parse_segment_name, segment_file_name
from .errors import CommitLogError, DescriptorError, MutationDecodeError, UnknownTableError
from .keystore import KeyStore
from .mutation import Mutation, MutationSerializer
from .partition import PartitionUpdate, PartitionUpdateSerializer
from .reader import Damage, DamageKind, Entry, SegmentReader
from .rows import BoundKind, RangeTombstoneMarker, Row
from .writer import SegmentFull, SegmentWriter, write_cdc_index

__all__ = [
    "BoundKind", "Cell", "CommitLogError", "ComplexColumn", "Damage", "DamageKind", "DeletionTime",
    "Descriptor", "DescriptorError", "Entry", "KeyStore", "LivenessInfo", "Mutation", "MutationDecodeError",
    "MutationSerializer", "PartitionUpdate", "PartitionUpdateSerializer", "RangeTombstoneMarker", "Row",
    "SegmentFull", "SegmentReader", "SegmentWriter", "UnknownTableError", "cdc_index_file_name",
    "parse_segment_name", "segment_file_name", "write_cdc_index",
]
