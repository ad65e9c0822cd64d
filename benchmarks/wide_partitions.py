"""What one write costs the pipeline's merge against the width of its partition (Python side only).

A table of time series (``pk int, ts bigint, v text, PRIMARY KEY (pk, ts)``): one partition holding ``N``
rows is in a state page as the pipeline keeps it (``PartitionPage``: the partition's merge state pickled);
then, ``--writes`` times, one row is appended (an insert of a 40-byte value) as the pipeline merges a record:
the page gives the partition's state, the insert is merged, the page is sealed (the state pickled again).
Reported per width: the state's size and the time per write, split into load (unpickle), merge and store
(pickle). The JVM's side (the state server moving the page, RocksDB writing it) comes on top and grows with
the same bytes: ``pipeline_throughput.py --rows-per-partition`` measures the whole pipeline. Last, what a
replica's copy of a write costs when it arrives after its page was stored (agents lagging apart): the check
of its digest, stored beside the state (before, the state was loaded, and stored again with the page).

    python benchmarks/wide_partitions.py [--widths 100 1000 10000 50000] [--writes 50]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cassandra_cdc.merge.reconcile import PartitionState, apply  # noqa: E402
from cassandra_cdc.pipeline.change_processor import PartitionPage, collector_paused  # noqa: E402
from cassandra_cdc.schema import parse_schema  # noqa: E402
from cassandra_cdc.simulator import Insert, to_mutation  # noqa: E402

SCHEMA = parse_schema("CREATE TABLE bench.series (pk int, ts bigint, v text, PRIMARY KEY (pk, ts)) "
                      "WITH cdc = true;")
TABLE = SCHEMA.table("bench", "series")
VALUE = "v" * 40
NOW_SECONDS = 1_700_000_000
KEY = (1).to_bytes(4, "big")


def insert(ts: int) -> object:
    """The partition update of one appended row."""
    op = Insert("bench.series", {"pk": 1, "ts": ts, "v": VALUE}, timestamp=1_700_000_000_000_000 + ts)
    return to_mutation(op, SCHEMA).updates[0]


def partition_of(width: int) -> PartitionPage:
    """A page holding one partition of ``width`` rows, sealed as the pipeline stores it."""
    state = PartitionState()
    for ts in range(width):
        apply(state, insert(ts), TABLE, NOW_SECONDS)  # type: ignore[arg-type]
    page = PartitionPage({})
    page.add(KEY, state)
    page.seal()
    return page


def per_write(width: int, writes: int) -> dict[str, float]:
    """Median milliseconds per appended row, by step, and the state's size in MB."""
    page = partition_of(width)
    load, merge, store = [], [], []
    copy: list[float] = []
    with collector_paused():  # as the pipeline merges a batch
        for ts in range(width, width + writes):
            digest = ts.to_bytes(16, "big")
            measure(page, insert(ts), digest, load, merge, store)
            page = PartitionPage.load(page.dump())  # written back; the next micro-batch reads it
            started = time.perf_counter()
            seen = page.seen(KEY, digest)
            copy.append(time.perf_counter() - started)
            assert seen and not page.changed
    steps = {"load": statistics.median(load), "merge": statistics.median(merge),
             "store": statistics.median(store)}
    return {"state_mb": len(pickle.dumps(page.stored)) / 1e6, "write_ms": sum(steps.values()) * 1000,
            **{f"{step}_ms": seconds * 1000 for step, seconds in steps.items()},
            "copy_us": statistics.median(copy) * 1e6}


def measure(page: PartitionPage, update: object, digest: bytes, load: list[float], merge: list[float],
            store: list[float]) -> None:
    """One write's steps, timed."""
    started = time.perf_counter()
    state = page.get(KEY)
    loaded = time.perf_counter()
    apply(state, update, TABLE, NOW_SECONDS, digest)  # type: ignore[arg-type]
    merged = time.perf_counter()
    page.seal()
    sealed = time.perf_counter()
    load.append(loaded - started)
    merge.append(merged - loaded)
    store.append(sealed - merged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=[100, 1_000, 10_000, 50_000])
    parser.add_argument("--writes", type=int, default=50, help="rows appended per width (median reported)")
    args = parser.parse_args()
    print(f"{'rows':>10} {'state MB':>9} {'per write':>10} {'load':>8} {'merge':>8} {'store':>8} "
          f"{'late copy':>10}")
    for width in args.widths:
        figures = per_write(width, args.writes)
        print(f"{width:>10,} {figures['state_mb']:>9.2f} {figures['write_ms']:>8.2f}ms "
              f"{figures['load_ms']:>6.2f}ms {figures['merge_ms']:>6.2f}ms {figures['store_ms']:>6.2f}ms "
              f"{figures['copy_us']:>8.2f}µs", flush=True)


if __name__ == "__main__":
    main()
