"""What the demo shows while it runs: a live terminal view (rich), or a summary line every few seconds.

The view reads a ``DemoStatus`` the runner fills in; it never touches the cluster, the processes or Kafka.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .feed import WINDOW_SECONDS, FeedSnapshot
from .demo_workload import ADDED_COLUMN, ALTER_CQL, ALTERED_TABLE, CDC_TABLES, TABLES

PLAIN_INTERVAL_SECONDS = 10.0
OP_STYLES = {"c": "green", "u": "yellow", "d": "red", "r": "cyan"}


@dataclass
class NodeStatus:
    node_id: str
    segments: int = 0  # segments in cdc_raw (not yet cleaned up by the agent)
    lag_bytes: int = 0  # durable in cdc_raw but not yet acknowledged by Kafka
    agent_state: str = "starting"


@dataclass
class DemoStatus:
    """Everything the view shows, updated by the runner."""

    phase: str = "starting"
    started_at: float = field(default_factory=time.monotonic)
    writing_started_at: float | None = None
    duration: float | None = None
    broker: str = ""
    workdir: str = ""
    commands: list[str] = field(default_factory=list)
    statements: collections.Counter[str] = field(default_factory=collections.Counter)
    statements_total: int = 0
    writes_per_second: float = 0.0
    segments_written: int = 0
    nodes: list[NodeStatus] = field(default_factory=list)
    pipeline_state: str = "starting"
    model_rows: dict[str, int] = field(default_factory=dict)
    replayed_rows: dict[str, int] = field(default_factory=dict)
    schema_change: str = ""  # what happened to the schema so far
    feed: FeedSnapshot | None = None
    note: str = ""
    chaos: str = ""  # the faults injected so far, and what is down now (demo --chaos)
    # What is shown (the simulated demo's unless a demo says otherwise).
    about: str = ("3 simulated Cassandra 4.1 nodes (RF=3) write commit logs to cdc_raw → 3 agents publish "
                  "raw records to Kafka ({broker}) → the Spark pipeline merges the replicas → one event per "
                  "change on demo.<keyspace>.<table>")
    tables: tuple[str, ...] = TABLES
    cdc_tables: tuple[str, ...] = CDC_TABLES
    schema_plan: str | None = f"later: {ALTER_CQL.strip().rstrip(';')}"  # None: no schema change
    tail_topic: str = "demo.shop.orders"
    other_topics: str = "demo.raw, demo, demo.errors"

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    @property
    def writing_elapsed(self) -> float:
        return 0.0 if self.writing_started_at is None else time.monotonic() - self.writing_started_at


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def tail_command(broker: str, topic: str) -> str:
    servers = "" if broker == "127.0.0.1:9092" else f" --bootstrap-servers {broker}"
    return f"cassandra-cdc tail {topic}{servers}"


def render(status: DemoStatus) -> Group:
    """One frame of the live view."""
    feed = status.feed
    counts = feed.counts if feed else {}
    clock = f"{status.writing_elapsed:.0f} s" + (f" of {status.duration:.0f} s" if status.duration else "")
    header = Text.assemble(
        ("cassandra-cdc demo", "bold"), "  ·  ", (status.phase, "bold cyan"), f"  ·  {status.elapsed:.0f} s",
        "  ·  writing: ", clock,
        "  ·  Ctrl-C stops (twice: at once)\n",
        (status.about.format(broker=status.broker), "dim"))

    tables = Table(expand=True, title="Tables", title_justify="left")
    tables.add_column("table")
    tables.add_column("CQL statements", justify="right")
    for op, name in (("c", "created"), ("u", "updated"), ("d", "deleted")):
        tables.add_column(f"{op}: {name}", justify="right", style=OP_STYLES[op])
    tables.add_column("events", justify="right")
    tables.add_column("rows: from events / in the table", justify="right")
    for table in status.tables:
        statements = f"{status.statements.get(table, 0):,}"
        if table not in status.cdc_tables:
            tables.add_row(f"{table} (no CDC)", statements, "", "", "", "no topic", "", style="dim")
            continue
        per_op = [counts.get((table, op), 0) for op in "cud"]
        rows = (f"{status.replayed_rows.get(table, 0):,} / {status.model_rows[table]:,}"
                if table in status.model_rows else "")
        name = table + (f" (+{ADDED_COLUMN})" if table == ALTERED_TABLE and status.schema_change else "")
        tables.add_row(name, statements, *(f"{n:,}" for n in per_op), f"{sum(per_op):,}", rows)

    tables.caption = ("Events are not statements: the 3 replicas' copies of a write merge into one event, a statement "
                      "that changes nothing visible makes none, and an expiring TTL makes one without any statement.")
    tables.caption_justify = "left"

    nodes = Table(title="Nodes and agents", title_justify="left")
    nodes.add_column("node")
    nodes.add_column("agent")
    nodes.add_column("segments in cdc_raw", justify="right")
    nodes.add_column("durable, not yet in Kafka", justify="right")
    for node in status.nodes:
        nodes.add_row(node.node_id, node.agent_state, str(node.segments), _size(node.lag_bytes))

    flow = Table.grid(padding=(0, 2))
    flow.add_column(style="bold")
    flow.add_column()
    flow.add_row("writes", f"{status.writes_per_second:,.0f} statements/s, each to 3 replicas; "
                           f"{status.statements_total:,} statements, {status.segments_written} commit log segments")
    if feed is not None:
        flow.add_row("pipeline", f"{status.pipeline_state}; {feed.events_per_second:,.0f} events/s; "
                                 f"write → event latency p50 {_seconds(feed.latency_p50)}, "
                                 f"max {_seconds(feed.latency_max)} (last {WINDOW_SECONDS:.0f} s); "
                                 f"dead letters {feed.dead_letters}")
    else:
        flow.add_row("pipeline", status.pipeline_state)
    if status.schema_change or status.schema_plan:
        flow.add_row("schema", status.schema_change or f"unchanged so far; {status.schema_plan}")
    if status.chaos:
        flow.add_row("chaos", status.chaos)

    recent = Table.grid(padding=(0, 1))
    for _ in range(4):
        recent.add_column(no_wrap=True, overflow="ellipsis")
    for event in reversed(feed.recent if feed else []):
        recent.add_row(Text(event.op, style=OP_STYLES.get(event.op, "")), event.table, event.key,
                       Text(event.changes, style="dim"))
    latest = Panel(recent, title="Latest events (op, table, primary key, what changed)", title_align="left")

    hint = Text(f"In another terminal: {tail_command(status.broker, status.tail_topic)}   "
                f"(or {status.other_topics})", style="dim")
    parts: list[Any] = [header, tables, nodes, flow, latest, hint]
    if status.note:
        parts.append(Text(status.note, style="bold"))
    return Group(*parts)


def summary_line(status: DemoStatus) -> str:
    """The plain-text view: one line, for logs and CI."""
    feed = status.feed
    counts = feed.counts if feed else {}
    per_table = " ".join(f"{t.split('.')[1]}={sum(counts.get((t, op), 0) for op in 'cudr')}"
                         for t in status.cdc_tables)
    lag = sum(n.lag_bytes for n in status.nodes)
    line = (f"[{status.elapsed:5.0f} s] {status.phase}: {status.statements_total:,} statements "
            f"({status.writes_per_second:.0f}/s) | agents {_size(lag)} behind | pipeline {status.pipeline_state}")
    if feed is not None:
        line += (f" | events {feed.total:,} ({feed.events_per_second:.0f}/s) {per_table} | latency p50 "
                 f"{_seconds(feed.latency_p50)} | dead letters {feed.dead_letters}")
    if status.chaos:
        line += f" | chaos: {status.chaos}"
    return line


class View:
    """The live view on a terminal, else summary lines every ``PLAIN_INTERVAL_SECONDS``."""

    def __init__(self, console: Console, status: DemoStatus, live: bool | None = None) -> None:
        self.console = console
        self.status = status
        self.live = console.is_terminal if live is None else live
        self._live: Live | None = None
        self._last_line = 0.0

    def __enter__(self) -> "View":
        if self.live:
            self._live = Live(render(self.status), console=self.console, auto_refresh=False)
            self._live.__enter__()
        else:
            self.console.print(f"cassandra-cdc demo: broker {self.status.broker}, work directory {self.status.workdir}")
            for command in self.status.commands:
                self.console.print(f"  started: {command}")
            self.console.print("  watch the events: "
                               f"{tail_command(self.status.broker, self.status.tail_topic)}")
        return self

    def update(self, force: bool = False) -> None:
        if self._live is not None:
            self._live.update(render(self.status), refresh=True)
        elif force or time.monotonic() - self._last_line >= PLAIN_INTERVAL_SECONDS:
            self._last_line = time.monotonic()
            self.console.print(summary_line(self.status), highlight=False, soft_wrap=True)

    def message(self, text: str) -> None:
        """A line outside the live area (an event of the demo: schema change, phase)."""
        self.console.print(text, highlight=False, soft_wrap=True)

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(render(self.status), refresh=True)
            self._live.__exit__(None, None, None)
            self._live = None
        else:
            self.update(force=True)


__all__ = ["DemoStatus", "NodeStatus", "View", "render", "summary_line"]
