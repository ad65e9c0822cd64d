"""A stand-in for a Cassandra cluster we cannot run: commit logs and ``cdc_raw`` written as real nodes
write them, from a realistic CQL workload, plus an independent model of what the tables must contain.

Typical use::

    cluster = Cluster(tmp / "cluster", schema, nodes=3, rf=3, cassandra_version="4.1")
    workload = Workload(schema, seed=1, keys=50)
    cluster.run(workload.take(1000), sync_every=100)
    cluster.close_all()
    expected = cluster.rows("ks.users", workload.clock.now_seconds)

and, for the Kafka side, ``EmbeddedBroker(tmp / "broker")`` (a ``noida-db`` broker).
"""

from .broker import BrokerError, EmbeddedBroker
from .cluster import Cluster
from .model import TableModel
from .node import COMMITLOG_VERSIONS, SimulatedNode
from .operations import (AddToSet, AppendToList, CounterAdd, CounterLedger, DeleteColumns, DeletePartition,
                         DeleteRange, DeleteRow, Insert, Operation, PutInMap, RemoveFromSet, RemoveMapKeys,
                         SetUdtFields, Update, list_cell_path, to_mutation)
from .workload import Clock, Workload

__all__ = [
    "AddToSet", "AppendToList", "BrokerError", "COMMITLOG_VERSIONS", "Clock", "Cluster", "CounterAdd",
    "CounterLedger", "DeleteColumns", "DeletePartition", "DeleteRange", "DeleteRow", "EmbeddedBroker", "Insert",
    "Operation", "PutInMap", "RemoveFromSet", "RemoveMapKeys", "SetUdtFields", "SimulatedNode", "TableModel",
    "Update", "Workload", "list_cell_path", "to_mutation",
]
