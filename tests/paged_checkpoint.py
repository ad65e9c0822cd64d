"""A real checkpoint of the state layout with pages and rows inline (version 4: each group's state in
pages, each partition's rows all in its page), with a wide partition, and the raw records it was written
from, for the test that restarts a pipeline on it (test_pipeline_upgrade.py).

The checkpoint in tests/data was made by running this module with the pipeline code of main at 88652f7
(the last commit of that layout), from a worktree of it (this module and its helpers from main's tests):

    git worktree add --detach /work/wt_layout4 88652f7 && ln -s /work/main/.jvm /work/wt_layout4/.jvm
    cd /work/wt_layout4 && PYTHONPATH=/work/wt_layout4/src:/work/main/tests /work/main/.venv/bin/python \\
        /work/main/tests/paged_checkpoint.py /work/main/tests/data/checkpoint-layout4.tar.gz

It publishes ``CHECKPOINTED`` to a new broker (``unpaged_checkpoint.archive_checkpoint``), runs that
pipeline until their events are out, stops it, and archives its checkpoint. The test publishes the same
records in the same order (so that the checkpoint's offsets name the same records), restores the
checkpoint, and runs this version of the pipeline on what follows.

The records' timestamps are fixed (the records are the same bytes whenever they are published), so they
age: the table keeps its tombstones (``gc_grace_seconds``) and the TTL row lives (``TTL``) for 10 years
after them, until November 2036, whenever the checkpoint is made or read. (A TTL of days would have the
row expire, by the pipeline's clock, days after ``TIMESTAMP``.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cassandra_cdc.schema import parse_schema
from cassandra_cdc.simulator import DeleteRange, DeleteRow, Insert, Update
from unpaged_checkpoint import NODES, archive_checkpoint, publish

SERVER = "paged"
TOPIC = f"{SERVER}.app.series"
TEN_YEARS = 10 * 365 * 86_400  # seconds
SCHEMA = parse_schema(f"""CREATE TABLE app.series (sensor int, ts int, v text, note text static,
        PRIMARY KEY (sensor, ts))
    WITH ID = 5c0e7a10-0000-4000-8000-0000000000c4 AND cdc = true AND gc_grace_seconds = {TEN_YEARS};""")
TIMESTAMP = 1_795_000_000_000_000  # fixed (2026-11-18): the records are the same bytes whenever published
TTL = TEN_YEARS
WIDE = 1  # the wide partition's sensor
WIDE_ROWS = 2_000  # its rows: ts 0 to 1999
DELETED_ROW = 7
DELETED_RANGE = (100, 149)  # both included
TTL_ROW = 9  # of sensor 3

CHECKPOINTED = [
    *[Insert("app.series", {"sensor": 2, "ts": ts, "v": f"s2-{ts}"}, timestamp=TIMESTAMP + ts)
      for ts in (1, 2, 3)],
    *[Insert("app.series", {"sensor": 3, "ts": ts, "v": f"s3-{ts}"}, timestamp=TIMESTAMP + 10 + ts)
      for ts in (1, 2)],
    Update("app.series", {"sensor": 2}, {"note": "static2"}, timestamp=TIMESTAMP + 20),
    *[Insert("app.series", {"sensor": WIDE, "ts": ts, "v": f"v{ts}"}, timestamp=TIMESTAMP + 1_000 + ts)
      for ts in range(WIDE_ROWS)],
    DeleteRow("app.series", {"sensor": WIDE, "ts": DELETED_ROW}, timestamp=TIMESTAMP + 5_000),
    DeleteRange("app.series", {"sensor": WIDE}, start=DELETED_RANGE[0], end=DELETED_RANGE[1],
                timestamp=TIMESTAMP + 5_001),
    Insert("app.series", {"sensor": 3, "ts": TTL_ROW, "v": "ttl"}, ttl=TTL, timestamp=TIMESTAMP + 5_002),
]
# 5 narrow rows created, 3 updated by the static value, the wide rows created, the deleted ones deleted,
# the TTL row created.
EVENTS = 5 + 3 + WIDE_ROWS + 1 + (DELETED_RANGE[1] - DELETED_RANGE[0] + 1) + 1


def publish_series(bootstrap_servers: str, ops: list[Any], nodes: tuple[str, ...] = NODES,
                   schema_record: bool = False) -> None:
    """``ops``' raw records as the agents of ``nodes`` publish them (``unpaged_checkpoint.publish``)."""
    publish(bootstrap_servers, ops, schema_record, nodes, server=SERVER, schema=SCHEMA)


def publish_checkpointed(bootstrap_servers: str) -> None:
    """What the archived checkpoint's pipeline read, in the same order."""
    publish_series(bootstrap_servers, CHECKPOINTED, schema_record=True)


def main(archive: Path) -> None:
    archive_checkpoint(archive, publish_checkpointed, TOPIC, EVENTS, SERVER)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
