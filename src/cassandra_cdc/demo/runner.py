"""The demo's lifecycle: broker, agents, pipeline, the workload in the foreground, the final check, cleanup.

Nothing here does the work of a component: the agents and the pipeline are ``cassandra-cdc agent`` and
``cassandra-cdc pipeline`` processes reading the YAML files written to the work directory, exactly as an
operator would run them; the demo only writes those files, drives the cluster, and watches.
``DemoBase`` is that lifecycle; ``SimulatedDemo`` runs it on the simulated cluster (below), and
``real_runner.RealDemo`` on real Cassandra and Kafka.

The simulated demo's timeline: start the broker, the agents (they create the topics), the pipeline; once Spark runs the query,
write statements at ``rate`` per second (a commit log sync every 100 ms, small segments so that they
roll over); at ``alter_at`` seconds of writing, change the schema (the schema file first, then,
``SCHEMA_GRACE_SECONDS`` later, the nodes write the new column); after ``duration`` seconds of writing or
Ctrl-C, stop writing, shut the nodes down (segments COMPLETED), wait for the last TTLs to expire and the
events to catch up with the tables, check, stop everything, remove the work directory. A second Ctrl-C
skips the waiting and the check.
"""

from __future__ import annotations

import collections
import logging
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from rich.console import Console

from ..agent.segment_status import segment_statuses
from ..kafka import event_topic
from ..schema import Schema, load_schema_files
from ..localcluster import JvmError
from ..simulator import BrokerError, Clock, Cluster, EmbeddedBroker, Workload
from .table_check import CheckResult, compare_rows, normalized
from .chaos import RECOVERY_TIMEOUT, FaultInjector
from .feed import EventFeed
from .processes import ChildProcess
from .view import DemoStatus, NodeStatus, View
from .demo_workload import (ADDED_COLUMN, ALTER_CQL, ALTERED_TABLE, CDC_TABLES, NON_CDC_TABLE, SCHEMA_CQL, SERVER,
                       TABLES)

log = logging.getLogger(__name__)

MARKER = ".cassandra-cdc-demo"  # marks a work directory the demo made (and may remove)
TICK_SECONDS = 0.1  # a commit log sync per tick (Cassandra's periodic sync defaults to 10 s; faster here)
VIEW_SECONDS = 0.25
STATUS_SECONDS = 1.0  # agents' positions and table row counts are read this often
TTL_SECONDS = (2, 8)  # TTL'd writes live this long
SCHEMA_GRACE_SECONDS = 2.0  # between updating the schema file and writing the new column
SCHEMA_ADOPTION_SECONDS = 5.0  # events written this long after the change must all carry the new column
RAW_TOPIC_TIMEOUT = 120.0
PIPELINE_START_TIMEOUT = 300.0
STALL_SECONDS = 120.0  # catching up ends early when events came, then none for this long
MISMATCHES_SHOWN = 8
DEFAULT_KAFKA_PORT = 9092


@dataclass
class DemoOptions:
    workdir: Path = Path("demo-data")
    duration: float | None = None  # seconds of writing; None: until Ctrl-C
    check: bool = False  # exit status 1 when the final check fails
    keep: bool = False  # keep the work directory
    rate: float = 200.0  # CQL statements per second
    seed: int = 1  # of the simulated workload, and of the faults with ``chaos``
    keys: int = 100  # partitions per table
    segment_size: int = 256 * 1024
    alter_at: float | None = None  # seconds into the writing; default: 40% of the duration, or 30 s
    catchup_timeout: float = 300.0
    live: bool | None = None  # rich live view; None: when the output is a terminal
    chaos: bool = False  # kill and restart the real system's processes while writing (demo.chaos)
    fault_interval: float = 20.0  # seconds between two faults
    faults: int | None = None  # with ``chaos``: stop writing once this many faults have recovered
    recovery_timeout: float = RECOVERY_TIMEOUT  # with ``chaos``: a killed process not ready by then fails
    spark_cluster: bool = False  # the pipeline on a local Spark standalone cluster, not local[2]
    cassandra_version: str = "5.0"  # of the real cluster's nodes: 5.0, 4.1 or 4.0

    @property
    def schema_change_at(self) -> float:
        if self.alter_at is not None:
            return self.alter_at
        return max(5.0, 0.4 * self.duration) if self.duration else 30.0


class DemoError(RuntimeError):
    """The demo could not run (a process died, the broker did not start); the message says why."""


class _StoppedEarly(Exception):
    """Ctrl-C before the writing started."""


@dataclass
class _SchemaChange:
    file_updated_at: float | None = None  # writing time (s) the schema file was changed
    applied_at: float | None = None  # writing time (s) the nodes started writing the new column
    applied_us: int | None = None  # the first write timestamp with the new definition


@dataclass
class _Stop:
    """Ctrl-C / SIGTERM: the first asks for a clean stop, the second for an immediate one."""

    requested: threading.Event = field(default_factory=threading.Event)
    urgent: threading.Event = field(default_factory=threading.Event)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.requested.is_set():
            self.urgent.set()
        self.requested.set()


class DemoBase:
    """What every demo does around its cluster: the work directory, the agents and the pipeline as
    processes, the event feed, the live view, catching up, the final check, stopping, cleaning up.

    A subclass starts its cluster and broker (``_start_systems``), writes (``_write``), says what the
    tables must hold (``_table_differences``, ``_expected_rows``) and stops them (``_stop_systems``).
    """

    server = SERVER
    cdc_tables: tuple[str, ...] = CDC_TABLES
    non_cdc_table = NON_CDC_TABLE
    what_the_check_compares = "the simulated tables"
    catch_up_poll_seconds = VIEW_SECONDS  # how often catching up compares the events with the tables
    # Spark gives a Python worker 10 s to start, which a busy machine can exceed; the pipeline then exits,
    # and resumes from its checkpoint when started again (as often as this, before the demo gives up).
    pipeline_restarts_allowed = 3

    def __init__(self, options: DemoOptions, console: Console | None = None) -> None:
        self.options = options
        self.console = console or Console()
        if not self.console.is_terminal:
            self.console.soft_wrap = True  # whole lines in logs and CI output, not wrapped at 80 columns
        self.workdir = options.workdir.resolve()
        self.status = DemoStatus(duration=options.duration, workdir=str(options.workdir))
        self.stop = _Stop()
        self.bootstrap_servers = ""
        self.nodes: list[tuple[str, Path]] = []  # (node id, cdc_raw directory) of each node
        self.agents: list[ChildProcess] = []
        self.pipeline: ChildProcess | None = None
        self.feed: EventFeed | None = None
        self.keep_reason = ""
        self.pipeline_restarts = 0
        self.chaos: FaultInjector | None = None  # started by a demo that injects faults
        self.stopping = threading.Event()  # set once the demo stops its children: none is started again
        self._status_at = 0.0

    # --- what a subclass provides -----------------------------------------------------------------

    def _start_systems(self) -> None:
        """Start the broker and the cluster; set ``bootstrap_servers``, ``nodes`` and ``status.nodes``."""
        raise NotImplementedError

    def _agent_schema(self, index: int) -> dict[str, Any]:
        """The ``schema`` section of the agent beside node ``index``."""
        raise NotImplementedError

    def _key_columns(self) -> dict[str, list[str]]:
        """Each CDC table's primary key columns."""
        raise NotImplementedError

    def _write(self, view: View) -> None:
        """Write until the duration has passed or Ctrl-C."""
        raise NotImplementedError

    def _after_writing(self, view: View) -> float:
        """Once writing has stopped; returns the time (``time.time()``) by which every TTL has passed."""
        raise NotImplementedError

    def _table_differences(self) -> dict[str, list[str]]:
        """By CDC table, the differences between its replayed events and what the table holds now."""
        raise NotImplementedError

    def _expected_rows(self, table: str) -> int:
        raise NotImplementedError

    def _refresh_tables(self) -> None:
        """Fill ``status.model_rows`` and ``status.segments_written``."""
        raise NotImplementedError

    def _extra_checks(self, result: CheckResult) -> None:
        """What the final check verifies beyond the tables, the table without CDC and the dead letters."""

    def _stop_systems(self) -> None:
        raise NotImplementedError

    # --- the whole run ----------------------------------------------------------------------------

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        result: CheckResult | None = None
        stopped_early = False
        try:
            self._prepare_workdir()
            self._start_systems()
            self.status.broker = self.bootstrap_servers
            self._start_agents()
            self._wait_for_raw_topic()
            self._start_pipeline()
            self.feed = EventFeed(self.bootstrap_servers, self.server, self._key_columns(),
                                  self._watched_column()).start()
            with View(self.console, self.status, self.options.live) as view:
                self._wait_for_pipeline(view)
                self._write(view)
                ttls_over = self._after_writing(view)
                result = self._catch_up(view, ttls_over)
        except _StoppedEarly:
            stopped_early = True
        except (DemoError, BrokerError, JvmError) as error:
            self.keep_reason = "the demo failed"
            what = "the Kafka-protocol broker: " if isinstance(error, BrokerError) else ""
            self.console.print(f"[bold red]error:[/] {what}{error}", highlight=False)
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.keep_reason:
            self._remove_workdir()
            return 1
        self._report(result)
        self._remove_workdir()
        if stopped_early:
            return 130  # as a shell reports a Ctrl-C
        if result is None or result.passed or not self.options.check:
            return 0
        return 1

    # --- setting up -------------------------------------------------------------------------------

    def _prepare_workdir(self) -> None:
        workdir = self.workdir
        if workdir.exists() and any(workdir.iterdir()):
            if not (workdir / MARKER).exists():
                raise DemoError(f"{workdir} exists and is not a demo work directory: choose another --workdir")
            EmbeddedBroker.stop_leftover(workdir / "broker")  # a demo killed before it could stop it
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / MARKER).write_text("made by cassandra-cdc demo; removed when it ends (unless --keep)\n")

    def _write_yaml(self, name: str, comment: str, settings: dict[str, Any]) -> Path:
        path = self.workdir / name
        path.write_text(f"# {comment}\n" + yaml.safe_dump(settings, sort_keys=False))
        return path

    def _watched_column(self) -> tuple[str, str] | None:
        """A (table, column) whose presence in events the feed tracks (a schema change)."""
        return None

    def _start_agents(self) -> None:
        for index, (node_id, cdc_raw) in enumerate(self.nodes):
            config = self._write_yaml(f"agent-{node_id}.yaml", f"the agent beside {node_id} "
                                      "(reference: docs/agent.md)", {
                "server": self.server,
                "node_id": node_id,
                "cdc_raw": str(cdc_raw),
                "state_dir": str(self.workdir / "agents" / node_id),
                "schema": self._agent_schema(index),
                "kafka": {"bootstrap_servers": self.bootstrap_servers, "raw_topic_partitions": 6},
                "cleanup": {"mode": "delete"},
                "metrics": {"port": 0},
            })
            agent = ChildProcess(f"agent {node_id}", ["agent", "--config", str(config)],
                                 self.workdir / "logs" / f"agent-{node_id}.log", ready_marker="tailing")
            self.agents.append(agent.start())
            self.status.commands.append(agent.command_line)

    def _wait_for_raw_topic(self) -> None:
        """The agents create the raw topic; the pipeline needs it to subscribe."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        deadline = time.monotonic() + RAW_TOPIC_TIMEOUT
        while not self._topic_exists(admin, f"{self.server}.raw"):
            self._check_children()
            if time.monotonic() > deadline:
                raise DemoError(f"the agents did not create {self.server}.raw within {RAW_TOPIC_TIMEOUT:.0f} s; "
                                f"see {self.workdir / 'logs'}")
            if self.stop.requested.is_set():
                raise _StoppedEarly()
            time.sleep(0.2)

    @staticmethod
    def _topic_exists(admin: AdminClient, topic: str) -> bool:
        try:
            return topic in admin.list_topics(timeout=10).topics
        except KafkaException:
            return False  # a busy broker: ask again

    def _pipeline_settings(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "checkpoint": str(self.workdir / "pipeline" / "checkpoint"),
            "kafka": {"bootstrap_servers": self.bootstrap_servers, "max_offsets_per_trigger": 5000,
                      "events_topic_partitions": 3},
            "spark": {"shuffle_partitions": 2, "trigger_interval": "500 milliseconds"},
        }

    def _start_pipeline(self) -> None:
        comment = "the Spark pipeline (reference: src/cassandra_cdc/pipeline/pipeline_config.py)"
        config = self._write_yaml("pipeline.yaml", comment, self._pipeline_settings())
        self.pipeline = ChildProcess("pipeline", ["pipeline", "--config", str(config)],
                                     self.workdir / "logs" / "pipeline.log", ready_marker="pipeline running")
        self.pipeline.start()
        self.status.commands.append(self.pipeline.command_line)

    # --- running ----------------------------------------------------------------------------------

    def _wait_for_pipeline(self, view: View) -> None:
        """Writing starts once Spark runs the query, so that events follow the writes from the first second."""
        assert self.pipeline is not None
        self.status.phase = "starting Spark"
        deadline = time.monotonic() + PIPELINE_START_TIMEOUT
        while not self.pipeline.ready:
            self._check_children()
            if self.stop.requested.is_set():
                raise _StoppedEarly()
            if time.monotonic() > deadline:
                raise DemoError(f"the pipeline did not start within {PIPELINE_START_TIMEOUT:.0f} s; the end of "
                                f"{self.pipeline.log_path}:\n{self.pipeline.log_tail()}")
            self._refresh_status()
            view.update()
            time.sleep(VIEW_SECONDS)
        view.message(f"[{self.status.elapsed:5.0f} s] the pipeline runs; the cluster starts writing "
                     f"{self.options.rate:.0f} statements/s")

    def _refresh_status(self, force: bool = False) -> None:
        status = self.status
        now = time.monotonic()
        if not force and now - self._status_at < STATUS_SECONDS:
            if self.feed is not None:
                status.feed = self.feed.snapshot()
            return
        self._status_at = now
        for (node_id, cdc_raw), agent, node_status in zip(self.nodes, self.agents, status.nodes):
            try:
                segments = segment_statuses(cdc_raw, self.workdir / "agents" / node_id)
            except (OSError, ValueError):
                continue  # a file replaced while being read: next time
            node_status.segments = len(segments)
            node_status.lag_bytes = sum(s.lag_bytes or 0 for s in segments)
            node_status.agent_state = agent.state
        status.pipeline_state = self.pipeline.state if self.pipeline else "not started"
        if self.chaos is not None:
            down = self.chaos.current
            status.chaos = self.chaos.summary() + (f"; now: {down}" if down else "")
        if self.feed is not None:
            status.feed = self.feed.snapshot()
            self._refresh_tables()
            for table in self.cdc_tables:
                status.replayed_rows[table] = len(self.feed.replayed[table].rows)

    def _check_children(self) -> None:
        if self.chaos is not None and self.chaos.error is not None:
            raise DemoError(str(self.chaos.error))
        for child in [*self.agents, *([self.pipeline] if self.pipeline else [])]:
            code = child.exit_code
            # Read after the exit code: the injector marks a child down before it kills it.
            if self.chaos is not None and child.name in self.chaos.down:
                continue  # killed on purpose: the fault injector starts it again
            restartable = child is self.pipeline and self.pipeline_restarts < self.pipeline_restart_limit
            if code is not None and restartable:
                self._restart_pipeline(code)
            elif code is not None:
                raise DemoError(f"{child.name} exited with status {code}; the end of {child.log_path}:\n"
                                f"{child.log_tail()}")
        if self.feed is not None and self.feed.error is not None:
            raise DemoError(f"reading the events failed: {self.feed.error}")

    @property
    def pipeline_restart_limit(self) -> int:
        """``pipeline_restarts_allowed``, plus one per broker kill of the fault injector: the pipeline can
        exit while the broker is down (its schema catalog's metadata request fails), which a long run of
        chaos would otherwise turn into a failed demo."""
        broker_kills = sum(fault.kind == "kafka" for fault in self.chaos.faults) if self.chaos else 0
        return self.pipeline_restarts_allowed + broker_kills

    def _restart_pipeline(self, code: int) -> None:
        """Start the pipeline again, as an operator would: its checkpoint says where it resumes."""
        assert self.pipeline is not None
        self.pipeline_restarts += 1
        lines = self.pipeline.log_tail(60).splitlines() or [""]
        reason = next((line for line in reversed(lines) if "Exception:" in line or "Error:" in line), lines[-1])
        self.console.print(f"[{self.status.elapsed:5.0f} s] the pipeline exited with status {code} "
                           f"({reason.strip()[:300]}); starting it again from its checkpoint (restart "
                           f"{self.pipeline_restarts} of at most {self.pipeline_restart_limit}; its log: "
                           f"{self.pipeline.log_path})", highlight=False)
        self.pipeline.start()

    # --- the end ----------------------------------------------------------------------------------

    def _catch_up(self, view: View, ttls_over: float) -> CheckResult | None:
        """Wait until the last TTLs have expired (``ttls_over``, a ``time.time()``) and the events replay
        into the tables; then check."""
        assert self.feed is not None
        if self.stop.urgent.is_set():
            return None
        self.status.phase = "catching up"
        self.status.writes_per_second = 0.0
        deadline = time.monotonic() + self.options.catchup_timeout
        view.message(f"[{self.status.elapsed:5.0f} s] stopped writing after {self.status.statements_total:,} "
                     "statements;"
                     f" waiting for the last TTLs to expire and the events to catch up "
                     f"(at most {self.options.catchup_timeout:.0f} s)")
        events, progressed_at = -1, time.monotonic()
        while not self.stop.urgent.is_set():
            self._check_children()
            self._refresh_status()
            view.update()
            if time.time() >= ttls_over and not self._table_differences():
                break
            snapshot = self.status.feed
            if snapshot is not None and snapshot.total != events:
                events, progressed_at = snapshot.total, time.monotonic()
            if time.monotonic() > deadline:
                view.message(f"the events did not catch up within {self.options.catchup_timeout:.0f} s")
                break
            if events > 0 and time.monotonic() - progressed_at > STALL_SECONDS:
                view.message(f"no new event for {STALL_SECONDS:.0f} s: the events will not catch up")
                break
            time.sleep(self.catch_up_poll_seconds)
        if self.stop.urgent.is_set():
            return None
        self.status.phase = "checking"
        self._refresh_status(force=True)
        return self._final_check()

    def _final_check(self) -> CheckResult:
        assert self.feed is not None
        result = CheckResult()
        snapshot = self.feed.snapshot()
        differences = self._table_differences()
        for table in self.cdc_tables:
            events = sum(n for (t, _), n in snapshot.counts.items() if t == table)
            rows = self._expected_rows(table)
            if table in differences:
                problems = differences[table]
                result.fail(f"{table}: {len(problems)} rows differ between the {events:,} events replayed "
                            f"and the table ({rows:,} rows); the first ones:\n    "
                            + "\n    ".join(problems[:MISMATCHES_SHOWN]))
            elif events == 0:
                result.fail(f"{table}: no events at all")
            else:
                result.ok(f"{table}: {events:,} events replay into exactly the table's {rows:,} rows")
        topics = AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(timeout=10).topics
        audit_topic = event_topic(self.server, self.non_cdc_table)
        statements = self.status.statements.get(self.non_cdc_table)
        if audit_topic in topics:
            result.fail(f"{self.non_cdc_table} has no cdc = true, yet the topic {audit_topic} exists")
        elif not statements:
            result.fail(f"{self.non_cdc_table}: the workload wrote nothing to it, so its absence proves "
                        "nothing")
        else:
            result.ok(f"{self.non_cdc_table} (no CDC): {statements:,} statements, no topic, no events")
        self._extra_checks(result)
        if self.chaos is not None:
            result.ok(self.chaos.summary())
        if self.pipeline_restarts:
            result.ok(f"the pipeline exited {self.pipeline_restarts} times and resumed from its checkpoint")
        if self.feed.duplicates:
            result.fail(f"{self.feed.duplicates} events read twice; the first:\n    "
                        + "\n    ".join(self.feed.duplicate_samples))
        else:
            result.ok(f"no event read twice (of {snapshot.total:,})")
        if snapshot.dead_letters:
            result.fail(f"{snapshot.dead_letters} dead letters on {self.server}.errors; the first:\n    "
                        + "\n    ".join(self.feed.dead_letter_samples[:3]))
        else:
            result.ok(f"no dead letters on {self.server}.errors")
        return result

    def _shutdown(self) -> None:
        """Stop what was started, newest first: event reader, pipeline, agents, then cluster and broker."""
        self.status.phase = "stopping"
        self.stopping.set()
        if self.chaos is not None and not self.chaos.stop_injecting(self.options.recovery_timeout):
            log.warning("a process killed by the fault injector did not recover before stopping")
        if self.feed is not None:
            self.feed.stop()
        if self.pipeline is not None:
            # Ctrl-C is the pipeline's clean stop (the streaming query is stopped, the checkpoint consistent).
            code = self.pipeline.stop(signal.SIGINT, timeout=60)
            if code not in (0, None, -signal.SIGINT):
                log.debug("the pipeline exited with %s", code)
        for agent in self.agents:
            agent.send(signal.SIGTERM)  # all at once: each finishes its deliveries (up to 30 s)
        for agent in self.agents:
            agent.stop(signal.SIGTERM, timeout=40)
        self._stop_systems()
        if self.chaos is not None:
            self.chaos.close()

    def _report(self, result: CheckResult | None) -> None:
        console = self.console
        if result is None:
            console.print("stopped without the final check", highlight=False)
            return
        for line in result.passed_lines:
            console.print(f"[green]✓[/] {line}", highlight=False)
        for line in result.failures:
            console.print(f"[red]✗[/] {line}", highlight=False)
        if result.passed:
            console.print(f"[bold green]check passed[/]: the events replayed equal "
                          f"{self.what_the_check_compares}", highlight=False)
        else:
            self.keep_reason = "the check failed"
            console.print("[bold red]check FAILED[/]", highlight=False)

    def _remove_workdir(self) -> None:
        if not (self.workdir / MARKER).exists():
            return  # not made by this demo (it refused to start there)
        if self.options.keep or self.keep_reason:
            why = "--keep" if self.options.keep else self.keep_reason
            self.console.print(f"kept {self.options.workdir} ({why}): configurations, logs in logs/, cdc_raw, "
                               f"checkpoint", highlight=False)
            return
        shutil.rmtree(self.workdir, ignore_errors=True)


class SimulatedDemo(DemoBase):
    """The demo on a simulated 3-node Cassandra 4.1 cluster and an embedded Kafka-protocol broker."""

    def __init__(self, options: DemoOptions, console: Console | None = None) -> None:
        super().__init__(options, console)
        self.broker: EmbeddedBroker | None = None
        self.schema_change = _SchemaChange()

    def _start_systems(self) -> None:
        options = self.options
        self.schema = load_schema_files([self._write_schema()])
        self.broker = EmbeddedBroker(self.workdir / "broker", port=_default_port()).start()
        self.bootstrap_servers = self.broker.bootstrap_servers
        self.clock = Clock()
        self.cluster = Cluster(self.workdir / "cluster", self.schema, nodes=3, rf=3, cassandra_version="4.1",
                               seed=options.seed, shuffle=True, segment_size=options.segment_size)
        self.workload = Workload(self.schema, seed=options.seed, tables=list(TABLES), keys=options.keys,
                                 clock=self.clock, ttl_seconds=TTL_SECONDS)
        self.nodes = [(node.node_id, node.cdc_raw_dir) for node in self.cluster.nodes]
        self.status.nodes = [NodeStatus(node.node_id) for node in self.cluster.nodes]

    def _write_schema(self, extra: str = "") -> Path:
        path = self.workdir / "schema.cql"
        temp = path.with_suffix(".tmp")
        temp.write_text(SCHEMA_CQL + extra)
        temp.replace(path)  # the agents never read a half-written file
        return path

    def _agent_schema(self, index: int) -> dict[str, Any]:
        return {"file": str(self.workdir / "schema.cql")}

    def _key_columns(self) -> dict[str, list[str]]:
        return {t: [c.name for c in _table(self.schema, t).primary_key] for t in CDC_TABLES}

    def _watched_column(self) -> tuple[str, str] | None:
        return (ALTERED_TABLE, ADDED_COLUMN)

    def _write(self, view: View) -> None:
        """Statements at a steady rate, a sync every tick, the schema change on time; until the end or Ctrl-C."""
        options, cluster, workload, clock = self.options, self.cluster, self.workload, self.clock
        self.status.phase = "writing"
        started = time.monotonic()
        self.status.writing_started_at = started
        written = 0
        target = 0.0  # statements due so far
        last = started
        recent: collections.deque[tuple[float, int]] = collections.deque()
        next_view = 0.0
        while not self.stop.requested.is_set():
            now = time.monotonic()
            elapsed = now - started
            if options.duration is not None and elapsed >= options.duration:
                break
            # The coordinators' clock follows the wall clock (TTLs expire in real time), never going back.
            clock.set(max(clock.now_micros, time.time_ns() // 1000))
            # A steady rate: time lost to a stall (a busy machine) is not made up with a burst.
            target += options.rate * min(now - last, 2 * TICK_SECONDS)
            last = now
            due = max(0, int(target) - written)
            for _ in range(due):
                op = workload.next()
                cluster.execute(op)
                self.status.statements[op.table] += 1
            written += due
            self.status.statements_total = written
            cluster.sync_all()
            recent.append((now, due))
            while recent and recent[0][0] < now - 5:
                recent.popleft()
            self.status.writes_per_second = sum(n for _, n in recent) / min(5.0, max(elapsed, TICK_SECONDS))
            self._schema_change_step(elapsed, view)
            self._check_children()
            if now >= next_view:
                self._refresh_status()
                view.update()
                next_view = now + VIEW_SECONDS
            time.sleep(max(0.0, started + (int(elapsed / TICK_SECONDS) + 1) * TICK_SECONDS - time.monotonic()))

    def _schema_change_step(self, elapsed: float, view: View) -> None:
        change = self.schema_change
        if change.file_updated_at is None and elapsed >= self.options.schema_change_at:
            self._write_schema(ALTER_CQL)
            change.file_updated_at = elapsed
            self.status.schema_change = (f"{_statement(ALTER_CQL)} after {elapsed:.0f} s of writing: schema.cql "
                                         "updated")
            view.message(f"[{self.status.elapsed:5.0f} s] schema change: {_statement(ALTER_CQL)} (schema.cql updated; "
                         f"the nodes write the new column in {SCHEMA_GRACE_SECONDS:.0f} s)")
        elif (change.file_updated_at is not None and change.applied_at is None
              and elapsed >= change.file_updated_at + SCHEMA_GRACE_SECONDS):
            altered = load_schema_files([self.workdir / "schema.cql"])
            self.cluster.alter_schema(altered)
            self.workload.alter_schema(altered)
            change.applied_at = elapsed
            change.applied_us = self.clock.now_micros
            self.status.schema_change = (f"{_statement(ALTER_CQL)} after {change.file_updated_at:.0f} s of writing; "
                                         f"the nodes write {ADDED_COLUMN} since {elapsed:.0f} s")

    def _after_writing(self, view: View) -> float:
        self.status.phase = "shutting the nodes down"
        self.cluster.close_all()
        self._refresh_status(force=True)
        return self.clock.now_micros / 1e6 + TTL_SECONDS[1] + 1

    def _refresh_tables(self) -> None:
        self.status.segments_written = sum(node.segments_opened for node in self.cluster.nodes)
        seconds = int(time.time())
        for table in CDC_TABLES:
            self.status.model_rows[table] = len(self.cluster.rows(table, seconds))

    def _table_differences(self) -> dict[str, list[str]]:
        assert self.feed is not None
        now_seconds = int(time.time())
        differences = {}
        for table in CDC_TABLES:
            metadata = self.cluster.models[table].table
            expected = {k: normalized(v) for k, v in self.cluster.rows(table, now_seconds).items()}
            problems = compare_rows(self.feed.rows(table), expected, [c.name for c in metadata.columns])
            if problems:
                differences[table] = problems
        return differences

    def _expected_rows(self, table: str) -> int:
        return len(self.cluster.rows(table, int(time.time())))

    def _extra_checks(self, result: CheckResult) -> None:
        self._check_schema_change(result)

    def _check_schema_change(self, result: CheckResult) -> None:
        assert self.feed is not None
        change = self.schema_change
        if change.applied_us is None:
            result.ok(f"schema change: none (the demo stopped before {self.options.schema_change_at:.0f} s)")
            return
        cutoff = change.applied_us + int(SCHEMA_ADOPTION_SECONDS * 1e6)
        late = [ts for ts in self.feed.without_column_us if ts >= cutoff]
        early = [ts for ts in self.feed.without_column_us if change.applied_us <= ts < cutoff]
        if late:
            result.fail(f"{ALTERED_TABLE}: {len(late)} events of writes made more than {SCHEMA_ADOPTION_SECONDS:.0f} s "
                        f"after {_statement(ALTER_CQL)} lack the column {ADDED_COLUMN}")
        elif not self.feed.with_column_values:
            result.fail(f"{ALTERED_TABLE}: no event carries a value of {ADDED_COLUMN} after {_statement(ALTER_CQL)}")
        else:
            note = (f" ({len(early)} events of the first {SCHEMA_ADOPTION_SECONDS:.0f} s still had the old definition)"
                    if early else "")
            result.ok(f"{ALTERED_TABLE}: after {_statement(ALTER_CQL)}, events carry {ADDED_COLUMN} "
                      f"({self.feed.with_column_values:,} with a value){note}")

    def _stop_systems(self) -> None:
        if self.broker is not None:
            try:
                self.broker.stop()
            except BrokerError as error:
                self.console.print(f"[yellow]warning:[/] stopping the broker: {error}", highlight=False)


def _default_port() -> int | None:
    """Kafka's usual port when it is free (``cassandra-cdc tail`` finds the broker without options), else any."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", DEFAULT_KAFKA_PORT))
        except OSError:
            return None
    return DEFAULT_KAFKA_PORT


def _statement(cql: str) -> str:
    return cql.strip().rstrip(";")


def _table(schema: Schema, name: str) -> Any:
    keyspace, _, table = name.partition(".")
    found = schema.table(keyspace, table)
    assert found is not None, name
    return found


def run_demo(options: DemoOptions, console: Console | None = None) -> int:
    """Run the simulated demo; return the exit status (1: it failed, or --check and the check failed)."""
    return SimulatedDemo(options, console).run()


__all__ = ["DemoBase", "DemoError", "DemoOptions", "SimulatedDemo", "run_demo"]
