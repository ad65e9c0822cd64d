"""The final check: events replayed into tables, compared with what the tables must contain.

A consumer of the event topics rebuilds a table by keeping, per primary key, the latest ``after`` and
forgetting the key on a ``d``; a ``t`` (truncation) empties the table. That table must equal what ``SELECT
*`` returns, which the simulator's ``TableModel`` computes from the CQL statements alone, independently of
commit logs, agents and pipeline.
"""

from __future__ import annotations

import decimal
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

Row = dict[str, Any]
Key = tuple[Any, ...]


class ReplayedTable:
    """A table rebuilt from its change events, applied in topic order (per key, the order they were made)."""

    def __init__(self, key_columns: Sequence[str]) -> None:
        self.key_columns = tuple(key_columns)
        self.rows: dict[Key, Row] = {}
        self._written_ms: dict[Key, int] = {}  # per row, the time of the write its last event shows
        self.truncated_at_ms: int | None = None  # the newest truncation's time

    def apply(self, payload: Mapping[str, Any]) -> None:
        """Apply one event's payload (the envelope: ``before``, ``after``, ``op``, ``source``).

        A ``t`` has no key, so it is not ordered against the events of other partitions (docs/events.md,
        "TRUNCATE"): it is applied by write time, as the pipeline applied the truncation. It empties the table
        of the rows written before it, and events of writes before it, read after it, are left out.
        """
        op, written_ms = payload["op"], payload["source"]["ts_ms"]
        if op == "t":
            self.truncated_at_ms = max(written_ms, self.truncated_at_ms or written_ms)
            for key in [key for key, at in self._written_ms.items() if at <= written_ms]:
                del self.rows[key], self._written_ms[key]
            return
        if self.truncated_at_ms is not None and written_ms <= self.truncated_at_ms:
            return
        if op == "d":
            key = self.key_of(payload["before"])
            self.rows.pop(key, None)
            self._written_ms.pop(key, None)
        else:
            after = payload["after"]
            key = self.key_of(after)
            self.rows[key], self._written_ms[key] = after, written_ms

    def key_of(self, row: Mapping[str, Any]) -> Key:
        return tuple(row[c] for c in self.key_columns)


def replay(events: Iterable[tuple[str, Mapping[str, Any]]], topic: str, key_columns: Sequence[str]) -> dict[Key, Row]:
    """The table an event consumer rebuilds from ``(topic, payload)`` pairs: per primary key, the latest ``after``."""
    table = ReplayedTable(key_columns)
    for event_topic, payload in events:
        if event_topic == topic:
            table.apply(payload)
    return table.rows


def normalized(row: Mapping[str, Any]) -> Row:
    """Model values (what the DataStax driver decodes) in the shapes JSON events carry them (docs/events.md)."""
    return {name: _json_shape(value) for name, value in row.items()}


def _json_shape(value: Any) -> Any:
    if isinstance(value, (set, frozenset)) or type(value).__name__ == "SortedSet":
        return sorted(_json_shape(v) for v in value)
    if hasattr(value, "items"):
        return {k: _json_shape(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_json_shape(v) for v in value]
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    return value


def compare_rows(got: Mapping[Key, Mapping[str, Any]], expected: Mapping[Key, Mapping[str, Any]],
                 columns: Sequence[str]) -> list[str]:
    """The differences between replayed rows and expected rows, one readable line each, by key.

    A column missing from a replayed row counts as null: a row last changed before a column was added
    has no value for it in its events, and ``SELECT *`` shows it null.
    """
    problems = []
    for key in sorted(set(got) | set(expected), key=repr):
        if key not in got:
            problems.append(f"{_key_text(key)}: in the table, but no event made it "
                            f"(expected {_row_text(expected[key])})")
        elif key not in expected:
            problems.append(f"{_key_text(key)}: the events left {_row_text(got[key])}, but the table has no such row")
        else:
            differences = [f"{c}: events {got[key].get(c)!r}, table {expected[key].get(c)!r}"
                           for c in columns if got[key].get(c) != expected[key].get(c)]
            if differences:
                problems.append(f"{_key_text(key)}: " + "; ".join(differences))
    return problems


def _key_text(key: Key) -> str:
    return "(" + ", ".join(repr(v) for v in key) + ")"


def _row_text(row: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in row.items() if v is not None) + "}"


@dataclass
class CheckResult:
    """The outcome of the final check: what was verified, and every failure with its first differences."""

    passed_lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def ok(self, line: str) -> None:
        self.passed_lines.append(line)

    def fail(self, line: str) -> None:
        self.failures.append(line)


__all__ = ["CheckResult", "ReplayedTable", "compare_rows", "normalized", "replay"]
