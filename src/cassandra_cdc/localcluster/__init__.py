"""Real Apache Cassandra nodes, real Apache Kafka brokers and a Spark standalone cluster on loopback, for
tests and demos.

They run from the JVM artifacts ``make install`` fetches (see :mod:`.artifacts`); nothing is downloaded
at run time. :class:`CassandraCluster` starts N CDC-enabled Cassandra nodes (5.0, 4.1 or 4.0),
:class:`KafkaBroker` one KRaft-mode Kafka broker, :class:`KafkaCluster` several,
:class:`SparkStandaloneCluster` a Spark master and workers (from pyspark), :class:`SchemaRegistryServer` a
schema registry with the Confluent API, :class:`ConnectWorker` a Kafka Connect standalone worker with
Debezium's JDBC sink, :class:`PostgresServer` a PostgreSQL server for it to write into,
:class:`HdfsCluster` an HDFS NameNode and DataNode (a checkpoint on ``hdfs://``), :class:`S3Server` an S3
API server (a checkpoint on ``s3a://``).
"""

from .artifacts import MissingArtifacts, missing_reason
from .cassandra import CassandraCluster, CassandraNode, sstable_format
from .connect import ConnectWorker
from .hdfs import HdfsCluster
from .kafka import KafkaBroker, KafkaCluster
from .postgres import PostgresServer
from .process import JvmError
from .registry import SchemaRegistryServer
from .s3 import S3Server
from .spark import SparkStandaloneCluster, SparkWorker

__all__ = ["CassandraCluster", "CassandraNode", "ConnectWorker", "HdfsCluster", "JvmError", "KafkaBroker",
           "KafkaCluster", "MissingArtifacts", "PostgresServer", "S3Server", "SchemaRegistryServer",
           "SparkStandaloneCluster", "SparkWorker", "missing_reason", "sstable_format"]
