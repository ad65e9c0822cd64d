"""Event encoding cost, single process (= per core): what the pipeline pays per event it writes.

Encodes the update event (``before`` and ``after`` rows, the ``source`` block) and the key of the
pipeline benchmark's table (``bench.users``: a bigint key and five text/int/double columns) with
``EventEncoder``, in Connect JSON and in Avro (the Confluent wire format); best of N runs of
``--events`` each, timed with this process's CPU time (``time.process_time``) so that other work on a
shared machine does not count.

    python benchmarks/event_encoding.py [--events 50000] [--runs 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cassandra_cdc.events.event_encoder import EventEncoder, Source  # noqa: E402
from cassandra_cdc.schema import parse_schema  # noqa: E402

SCHEMA = """CREATE TABLE bench.users (id bigint PRIMARY KEY, name text, email text, age int, score double,
    city text) WITH ID = 6c0e7a10-0000-4000-8000-0000000000b1 AND cdc = true;"""
BEFORE = {"id": 12345, "name": "name-12345", "email": "user-12345@example.com", "age": 33, "score": 12.5,
          "city": "Lisbon"}
AFTER = {**BEFORE, "age": 34, "score": 0.125}
SOURCE = Source(name="bench", cluster="bench", keyspace="bench", table="users", ts_us=1_795_000_000_000_000,
                snapshot=False, node="127.0.0.1", segment=1_795_000_000_000, position=123_456)


class OneSchemaId:
    """A registry that gives every schema id 1: an encoder registers its schemas once, at its first event,
    so what a real registry costs is no part of the per-event cost measured here."""

    def register(self, subject: str, schema: object) -> int:
        return 1


def best_cpu_seconds(encode: object, events: int, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.process_time()
        for _ in range(events):
            encode()  # type: ignore[operator]
        best = min(best, time.process_time() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    table = parse_schema(SCHEMA).table("bench", "users")
    for fmt in ("json", "avro"):
        encoder = EventEncoder("bench", table, fmt, OneSchemaId())  # type: ignore[arg-type]
        value = best_cpu_seconds(lambda: encoder.value(BEFORE, AFTER, "u", SOURCE, 1_795_000_000_000),
                                 args.events, args.runs)
        key = best_cpu_seconds(lambda: encoder.key(AFTER), args.events, args.runs)
        per_event_us = (value + key) / args.events * 1e6
        print(f"{fmt}: value {value / args.events * 1e6:.2f} µs, key {key / args.events * 1e6:.2f} µs, "
              f"{1e6 / per_event_us:,.0f} events/s per core")


if __name__ == "__main__":
    main()
