"""A Python worker of the pipeline killed with ``kill -9`` mid-stream in local mode (the real broker):
the task it ran is retried, as on a cluster, the pipeline goes on, and every event is committed once."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cassandra_cdc.pipeline.spark_session import WORKER_DAEMON, local_master_with_retries
from cassandra_cdc.simulator import Insert
from test_kafka_outage import event_ids, start_logged_pipeline
from test_pipeline_faults import V1, RawPublisher, pipeline_command, read_all, stop_pipeline, wait_for

# Spark's warning for a task attempt that failed (and is retried when attempts remain).
LOST_TASK = "Lost task"


@pytest.mark.parametrize("master, expected", [
    ("local", "local[1,4]"), ("local[2]", "local[2,4]"), ("local[*]", "local[*,4]"),
    ("local[ 3 ]", "local[3,4]"),
    # Attempts of their own, or a cluster's (spark.task.maxFailures): left alone.
    ("local[2,1]", "local[2,1]"), ("local[*,8]", "local[*,8]"),
    ("local-cluster[2,1,1024]", "local-cluster[2,1,1024]"),
    ("spark://127.0.0.1:7077", "spark://127.0.0.1:7077"), ("yarn", "yarn"),
])
def test_a_local_master_gets_task_retries_and_others_are_left_alone(master: str, expected: str) -> None:
    assert local_master_with_retries(master, 4) == expected


def python_workers(pipeline_pid: int) -> tuple[list[int], list[int]]:
    """The worker daemons among the pipeline's descendant processes, and the workers they forked."""
    # -ww: the whole command line, whatever COLUMNS says.
    table = subprocess.run(["ps", "-e", "-ww", "-o", "pid=,ppid=,args="], capture_output=True, text=True,
                           check=True).stdout
    processes = [(int(pid), int(ppid), args) for pid, ppid, args in
                 (line.split(None, 2) for line in table.splitlines() if len(line.split(None, 2)) == 3)]
    descendants, found = set(), {pipeline_pid}
    while found - descendants:
        descendants |= found
        found = {pid for pid, ppid, _ in processes if ppid in descendants}
    # Not "WORKER_DAEMON in args": the JVM's command line names it too (spark.python.daemon.module).
    forked = [(pid, ppid) for pid, ppid, args in processes
              if pid in descendants and f"-m {WORKER_DAEMON}" in args]
    daemons = [pid for pid, ppid in forked if ppid not in {p for p, _ in forked}]
    return daemons, [pid for pid, ppid in forked if ppid in daemons]


def test_kill_9_of_a_python_worker_mid_stream_is_retried_with_each_event_committed_once(
        real_kafka: Any, tmp_path: Path) -> None:
    server = "workerkill"
    publisher = RawPublisher(real_kafka.bootstrap_servers, server)
    schema = publisher.schema(V1)
    now = time.time_ns() // 1000
    total = 400
    # Written as the pipeline runs, a few at a time: its tasks keep running while workers are killed.
    unwritten = iter(range(total))

    def write(count: int) -> None:
        for i in itertools.islice(unwritten, count):
            insert = Insert("app.items", {"id": i, "name": f"n{i}", "qty": i}, timestamp=now + i)
            publisher.write(schema, insert)

    write(50)
    topic = f"{server}.app.items"
    log_file = tmp_path / "pipeline.log"
    process = start_logged_pipeline(
        pipeline_command(real_kafka, server, tmp_path, {"max_offsets_per_trigger": 30}), log_file)
    try:
        assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic, "read_uncommitted")) >= 10,
                        240), log_file.read_text(errors="replace")
        kills = 0
        deadline = time.monotonic() + 180
        # Workers are idle between tasks, and one killed then loses no task: kill every one, a few
        # seconds apart (fewer than a task's attempts can overlap), until a task attempt was lost.
        while LOST_TASK not in log_file.read_text(errors="replace") and time.monotonic() < deadline:
            assert process.poll() is None, log_file.read_text(errors="replace")
            write(10)
            _, workers = python_workers(process.pid)
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):  # its task ended meanwhile
                    os.kill(worker, signal.SIGKILL)
            kills += bool(workers)
            time.sleep(3 if workers else 0.1)
        assert LOST_TASK in log_file.read_text(errors="replace"), f"{kills} kills lost no task"
        write(total)
        assert wait_for(lambda: len(read_all(real_kafka.bootstrap_servers, topic)) >= total
                        or process.poll() is not None, 300)
        assert process.poll() is None, log_file.read_text(errors="replace")
    finally:
        stop_pipeline(process)
        publisher.close()
    assert event_ids(real_kafka.bootstrap_servers, topic) == list(range(total))
