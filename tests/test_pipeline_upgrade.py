"""A pipeline restarted on a checkpoint written by the state layout before pages (tests/data, made by
the code of main at 3c22a26 with tests/unpaged_checkpoint.py): it resumes where that one stopped, with
its state and its truncation."""

from __future__ import annotations

import json
import re
import tarfile
import time
from pathlib import Path
from typing import Any

from cassandra_cdc.pipeline.pipeline_config import load_config
from cassandra_cdc.pipeline.streaming_job import STATE_LAYOUT_FILE, start
from cassandra_cdc.simulator import Insert, Update
from test_pipeline_faults import read_all, wait_for
from unpaged_checkpoint import (FIRST, RAW_PARTITIONS, SERVER, TIMESTAMP, TRUNCATED_MS, publish,
                                publish_checkpointed, publish_truncation, settings)

ARCHIVE = Path(__file__).parent / "data" / "checkpoint-layout3.tar.gz"
# Where the archived checkpoint was written: Spark's metadata of the stateful operator names its state
# schema files by absolute URI, so a checkpoint restored elsewhere has them renamed (a Spark checkpoint
# does not move otherwise).
WRITTEN_AT = re.compile(r"file:/[^\"]*?/checkpoint/")


def restore(checkpoint: Path) -> None:
    with tarfile.open(ARCHIVE) as archive:
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
    assert layout["version"] == 4 and layout["spark.state_pages"] == config.spark.state_pages
