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

from .keystore import KeyStore
from .mutation import Mutation, MutationSerializer
from .segment_descriptor import Descriptor, cdc_index_file_name, parse_segment_name, segment_file_name
from .segment_errors import CommitLogError, DescriptorError
from .segment_reader import Damage, DamageKind, Entry, SegmentReader
from .segment_writer import SegmentFull, SegmentWriter, write_cdc_index

__all__ = [
    "CommitLogError", "Damage", "DamageKind", "Descriptor", "DescriptorError", "Entry", "KeyStore", "Mutation",
    "MutationSerializer", "SegmentFull", "SegmentReader", "SegmentWriter", "cdc_index_file_name",
    "parse_segment_name", "segment_file_name", "write_cdc_index",
]
