"""The pipeline under spark-submit, run as docs/pipeline.md says: the package shipped as a zip with
``--py-files``, the entry point file given to spark-submit, the ``pipeline`` command's arguments after it."""

from __future__ import annotations

import contextlib
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

import cassandra_cdc.pipeline.submit as submit
from cassandra_cdc.simulator import Insert
from test_pipeline_faults import V1, RawPublisher, read_all, wait_for

SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
PACKAGE = Path(submit.__file__).parents[1]


def submit_environment() -> dict[str, str]:
    """spark-submit's environment: the driver and the executors' Python workers run this virtualenv's
    python (docs/pipeline.md), everything on loopback."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1"}


def package_archive(directory: Path) -> str:
    """The package zipped as docs/pipeline.md says, for ``--py-files``."""
    return shutil.make_archive(str(directory / "cassandra_cdc"), "zip", PACKAGE.parent, PACKAGE.name)


def stop_submitted(process: subprocess.Popen) -> None:
    """Stop spark-submit (started in a session of its own) and the Python driver it started: SIGTERM to
    both stops the query between batches; SIGKILL to whatever is left after a minute."""
    for signal_number, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        with contextlib.suppress(ProcessLookupError):  # all of them gone already
            os.killpg(process.pid, signal_number)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)


def test_spark_submit_runs_the_pipeline_from_its_entry_point_file(broker: Any, tmp_path: Path) -> None:
    server = "submitted"
    publisher = RawPublisher(broker.bootstrap_servers, server)
    schema = publisher.schema(V1)
    now = time.time_ns() // 1000
    for key in (1, 2, 3):
        publisher.write(schema, Insert("app.items", {"id": key, "name": f"n{key}", "qty": key},
                                       timestamp=now + key))
    archive = package_archive(tmp_path)
    checkpoint = tmp_path / "checkpoint"
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "server": server, "checkpoint": f"file://{checkpoint}",
        "kafka": {"bootstrap_servers": broker.bootstrap_servers},
        "spark": {"trigger_interval": "500 milliseconds"}}))
    log = tmp_path / "spark-submit.log"
    process = subprocess.Popen(
        [str(SPARK_SUBMIT), "--master", "local[2]", "--py-files", archive, submit.__file__,
         "pipeline", "--config", str(config), "--duration", "300"],
        env=submit_environment(), cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        events = wait_for(lambda: (e := read_all(broker.bootstrap_servers, f"{server}.app.items"))
                          and len(e) == 3 and e, timeout=300)  # spark-submit starts slowly on a busy machine
        assert events, log.read_text()[-3000:]
        assert sorted(event["payload"]["after"]["id"] for event in events) == [1, 2, 3]
        assert (checkpoint / "cassandra-cdc-state.json").exists()
    finally:
        stop_submitted(process)
    assert "pipeline running" in log.read_text()
