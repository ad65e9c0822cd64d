"""A pipeline restarted on a checkpoint written by an earlier state layout (tests/data): it resumes where
that one stopped, with its state. Before pages (made by the code of main at 3c22a26 with
tests/unpaged_checkpoint.py): with its truncation. Pages with each partition's rows inline (made at
88652f7 with tests/paged_checkpoint.py): with a wide partition's rows and its tombstones."""

from __future__ import annotations

import json
import re
import tarfile
import time
from pathlib import Path
from typing import Any

from cassandra_cdc.pipeline import streaming_job
from cassandra_cdc.pipeline.pipeline_config import load_config
from cassandra_cdc.pipeline.streaming_job import STATE_LAYOUT_FILE, start
from cassandra_cdc.simulator import DeletePartition, DeleteRange, DeleteRow, Insert, Update
from test_pipeline_faults import read_all, wait_for
from unpaged_checkpoint import (FIRST, RAW_PARTITIONS, SERVER, TIMESTAMP, TRUNCATED_MS, publish,
                                publish_checkpointed, publish_truncation, settings)
import paged_checkpoint as layout4

ARCHIVE = Path(__file__).parent / "data" / "checkpoint-layout3.tar.gz"
LAYOUT4_ARCHIVE = Path(__file__).parent / "data" / "checkpoint-layout4.tar.gz"
# Where the archived checkpoint was written: Spark's metadata of the stateful operator names its state
# schema files by absolute URI, so a checkpoint restored elsewhere has them renamed (a Spark checkpoint
# does not move otherwise).
WRITTEN_AT = re.compile(r"file:/[^\"]*?/checkpoint/")


def restore(checkpoint: Path, archived: Path = ARCHIVE) -> None:
    """The checkpoint archived in ``archived`` (as its directory ``checkpoint``), at ``checkpoint``."""
    with tarfile.open(archived) as archive:
        archive.extractall(checkpoint.parent, filter="data")
    metadata = checkpoint / "state" / "0" / "_metadata" / "v2" / "0"
    metadata.write_text(WRITTEN_AT.sub(f"file:{checkpoint}/", metadata.read_text()))
    (metadata.parent / ".0.crc").unlink()  # Hadoop's checksum of the file as it was


def test_a_checkpoint_of_groups_stored_whole_resumes_with_its_state_and_is_paged(broker: Any, spark: Any,
                                                                                   tmp_path: Path) -> None:
    broker.create_topic(f"{SERVER}.raw", RAW_PARTITIONS)
    publish_checkpointed(broker.bootstrap_servers)  # what the checkpoint's offsets name
    checkpoint = tmp_path / "checkpoint"
    restore(checkpoint)
    assert json.loads((checkpoint / STATE_LAYOUT_FILE).read_text())["version"] == 3
    config = load_config(None, settings(broker.bootstrap_servers, checkpoint))
    query = start(spark, config)
    topic = f"{SERVER}.app.items"
    try:
        later = [Update("app.items", {"id": key}, {"qty": 10 * key}, timestamp=TIMESTAMP + 1_000_000 + key)
                 for key in (3, 17, 30)]  # 30: truncated, not written since
        new = Insert("app.items", {"id": 41, "name": "item41", "qty": 41}, timestamp=TIMESTAMP + 2_000_000)
        # A late replica's copy of a write the truncation deleted, and a node's late copy of the truncation.
        publish(broker.bootstrap_servers, FIRST[34:35], nodes=("node4",))
        publish_truncation(broker.bootstrap_servers, TRUNCATED_MS + 50, nodes=("node4",))
        publish(broker.bootstrap_servers, later + [new])
        assert wait_for(lambda: len(read_all(broker.bootstrap_servers, topic)) >= 4, timeout=300)
        time.sleep(5)  # anything written again (a restart from the raw topic's start) would be there by now
        payloads = [event["payload"] for event in read_all(broker.bootstrap_servers, topic)]
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted((p["op"], p["after"]["id"], p["before"] and (p["before"]["name"], p["before"]["qty"]),
                   p["after"]["name"], p["after"]["qty"]) for p in payloads) == [
        ("c", 30, None, None, 300), ("c", 41, None, "item41", 41), ("u", 3, ("item3", 3), "item3", 30),
        ("u", 17, ("item17", 17), "item17", 170)]
    assert read_all(broker.bootstrap_servers, f"{SERVER}.errors") == []
    layout = json.loads((checkpoint / STATE_LAYOUT_FILE).read_text())
    assert layout["version"] == streaming_job.STATE_LAYOUT_VERSION and layout["spark.state_pages"] == config.spark.state_pages


Values = tuple[tuple[str, str | None] | None, tuple[str, str | None] | None]  # before, after: (v, note)


def test_a_checkpoint_of_pages_with_a_wide_partition_resumes_with_its_rows_and_tombstones(
        broker: Any, spark: Any, tmp_path: Path) -> None:
    server = layout4.SERVER
    broker.create_topic(f"{server}.raw", RAW_PARTITIONS)
    layout4.publish_checkpointed(broker.bootstrap_servers)  # what the checkpoint's offsets name
    checkpoint = tmp_path / "checkpoint"
    restore(checkpoint, LAYOUT4_ARCHIVE)
    assert json.loads((checkpoint / STATE_LAYOUT_FILE).read_text())["version"] == 4
    config = load_config(None, settings(broker.bootstrap_servers, checkpoint, server))
    query = start(spark, config)
    wide, later = layout4.WIDE, layout4.TIMESTAMP + 1_000_000
    appended = range(layout4.WIDE_ROWS, layout4.WIDE_ROWS + 1_000)
    updated = (300, 1000, 1001, 1500)
    deleted_row = 1234
    deleted_range = (120, 400)  # 400 excluded: 120 to 149 were deleted already, 150 to 399 are not
    late = [  # older than the checkpointed deletions of their rows, or a copy of a checkpointed write
        Insert("app.series", {"sensor": wide, "ts": 125, "v": "late"}, timestamp=layout4.TIMESTAMP + 4_000),
        Insert("app.series", {"sensor": wide, "ts": layout4.DELETED_ROW, "v": "late"},
               timestamp=layout4.TIMESTAMP + 4_001),
        next(op for op in layout4.CHECKPOINTED if op.key == {"sensor": wide, "ts": 500, "v": "v500"})]
    ops = [*[Insert("app.series", {"sensor": wide, "ts": ts, "v": f"v{ts}"}, timestamp=later + ts)
             for ts in appended],
           *[Update("app.series", {"sensor": wide, "ts": ts}, {"v": f"w{ts}"}, timestamp=later + 10_000 + ts)
             for ts in updated],
           DeleteRow("app.series", {"sensor": wide, "ts": deleted_row}, timestamp=later + 20_000),
           DeleteRange("app.series", {"sensor": wide}, start=deleted_range[0], end=deleted_range[1],
                       end_inclusive=False, timestamp=later + 20_001),
           DeletePartition("app.series", {"sensor": 3}, timestamp=later + 20_002),
           Update("app.series", {"sensor": 2}, {"note": "static2b"}, timestamp=later + 20_003)]
    # By hand, from what was written: each key's events in order, (op, before, after) with (v, note).
    expected: dict[tuple[int, int], list[tuple[str, Values]]] = {}
    for ts in appended:
        expected[(wide, ts)] = [("c", (None, (f"v{ts}", None)))]
    for ts in updated:
        expected[(wide, ts)] = [("u", ((f"v{ts}", None), (f"w{ts}", None)))]
    expected[(wide, deleted_row)] = [("d", ((f"v{deleted_row}", None), None))]
    for ts in range(150, deleted_range[1]):
        before = f"w{ts}" if ts in updated else f"v{ts}"
        expected.setdefault((wide, ts), []).append(("d", ((before, None), None)))
    for ts, v in ((1, "s3-1"), (2, "s3-2"), (layout4.TTL_ROW, "ttl")):
        expected[(3, ts)] = [("d", ((v, None), None))]
    for ts in (1, 2, 3):
        expected[(2, ts)] = [("u", ((f"s2-{ts}", "static2"), (f"s2-{ts}", "static2b")))]
    events = sum(map(len, expected.values()))
    assert events == 1_000 + 4 + 1 + 250 + 3 + 3
    try:
        layout4.publish_series(broker.bootstrap_servers, late, nodes=("node4",))
        layout4.publish_series(broker.bootstrap_servers, ops)
        assert wait_for(lambda: len(read_all(broker.bootstrap_servers, layout4.TOPIC)) >= events, timeout=300)
        time.sleep(5)  # anything written again (a restart from the raw topic's start) would be there by now
        payloads = [event["payload"] for event in read_all(broker.bootstrap_servers, layout4.TOPIC)]
        assert query.exception() is None
    finally:
        query.stop()
    written: dict[tuple[int, int], list[tuple[str, Values]]] = {}
    for p in payloads:
        row = p["after"] or p["before"]
        written.setdefault((row["sensor"], row["ts"]), []).append(
            (p["op"], tuple(r and (r["v"], r["note"]) for r in (p["before"], p["after"]))))
    assert len(payloads) == events and written == expected
    assert read_all(broker.bootstrap_servers, f"{server}.errors") == []
    layout = json.loads((checkpoint / STATE_LAYOUT_FILE).read_text())
    assert layout["version"] == streaming_job.STATE_LAYOUT_VERSION
