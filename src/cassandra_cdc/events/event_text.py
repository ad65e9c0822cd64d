"""Change events in a line of text: what the demo's view and ``cassandra-cdc tail`` print.

``u shop.orders id=7 line=1  qty 2→3, tags ["a"]→["a","b"]``: the operation, the table, the primary key,
then what changed (for ``c`` the columns the new row has, for ``u`` each column that changed, before →
after; a ``d`` of a TTL expiry says so).
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Mapping

MAX_VALUE_CHARS = 40
OP_NAMES = {"c": "create", "u": "update", "d": "delete", "r": "read"}


def value_text(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """A JSON value, compact, shortened to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def key_text(row: Mapping[str, Any] | None, key_columns: list[str] | None) -> str:
    if not row:
        return ""
    names = key_columns if key_columns is not None else list(row)
    return " ".join(f"{name}={value_text(row.get(name), 24)}" for name in names)


def changes_text(payload: Mapping[str, Any], key_columns: list[str] | None = None) -> str:
    """What an event changed: new columns (c, r), changed columns (u), nothing but why (d)."""
    op = payload.get("op")
    before, after = payload.get("before") or {}, payload.get("after") or {}
    keys = set(key_columns or ())
    if op == "d":
        source = payload.get("source") or {}
        return "(expired: TTL)" if source.get("node") is None and source.get("snapshot") != "true" else ""
    if op in ("c", "r"):
        return " ".join(f"{c}={value_text(v)}" for c, v in after.items() if c not in keys and v is not None)
    return ", ".join(f"{c} {value_text(before.get(c))}→{value_text(v)}" for c, v in after.items()
                     if c not in keys and before.get(c) != v)


def event_line(payload: Mapping[str, Any], key_columns: list[str] | None = None, *, with_time: bool = True) -> str:
    """One line for an event: [write time] op keyspace.table key  changes."""
    source = payload.get("source") or {}
    table = f"{source.get('keyspace')}.{source.get('table')}"
    row = payload.get("after") if payload.get("op") != "d" else payload.get("before")
    parts = []
    if with_time and source.get("ts_us") is not None:
        parts.append(micros_text(source["ts_us"]))
    parts += [str(payload.get("op")), table, key_text(row, key_columns)]
    changes = changes_text(payload, key_columns)
    return " ".join(p for p in parts if p) + (f"  {changes}" if changes else "")


def micros_text(micros: int) -> str:
    """A write time (microseconds since the epoch) as UTC ``HH:MM:SS.mmm``."""
    moment = datetime.datetime.fromtimestamp(micros / 1e6, datetime.timezone.utc)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
