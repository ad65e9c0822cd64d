"""``cassandra-cdc demo`` on the real thing: three Apache Cassandra nodes (5.0, or 4.1 or 4.0 with
``cassandra_version``) and an Apache Kafka broker.

The nodes (127.0.0.1-3, RF=3, ``cdc = true`` tables) and the KRaft broker are started from the JVM
artifacts ``make install`` fetched (:mod:`cassandra_cdc.localcluster`), each announced as it starts and
when it is up. The agents read each node's real ``cdc_raw`` (their schema from the node, by CQL), the
pipeline reads the raw topic with Spark's own Kafka source (the connector ``make install`` fetched). The workload is the real end-to-end test's
(:mod:`.cql_workload`), round after round on new keys, through cassandra-driver at CONSISTENCY ALL at a
steady rate. Once writing ends and the TTLs have passed, every table's events replayed must equal
``SELECT *`` at CONSISTENCY ALL, with no event read twice. With ``chaos``, agents, the pipeline, the
broker and the nodes are killed and restarted while it writes (:mod:`.chaos`), and the check is the same.
With ``spark_cluster``, the pipeline's driver sends its work to a Spark standalone cluster on this machine
(a master and ``SPARK_WORKERS`` workers of one core each) instead of running it in ``local[2]``; chaos then
kills Spark workers too.
"""

from __future__ import annotations

import collections
import contextlib
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from ..localcluster import CassandraCluster, CassandraNode, JvmError, KafkaBroker, SparkStandaloneCluster
from ..localcluster.artifacts import spark_kafka_jars
from .chaos import SUPERVISOR_PAUSE_SECONDS, FaultInjector, Target, child_target
from .cql_workload import (CDC_TABLES, DEFAULT_TTL, NON_CDC_TABLE, SHORT_TTL, Workload, key_columns,
                           schema_statements, table_rows)
from .runner import VIEW_SECONDS, DemoBase, DemoError, DemoOptions, _StoppedEarly
from .table_check import CheckResult, compare_rows
from .view import NodeStatus, View

KEYSPACE = "cdc_demo"
NODES = 3
DEFAULT_RATE = 50.0  # statements per second: three nodes at CONSISTENCY ALL beside Spark on two cores
CATCH_UP_POLL_SECONDS = 3.0  # each comparison reads every table at CONSISTENCY ALL
KEYS_PER_ROUND = 1000  # each round of the workload writes keys of its own
TRUNCATING_ROUND = 2  # the round that begins with a TRUNCATE of ``collections``: rows before it and after it
SPARK_WORKERS = 2
# Each worker runs one executor of one core for the pipeline: the least that keeps a worker's kill from
# stopping the query (the other executor goes on), on two cores shared with the nodes and the broker.
SPARK_EXECUTOR = {"spark.executor.cores": "1", "spark.executor.memory": "512m",
                  "spark.cores.max": str(SPARK_WORKERS)}


class _WritingOver(Exception):
    """The duration has passed or Ctrl-C: stop writing, wherever the round is."""


class _PacedWorkload(Workload):
    """The shared workload, each statement let through by ``pace`` first."""

    def __init__(self, session: Any, keyspace: str, cassandra_version: str,
                 pace: Callable[[str], None]) -> None:
        super().__init__(session, keyspace, cassandra_version)
        self._pace = pace

    def __call__(self, cql: str, *values: Any, timeout: float | None = None) -> Any:
        self._pace(cql)
        return super().__call__(cql, *values, timeout=timeout)


def _table_of(cql: str) -> str:
    """The first ``keyspace.table`` a statement names."""
    words = cql.replace("(", " ").split()
    return next((word for word in words if word.startswith(f"{KEYSPACE}.")), "")


class RealDemo(DemoBase):
    """The demo on a real 3-node Cassandra 5.0 cluster and a real Kafka broker."""

    cdc_tables = tuple(f"{KEYSPACE}.{table}" for table in CDC_TABLES)
    non_cdc_table = f"{KEYSPACE}.{NON_CDC_TABLE}"
    what_the_check_compares = "SELECT * at CONSISTENCY ALL on the real cluster"
    catch_up_poll_seconds = CATCH_UP_POLL_SECONDS

    def __init__(self, options: DemoOptions, console: Console | None = None) -> None:
        super().__init__(options, console)
        status = self.status
        status.about = (f"{NODES} real Cassandra 5.0 nodes (RF=3) write commit logs to cdc_raw → {NODES} "
                        "agents publish raw records to a real Kafka broker ({broker}) → the Spark pipeline "
                        + (f"(on a standalone cluster of {SPARK_WORKERS} workers) " if options.spark_cluster
                           else "")
                        + f"merges the replicas → one event per change on {self.server}.{KEYSPACE}.<table>")
        status.tables = (*self.cdc_tables, self.non_cdc_table)
        status.cdc_tables = self.cdc_tables
        status.schema_plan = None
        status.tail_topic = f"{self.server}.{KEYSPACE}.rows"
        status.other_topics = f"{self.server}.raw, {self.server}, {self.server}.errors"
        self.kafka: KafkaBroker | None = None
        self.cluster: CassandraCluster | None = None
        self.spark: SparkStandaloneCluster | None = None
        self._driver = contextlib.ExitStack()
        self.session: Any = None
        self._segments_seen: set[tuple[str, str]] = set()
        self._row_counts: dict[str, int] = {}
        self.failed_statements = 0

    # --- starting -----------------------------------------------------------------------------------

    def _progress(self, line: str) -> None:
        self.console.print(f"[{self.status.elapsed:5.0f} s] {line}", highlight=False)
        if self.stop.requested.is_set() and self.status.phase == "starting":
            raise _StoppedEarly()  # between two nodes starting (stopping goes on to the end)

    def _start_systems(self) -> None:
        started = time.monotonic()
        # Any free port: a fixed one would be taken, or answered, by another broker on a shared machine.
        self.kafka = KafkaBroker(self.workdir / "kafka", progress=self._progress)
        self.kafka.start()
        self.cluster = CassandraCluster(self.workdir / "cassandra", nodes=NODES, progress=self._progress,
                                        version=self.options.cassandra_version)
        self.cluster.start()
        self._progress(f"Kafka and {NODES} Cassandra {self.options.cassandra_version} nodes up in "
                       f"{time.monotonic() - started:.0f} s")
        if self.options.spark_cluster:
            self.spark = SparkStandaloneCluster(
                self.workdir / "spark", workers=SPARK_WORKERS, worker_cores=1,
                worker_memory=SPARK_EXECUTOR["spark.executor.memory"], progress=self._progress,
                startup_timeout=self.options.recovery_timeout)
            self.spark.start()
        self.bootstrap_servers = self.kafka.bootstrap_servers
        self.nodes = [(node.address, node.cdc_raw_dir) for node in self.cluster.nodes]
        self.status.nodes = [NodeStatus(node.address) for node in self.cluster.nodes]
        from cassandra import ConsistencyLevel
        from cassandra.cluster import EXEC_PROFILE_DEFAULT

        driver = self._driver.enter_context(self.cluster.driver())
        self.session = driver.connect()
        self.session.get_execution_profile(EXEC_PROFILE_DEFAULT).consistency_level = ConsistencyLevel.ALL
        for cql in schema_statements(KEYSPACE, self.options.cassandra_version):
            self.session.execute(cql)
        if not driver.control_connection.wait_for_schema_agreement(wait_time=60):
            raise DemoError(f"the nodes did not agree on the schema of {KEYSPACE} within 60 s")
        self._progress(f"keyspace {KEYSPACE} (RF=3): tables {', '.join(CDC_TABLES)} with cdc = true, "
                       f"{NON_CDC_TABLE} without")

    def _agent_schema(self, index: int) -> dict[str, Any]:
        assert self.cluster is not None
        node = self.cluster.nodes[index]
        return {"cassandra": {"contact_points": [node.address], "port": node.native_port}}

    def _pipeline_settings(self) -> dict[str, Any]:
        """Spark's own Kafka source, with the connector ``make install`` fetched."""
        import pyspark

        settings = super()._pipeline_settings()
        jars = spark_kafka_jars(Path(pyspark.__file__).parent / "jars")
        settings["kafka"]["source"] = "kafka"
        settings["spark"]["conf"] = {"spark.jars": ",".join(map(str, jars))}
        if self.spark is not None:
            settings["spark"]["master"] = self.spark.master_url
            # The executors connect back to the driver, on this machine.
            settings["spark"]["conf"].update(SPARK_EXECUTOR, **{"spark.driver.host": "127.0.0.1",
                                                                "spark.driver.bindAddress": "127.0.0.1"})
        return settings

    def _key_columns(self) -> dict[str, list[str]]:
        return {f"{KEYSPACE}.{table}": key_columns(self.session, KEYSPACE, table) for table in CDC_TABLES}

    # --- writing ------------------------------------------------------------------------------------

    def _write(self, view: View) -> None:
        """Rounds of the workload, each on keys of its own, at ``rate`` statements per second."""
        from cassandra import OperationTimedOut, RequestExecutionException
        from cassandra.cluster import NoHostAvailable

        options, status = self.options, self.status
        status.phase = "writing"
        started = time.monotonic()
        status.writing_started_at = started
        if options.chaos:
            self._start_chaos(view)
        next_at = started
        next_view = started
        recent: collections.deque[float] = collections.deque()

        def pace(cql: str) -> None:
            nonlocal next_at, next_view
            now = time.monotonic()
            if (self.stop.requested.is_set() or (options.duration is not None
                                                 and now - started >= options.duration)
                    or (self.chaos is not None and self.chaos.finished)):
                raise _WritingOver()
            # A steady rate: time lost to a stall (a busy machine) is not made up with a burst.
            next_at = max(next_at, now - 1.0) + 1 / options.rate
            time.sleep(max(0.0, next_at - now))
            status.statements[_table_of(cql)] += 1
            status.statements_total += 1
            recent.append(now)
            while recent and recent[0] < now - 5:
                recent.popleft()
            status.writes_per_second = len(recent) / min(5.0, max(now - started, 1.0))
            if now >= next_view:
                self._check_children()
                self._refresh_status()
                view.update()
                next_view = now + VIEW_SECONDS

        workload = _PacedWorkload(self.session, KEYSPACE, self.options.cassandra_version, pace)
        number = 0
        try:
            while True:
                try:
                    self._round(workload, number)
                except (OperationTimedOut, RequestExecutionException, NoHostAvailable) as error:
                    # A statement timed out on a busy machine, or too few replicas were up (a node down, or
                    # --chaos killed it): what the cluster holds is still the truth.
                    self.failed_statements += 1
                    status.note = f"{self.failed_statements} statements failed, the last: {error}"
                number += 1
        except _WritingOver:
            pass

    def _start_chaos(self, view: View) -> None:
        assert self.kafka is not None and self.cluster is not None and self.pipeline is not None
        kafka, timeout = self.kafka, self.options.recovery_timeout

        def report(line: str) -> None:
            view.message(f"[{self.status.elapsed:5.0f} s] {line}")

        targets = [
            *(child_target("agent", agent, report, timeout, self.stopping) for agent in self.agents),
            child_target("pipeline", self.pipeline, report, timeout, self.stopping),
            Target("kafka", f"Kafka broker {kafka.bootstrap_servers}", kafka.kill, kafka.start),
            *(Target("cassandra", f"Cassandra node {node.address}", node.kill,
                     lambda node=node: _start_supervised(node, report, timeout))
              for node in self.cluster.nodes),
        ]
        if self.spark is not None:
            spark = self.spark
            targets += [Target("spark worker", f"Spark {worker.name}", worker.kill,
                               lambda worker=worker: spark.start_worker(worker)) for worker in spark.workers]
        self.chaos = FaultInjector(targets, self.options.fault_interval, self.options.seed,
                                   report, limit=self.options.faults)
        view.message(f"[{self.status.elapsed:5.0f} s] chaos: a process killed (kill -9) and restarted every "
                     f"{self.options.fault_interval:.0f} s while writing; seed {self.options.seed} (--seed "
                     f"{self.options.seed} repeats the sequence)")
        self.chaos.start()

    @staticmethod
    def _round(workload: Workload, number: int) -> None:
        base = number * KEYS_PER_ROUND
        workload.rows_table(base, 2)
        workload.out_of_order(base + 50)
        if number == TRUNCATING_ROUND:
            workload.truncate_collections(reinserted=base - KEYS_PER_ROUND)  # a key of the round before
        workload.collections(base, 2)
        workload.nested(base, 2)
        workload.counters(base, 2)
        workload.types(number % 200, 1)  # its values are built from the key: keep it small
        workload.batches_and_lwt(base + 200)
        workload.others(base, 1)

    def _after_writing(self, view: View) -> float:
        if self.chaos is not None:
            recovering = self.chaos.current
            view.message(f"[{self.status.elapsed:5.0f} s] chaos: no more faults"
                         + (f"; waiting for what is down to recover: {recovering}" if recovering else ""))
            if not self.chaos.stop_injecting(self.options.recovery_timeout):
                raise DemoError(f"a process killed by the fault injector was not ready again within "
                                f"{self.options.recovery_timeout:.0f} s: {self.chaos.current}")
            self._check_children()
        return time.time() + max(SHORT_TTL, DEFAULT_TTL) + 1

    # --- what the tables hold -----------------------------------------------------------------------

    def _refresh_tables(self) -> None:
        for node_id, cdc_raw in self.nodes:
            self._segments_seen.update((node_id, path.name) for path in cdc_raw.glob("CommitLog-*.log"))
        self.status.segments_written = len(self._segments_seen)
        self.status.model_rows.update(self._row_counts)

    def _table_differences(self) -> dict[str, list[str]]:
        assert self.feed is not None
        differences = {}
        for table in CDC_TABLES:
            name = f"{KEYSPACE}.{table}"
            columns, expected = table_rows(self.session, KEYSPACE, table)
            self._row_counts[name] = len(expected)
            problems = compare_rows(self.feed.rows(name), expected, columns)
            if problems:
                differences[name] = problems
        return differences

    def _expected_rows(self, table: str) -> int:
        return self._row_counts[table]

    def _extra_checks(self, result: CheckResult) -> None:
        if self.failed_statements:
            result.ok(f"{self.failed_statements:,} statements failed (timed out, or too few replicas up), each "
                      "ending its round; the tables hold what the cluster took, and the events match them")

    def _stop_systems(self) -> None:
        self._driver.close()
        for system in (self.spark, self.cluster, self.kafka):
            if system is None:
                continue
            try:
                system.stop()
            except JvmError as error:
                self.console.print(f"[yellow]warning:[/] stopping {type(system).__name__}: {error}",
                                   highlight=False)


def _start_supervised(node: CassandraNode, report: Callable[[str], None], timeout: float) -> None:
    """Start a killed node again, and again if it exits while starting, as a supervisor would: a node whose
    seed is down too (killed meanwhile) gives up with "Unable to gossip with any peers"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            node.start(max(1.0, deadline - time.monotonic()))
            return
        except JvmError as error:
            if time.monotonic() >= deadline:
                raise
            report(f"chaos: {str(error).splitlines()[0]}; starting it again (its log: {node.system_log})")
            time.sleep(SUPERVISOR_PAUSE_SECONDS)


def run_real_demo(options: DemoOptions, console: Console | None = None) -> int:
    """Run the demo on real Cassandra and Kafka; return the exit status (1: it failed or its check did)."""
    return RealDemo(options, console).run()


__all__ = ["DEFAULT_RATE", "RealDemo", "run_real_demo"]
