"""Progress of a bootstrap: the file that lets an interrupted run resume, and what the driver shows.

The progress file (default ``<checkpoint>/bootstrap/<keyspace>.<table>.json``, wherever the checkpoint is:
a local directory or a Hadoop URI) lists the tasks whose records Kafka acknowledged, with their counts::

    {"format": 1, "table": "shop.orders", "table_id": "5a1c…", "finished": false, "updated_ms": 1700000000000,
     "completed": {"/snap/node1/…/nb-7-big-Data.db@0": {"rows": 52000, "records": 52, …}, …}}

It is rewritten (locally: atomically, by temporary file, fsync, rename) about once a second while tasks
complete, and once more when the run ends, successfully or not. Completions reach the driver through a Spark
accumulator, which Spark merges as each task succeeds (never for failed attempts). A task that
completed in the last second before a crash is run again: its records are published twice, and the
pipeline drops the copies.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from pyspark.accumulators import AccumulatorParam
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from ..pipeline.checkpoint_files import CheckpointFiles, LocalCheckpointFiles
from ..schema import TableMetadata
from .bootstrap_errors import BootstrapError

log = logging.getLogger(__name__)

FORMAT = 1
SAVE_INTERVAL_SECONDS = 1.0
LOG_INTERVAL_SECONDS = 10.0


class ProgressFile:
    """The completed tasks of one table's bootstrap, in the file ``name`` of ``files`` (the checkpoint's
    files, read and written as the pipeline reads and writes its own: a Hadoop path once Spark runs)."""

    def __init__(self, files: CheckpointFiles, name: str, table: TableMetadata) -> None:
        self.files = files
        self.name = name
        self.table = table

    @classmethod
    def at(cls, path: Path, table: TableMetadata) -> "ProgressFile":
        """A progress file at a local ``path`` of its own."""
        return cls(LocalCheckpointFiles(Path(path).parent), Path(path).name, table)

    @property
    def location(self) -> str:
        return self.files.location(self.name)

    def load(self) -> dict[str, dict[str, Any]]:
        """Completed task ids and their counts; empty when there is no file yet."""
        try:
            if not self.files.exists(self.name):
                return {}
            data = json.loads(self.files.read_text(self.name))
        except (OSError, ValueError) as error:
            raise BootstrapError(f"cannot read the progress file {self.location}: {error} "
                                 "(delete it, or use --restart, to read every SSTable again)") from None
        if data.get("format") != FORMAT or data.get("table_id") != str(self.table.id):
            raise BootstrapError(f"{self.location} records a bootstrap of {data.get('table')} "
                                 f"(id {data.get('table_id')}), not of {self.table.qualified_name} "
                                 f"(id {self.table.id}): delete it, or use --restart")
        return dict(data.get("completed", {}))

    def save(self, completed: dict[str, dict[str, Any]], finished: bool = False) -> None:
        data = {"format": FORMAT, "table": self.table.qualified_name, "table_id": str(self.table.id),
                "finished": finished, "updated_ms": int(time.time() * 1000), "completed": completed}
        self.files.write_text(self.name, json.dumps(data, separators=(",", ":")))

    def remove(self) -> None:
        self.files.delete(self.name)


class CompletedTasks(AccumulatorParam):
    """Accumulates the results of completed tasks (lists of dicts) on the driver."""

    def zero(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return []

    def addInPlace(self, value1: list[dict[str, Any]], value2: list[dict[str, Any]]) -> list[dict[str, Any]]:
        value1.extend(value2)
        return value1


class Tracker:
    """A driver thread: follows the completed-tasks accumulator, saves the progress file, shows progress.

    ``previous`` are the tasks completed by earlier runs (kept in the file); ``total_tasks`` and
    ``total_bytes`` describe this run's tasks.
    """

    def __init__(self, accumulator: Any, store: ProgressFile, previous: dict[str, dict[str, Any]],
                 total_tasks: int, total_bytes: int, show: bool, title: str) -> None:
        self.accumulator = accumulator
        self.store = store
        self.completed = dict(previous)
        self.results: dict[str, dict[str, Any]] = {}
        self.total_tasks = total_tasks
        self.total_bytes = total_bytes
        self.title = title
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bootstrap-progress", daemon=True)
        self._started = time.monotonic()
        self._progress: Progress | None = None
        if show:
            counts = TextColumn("tasks  {task.fields[rows]:,} rows  {task.fields[rate]}")
            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), counts, TimeElapsedColumn(),
                                      TimeRemainingColumn(), console=Console(stderr=True), transient=False)
            self._bar = self._progress.add_task(title, total=total_tasks, rows=0, rate="")

    def __enter__(self) -> "Tracker":
        if self._progress is not None:
            self._progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # what completed just before the end
        if self._progress is not None:
            self._progress.stop()

    def _run(self) -> None:
        last_log = time.monotonic()
        while not self._stop.wait(SAVE_INTERVAL_SECONDS):
            try:
                self.poll()
            except Exception:  # a full disk must not kill the run silently: say it, keep trying
                log.exception("could not save the bootstrap progress to %s", self.store.location)
            if time.monotonic() - last_log >= LOG_INTERVAL_SECONDS:
                last_log = time.monotonic()
                log.info("%s: %s", self.title, self.summary())

    def poll(self) -> None:
        """Take in the newly completed tasks; save the file if there are any."""
        value = list(self.accumulator.value)
        fresh = value[self._seen:]
        if not fresh:
            return
        self._seen = len(value)
        for result in fresh:
            self.results[result["task_id"]] = result
            self.completed[result["task_id"]] = {k: v for k, v in result.items() if k != "task_id"}
        self.store.save(self.completed)
        if self._progress is not None:
            self._progress.update(self._bar, completed=len(self.results), rows=self.rows,
                                  rate=f"{self.rows / max(1e-9, self.elapsed):,.0f} rows/s")

    @property
    def rows(self) -> int:
        return sum(r["rows"] for r in self.results.values())

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def summary(self) -> str:
        done_bytes = sum(r["data_bytes"] for r in self.results.values())
        share = 100.0 * done_bytes / self.total_bytes if self.total_bytes else 100.0
        rate = self.rows / max(1e-9, self.elapsed)
        return (f"{len(self.results)}/{self.total_tasks} tasks ({share:.0f}% of the data), "
                f"{self.rows:,} rows, {rate:,.0f} rows/s")


__all__ = ["CompletedTasks", "ProgressFile", "Tracker"]
