"""A simulated cluster: statements executed against N nodes, each writing its own commit log and cdc_raw.

A statement's mutation goes to every replica of its partition: all nodes when ``rf == nodes``, otherwise
the ``rf`` nodes that SimpleStrategy picks on a Murmur3 token ring of evenly spaced node tokens. With
``shuffle`` each replica receives mutations a few at a time in a random order, as real replicas do
(messages race; hints and repairs deliver late), so every node's commit log holds the same mutations in
its own order. Next to the files, the cluster keeps a ``TableModel`` per table: what the tables must
contain.
"""

from __future__ import annotations

import bisect
import random
from pathlib import Path
from typing import Any, Iterable

from cassandra.murmur3 import murmur3

from ..commitlog import Mutation
from ..schema import Schema, TableMetadata
from .model import TableModel
from .node import SimulatedNode
from .operations import CounterAdd, CounterLedger, Operation, partition_key_of, table_of, to_mutation

_TOKEN_MIN = -(1 << 63)
_RING_SIZE = 1 << 64


class Cluster:
    """``nodes`` SimulatedNodes under ``root/node1``, ``root/node2``, ...; ``node_options`` go to each node."""

    def __init__(self, root: str | Path, schema: Schema, nodes: int = 3, rf: int = 3,
                 cassandra_version: str = "4.1", *, seed: int = 0, shuffle: bool = False, shuffle_window: int = 4,
                 **node_options: Any) -> None:
        if not 1 <= rf <= nodes:
            raise ValueError(f"replication factor {rf} with {nodes} nodes")
        self.root = Path(root)
        self.schema = schema
        self.rf = rf
        self.nodes = [SimulatedNode(self.root / f"node{i}", f"node{i}", schema, cassandra_version, **node_options)
                      for i in range(1, nodes + 1)]
        # Node i owns the ring segment ending at its token (evenly spaced, like a balanced cluster).
        self._tokens = [_TOKEN_MIN + i * (_RING_SIZE // nodes) for i in range(nodes)]
        self.models = {table.qualified_name: TableModel(table) for table in schema}
        self.shuffle = shuffle
        self.shuffle_window = shuffle_window
        self._rng = random.Random(seed)
        self._in_flight: dict[str, list[Mutation]] = {node.node_id: [] for node in self.nodes}
        self._counters = CounterLedger()

    def alter_schema(self, schema: Schema) -> None:
        """A schema change (``ALTER TABLE ... ADD``) agreed by every node: later statements and mutations use
        the new definitions, and the models keep their data. Tables may be added, not removed."""
        for name, model in self.models.items():
            keyspace, _, table_name = name.partition(".")
            table = schema.table(keyspace, table_name)
            if table is None:
                raise ValueError(f"the new schema has no table {name}")
            model.alter(table)
        for table in schema:
            self.models.setdefault(table.qualified_name, TableModel(table))
        self.schema = schema
        for node in self.nodes:
            node.schema = schema

    def replicas(self, table: TableMetadata, partition_key: bytes) -> list[SimulatedNode]:
        """The nodes holding a partition: the first node whose token is >= the key's, and the next rf - 1."""
        if self.rf == len(self.nodes):
            return list(self.nodes)
        first = bisect.bisect_left(self._tokens, murmur3(partition_key)) % len(self.nodes)
        return [self.nodes[(first + i) % len(self.nodes)] for i in range(self.rf)]

    def execute(self, op: Operation) -> Mutation:
        """Run a statement: update the model and send its mutation to the replicas; return the mutation.

        A counter increment is led by a random replica, whose shard the mutation carries.
        """
        table = table_of(self.schema, op.table)
        replicas = self.replicas(table, partition_key_of(table, op.key))
        shard = None
        if isinstance(op, CounterAdd):
            leader = self._rng.choice(replicas)
            shard = self._counters.advance(table, op, leader.counter_id)
        mutation = to_mutation(op, self.schema, shard)
        self.models[table.qualified_name].apply(op)
        for node in replicas:
            self._deliver(node, mutation)
        return mutation

    def run(self, ops: Iterable[Operation], sync_every: int = 100) -> int:
        """Execute ``ops``, syncing every node's commit log after each ``sync_every`` of them; return the count."""
        count = 0
        for count, op in enumerate(ops, 1):
            self.execute(op)
            if count % sync_every == 0:
                self.sync_all()
        return count

    def deliver_all(self) -> None:
        """Write every mutation still in flight (shuffle mode) to its node."""
        for node in self.nodes:
            self._flush_in_flight(node)

    def sync_all(self) -> None:
        self.deliver_all()
        for node in self.nodes:
            node.sync()

    def close_all(self) -> None:
        """Shut every node down (after delivering what is in flight)."""
        self.deliver_all()
        for node in self.nodes:
            node.close()

    def rows(self, table: str, now_seconds: int) -> dict[tuple[Any, ...], dict[str, Any]]:
        """What ``SELECT * FROM table`` returns at ``now_seconds`` (see ``TableModel.rows``)."""
        return self.models[table].rows(now_seconds)

    def _deliver(self, node: SimulatedNode, mutation: Mutation) -> None:
        if not self.shuffle:
            node.write(mutation)
            return
        in_flight = self._in_flight[node.node_id]
        in_flight.append(mutation)
        # Batches of varying size, so that the nodes' orders differ from each other too.
        if len(in_flight) >= self._rng.randint(1, self.shuffle_window):
            self._flush_in_flight(node)

    def _flush_in_flight(self, node: SimulatedNode) -> None:
        in_flight = self._in_flight[node.node_id]
        self._rng.shuffle(in_flight)
        for mutation in in_flight:
            node.write(mutation)
        in_flight.clear()
