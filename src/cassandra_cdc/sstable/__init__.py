"""Pure-Python reader of Cassandra SSTables: formats ``ma``-``me``, ``na``-``nc``, ``oa`` (big) and ``da`` (bti).

Reading a table's existing rows::

    sstable = SSTable("data/shop/orders-1b2c.../nb-7-big-Data.db")     # or the directory holding it
    for update in sstable.partitions(schema.table("shop", "orders")):  # PartitionUpdate, as the commit log's
        ...

Data.db is streamed chunk by chunk (LZ4, Snappy, Deflate, Zstd or uncompressed), every chunk's CRC32
checked, and the whole file's Digest.crc32 when read whole. Values are decoded with the column types
Statistics.db records, so SSTables written before a schema change read correctly; without a schema,
:meth:`SSTable.table_from_header` names the columns from Statistics.db alone. :meth:`SSTable.chunk_ranges`
splits one SSTable into ranges of partitions (found through Index.db or Partitions.db) for parallel tasks.
"""

from .compression import CompressionInfo
from .sstable_descriptor import Descriptor, Version
from .sstable_errors import ChecksumError, SSTableError, UnsupportedSSTableError
from .metadata import HeaderComponent, SSTableMetadata, StatsMetadata, ValidationMetadata
from .sstable_reader import DataRange, SSTable, SSTableReadStats, find_sstables
from .header_table import table_from_header

__all__ = [
    "ChecksumError", "CompressionInfo", "DataRange", "Descriptor", "HeaderComponent", "SSTable", "SSTableError",
    "SSTableMetadata", "SSTableReadStats", "StatsMetadata", "UnsupportedSSTableError", "ValidationMetadata",
    "Version", "find_sstables", "table_from_header",
]
