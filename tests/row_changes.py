"""Checks on a sequence of row changes, shared by the merge tests."""

from __future__ import annotations

from typing import Any

from cassandra_cdc.merge.reconcile import RowChange


def assert_chain(changes: list[RowChange], final: dict[Any, dict[str, Any]]) -> None:
    """Replaying the changes from an empty table gives ``final``; each ``before`` is the replayed row."""
    replayed: dict[Any, dict[str, Any]] = {}
    for change in changes:
        assert change.before != change.after, change
        assert replayed.get(change.clustering) == change.before, change
        if change.after is None:
            del replayed[change.clustering]
        else:
            replayed[change.clustering] = change.after
    assert replayed == final
