"""The merged state of one row (or of a partition's static row), as ``merge.partition_state`` describes its
parts."""

from __future__ import annotations

from typing import Any, Iterator

Deletion = tuple[int, int]
CellState = tuple[int, int, int | None, bytes | None]
Liveness = tuple[int, int, int | None]
StoredRow = tuple[Any, ...]  # ``RowState.stored()``: the row as builtins, in its constructor's order


class RowState:
    """One row (or the static row): liveness, deletion, simple cells, complex columns, counters."""

    __slots__ = ("liveness", "deletion", "cells", "complex", "counters")

    def __init__(self, liveness: Liveness | None = None, deletion: Deletion | None = None,
                 cells: dict[str, CellState] | None = None, complex_: dict[str, list[Any]] | None = None,
                 counters: dict[str, list[Any]] | None = None) -> None:
        self.liveness = liveness
        self.deletion = deletion
        self.cells: dict[str, CellState] = cells or {}
        self.complex: dict[str, list[Any]] = complex_ or {}
        self.counters: dict[str, list[Any]] = counters or {}

    def __reduce__(self) -> tuple[Any, ...]:
        return RowState, self.stored()

    def stored(self) -> StoredRow:
        """The row as builtins only: ``RowState(*stored)`` makes it again."""
        return self.liveness, self.deletion, self.cells or None, self.complex or None, self.counters or None

    def is_empty(self) -> bool:
        return (self.liveness is None and self.deletion is None and not self.cells and not self.complex
                and not self.counters)

    def expiring(self) -> Iterator[tuple[int, int]]:
        """(ttl, expiry) of each expiring part: the liveness, cells and collection elements."""
        if self.liveness is not None and self.liveness[2] is not None:
            yield self.liveness[1], self.liveness[2]
        for _, ttl, ldt, value in self.cells.values():
            if ttl and value is not None:
                yield ttl, ldt  # type: ignore[misc]
        for _, elements in self.complex.values():
            for _, ttl, ldt, value in elements.values():
                if ttl and value is not None:
                    yield ttl, ldt  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowState) and self.stored() == other.stored()

    def __repr__(self) -> str:
        return (f"RowState(liveness={self.liveness}, deletion={self.deletion}, cells={self.cells}, "
                f"complex={self.complex}, counters={self.counters})")
