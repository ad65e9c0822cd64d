"""What one write costs the pipeline's merge against the width of its partition (Python side only).

A table of time series (``pk int, ts bigint, v text, PRIMARY KEY (pk, ts)``): one partition holding ``N``
rows is in a state page as the pipeline keeps it (``PartitionPage``: the partition's merge state pickled, its
rows in leaves beside it once they outgrow one, in a map standing in for the state store's); then,
``--writes`` times, a row is written as the pipeline merges a record (an insert of a 40-byte value, appended
at the partition's end, or an update of a random existing row): the page gives the partition's state, the
write is merged, the page is sealed (the state and the leaves it changed pickled again) and written back.
Reported per width: the state's size, the time per write (load: unpickle, and read the leaves; merge; store:
pickle) and the bytes it writes. The JVM's side (the state server moving the values, RocksDB writing them)
comes on top and grows with those bytes: ``pipeline_throughput.py --rows-per-partition`` measures the whole
pipeline. Last, what a replica's copy of a write costs when it arrives after its page was stored (agents
lagging apart): the check of its digest, stored beside the state.

    python benchmarks/wide_partitions.py [--widths 100 1000 10000 100000 1000000] [--writes 50]
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cassandra_cdc.merge.reconcile import PartitionState, apply  # noqa: E402
from cassandra_cdc.merge.table_view import table_view  # noqa: E402
from cassandra_cdc.pipeline.change_processor import collector_paused  # noqa: E402
from cassandra_cdc.pipeline.group_state import PartitionPage  # noqa: E402
from cassandra_cdc.pipeline.row_nodes import RowNodes  # noqa: E402
from cassandra_cdc.pipeline.state_requests import MapStateRequests  # noqa: E402
from cassandra_cdc.schema import parse_schema  # noqa: E402
from cassandra_cdc.simulator import Insert, to_mutation  # noqa: E402

SCHEMA = parse_schema("CREATE TABLE bench.series (pk int, ts bigint, v text, PRIMARY KEY (pk, ts)) "
                      "WITH cdc = true;")
TABLE = SCHEMA.table("bench", "series")
TABLE_ORDER = table_view(TABLE).clustering_sort_key
VALUE = "v" * 40
NOW_SECONDS = 1_700_000_000
KEY = (1).to_bytes(4, "big")


class StateStore:
    """A ``MapState`` in memory, counting the bytes written to it."""

    def __init__(self) -> None:
        self.values: dict[tuple[object, ...], tuple[bytes]] = {}
        self.bytes_written = 0

    def getValue(self, key: tuple[object, ...]) -> tuple[bytes] | None:  # noqa: N802 (PySpark's name)
        return self.values.get(key)

    def updateValue(self, key: tuple[object, ...], value: tuple[bytes]) -> None:  # noqa: N802
        self.values[key] = value
        self.bytes_written += len(value[0])

    def removeKey(self, key: tuple[object, ...]) -> None:  # noqa: N802
        self.values.pop(key, None)


def write(ts: int, value: str = VALUE, timestamp: int = 0) -> object:
    """The partition update of one row written."""
    op = Insert("bench.series", {"pk": 1, "ts": ts, "v": value}, timestamp=1_700_000_000_000_000 + timestamp + ts)
    return to_mutation(op, SCHEMA).updates[0]


class Partition:
    """One partition of a page, stored as the pipeline stores it."""

    def __init__(self, width: int) -> None:
        self.store = StateStore()
        self.nodes = RowNodes(MapStateRequests(self.store, "rows"))
        self.page = PartitionPage({}, nodes=self.nodes)
        state = PartitionState()
        self.page.add(KEY, state)
        for ts in range(width):
            apply(state, write(ts), TABLE, NOW_SECONDS)  # type: ignore[arg-type]
            if ts % 10_000 == 9_999:  # stored as it grows, as batches do: no leaf held whole in memory
                state = self.stored_again().get(KEY)  # type: ignore[assignment]
        self.stored_again()

    def stored_again(self) -> PartitionPage:
        """The page written back and read by the next micro-batch."""
        value = self.page.dump()
        self.nodes.flush()
        self.page = PartitionPage.load(value, self.nodes)
        return self.page

    def state_bytes(self) -> int:
        return len(pickle.dumps(self.page.stored)) + sum(len(value[0]) for value in self.store.values.values())


def per_write(width: int, writes: int, kind: str) -> dict[str, float]:
    """Median milliseconds per row written (appended, or an existing one updated), by step, the bytes each
    write stores, and the state's size in MB."""
    partition = Partition(width)
    load, merge, store, written = [], [], [], []
    copy: list[float] = []
    rng = random.Random(width)
    with collector_paused():  # as the pipeline merges a batch
        for n in range(writes):
            ts = width + n if kind == "append" else rng.randrange(width)
            digest = (width + n).to_bytes(16, "big")
            before = partition.store.bytes_written
            measure(partition, write(ts, timestamp=width + n), digest, load, merge, store)
            page_bytes = len(partition.page.dump() or b"")
            partition.stored_again()
            written.append(partition.store.bytes_written - before + page_bytes)
            started = time.perf_counter()
            seen = partition.page.seen(KEY, digest)
            copy.append(time.perf_counter() - started)
            assert seen and not partition.page.changed
    steps = {"load": statistics.median(load), "merge": statistics.median(merge),
             "store": statistics.median(store)}
    return {"state_mb": partition.state_bytes() / 1e6, "write_ms": sum(steps.values()) * 1000,
            **{f"{step}_ms": seconds * 1000 for step, seconds in steps.items()},
            "written_kb": statistics.median(written) / 1e3, "copy_us": statistics.median(copy) * 1e6}


def measure(partition: Partition, update: object, digest: bytes, load: list[float], merge: list[float],
            store: list[float]) -> None:
    """One write's steps, timed (the leaf it needs read in its load)."""
    started = time.perf_counter()
    state = partition.page.get(KEY)
    assert state is not None
    state.rows.order = TABLE_ORDER
    state.rows.get(update.unfiltereds[0].clustering)  # type: ignore[attr-defined]
    loaded = time.perf_counter()
    apply(state, update, TABLE, NOW_SECONDS, digest)  # type: ignore[arg-type]
    merged = time.perf_counter()
    partition.page.seal()
    sealed = time.perf_counter()
    load.append(loaded - started)
    merge.append(merged - loaded)
    store.append(sealed - merged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--writes", type=int, default=50, help="rows written per width and kind (median reported)")
    args = parser.parse_args()
    print(f"{'write':>7} {'rows':>10} {'state MB':>9} {'per write':>10} {'load':>8} {'merge':>8} {'store':>8} "
          f"{'written':>9} {'late copy':>10}")
    for width in args.widths:
        for kind in ("append", "update"):
            figures = per_write(width, args.writes, kind)
            print(f"{kind:>7} {width:>10,} {figures['state_mb']:>9.2f} {figures['write_ms']:>8.2f}ms "
                  f"{figures['load_ms']:>6.2f}ms {figures['merge_ms']:>6.2f}ms {figures['store_ms']:>6.2f}ms "
                  f"{figures['written_kb']:>7.1f}KB {figures['copy_us']:>8.2f}µs", flush=True)


if __name__ == "__main__":
    main()
