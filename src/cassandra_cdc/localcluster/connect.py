"""A Kafka Connect standalone worker on loopback, with the connector plugins ``make install`` fetched.

Example::

    connectors = {"to-postgres": {"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", ...}}
    with ConnectWorker(work_dir, broker.bootstrap_servers, connectors) as worker:
        worker.wait_for_tasks("to-postgres")

It is ``connect-standalone``: ``org.apache.kafka.connect.cli.ConnectStandalone`` with a worker properties
file and one properties file per connector (in ``work_dir/conf``), the classpath of Kafka Connect 4.3
(:data:`.artifacts.CONNECT`) and ``plugin.path`` the fetched plugins (Debezium's JDBC sink and
ExtractNewRecordState). Converters default to the JsonConverter with schemas, the format of the events'
``json`` output; source offsets go to ``work_dir/data``. The worker's REST API listens on a free port of
127.0.0.1: :meth:`ConnectWorker.status` is a connector's state as ``GET /connectors/<name>/status`` gives it.
Logs go to ``work_dir/logs/connect.log``; errors quote its tail.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping

from . import artifacts
from .kafka import _LOG4J2
from .process import SERVICE_JVM, JvmCluster, JvmError, JvmProcess, JvmService, properties_text
from ..simulator.broker import free_port

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"


class ConnectWorker(JvmService, JvmCluster):
    """One standalone worker under ``work_dir`` running ``connectors`` (name -> settings, ``name`` added);
    ``worker_settings`` add to or replace the worker's own."""

    def __init__(self, work_dir: str | Path, bootstrap_servers: str,
                 connectors: Mapping[str, Mapping[str, Any]], *,
                 worker_settings: Mapping[str, Any] | None = None, heap: str = "384m",
                 progress: Callable[[str], None] | None = None, startup_timeout: float = 180.0) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.port = free_port(HOST)
        self.startup_timeout = startup_timeout
        self._progress = progress or log.info
        self.connectors = {name: {"name": name, **settings} for name, settings in connectors.items()}
        conf, logs = self.work_dir / "conf", self.work_dir / "logs"
        conf.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "data").mkdir(exist_ok=True)
        self.log = logs / "connect.log"
        worker = conf / "worker.properties"
        worker.write_text(properties_text({**self._worker_settings(bootstrap_servers),
                                           **(worker_settings or {})}))
        connector_files = []
        for name, settings in self.connectors.items():
            connector_files.append(conf / f"{name}.properties")
            connector_files[-1].write_text(properties_text(settings))
        (conf / "log4j2.xml").write_text(_LOG4J2.format(log=self.log))
        command = [artifacts.java_executable(), f"-Xms{heap}", f"-Xmx{heap}", *SERVICE_JVM,
                   f"-Dlog4j2.configurationFile={conf / 'log4j2.xml'}",
                   "-cp", artifacts.classpath(artifacts.CONNECT),
                   MAIN_CLASS, str(worker), *map(str, connector_files)]
        self._process = JvmProcess(f"Kafka Connect worker {HOST}:{self.port}", command, logs, self.log)

    def _worker_settings(self, bootstrap_servers: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": bootstrap_servers,
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": self.work_dir / "data" / "offsets",
            "offset.flush.interval.ms": 1000,
            "plugin.path": artifacts.connect_plugin_path(),
            # Plugins found by their ServiceLoader manifests only (Debezium's JDBC sink and its
            # transformations have them): the default's reflective scan of every jar takes far longer.
            "plugin.discovery": "service_load",
            "listeners": f"http://{HOST}:{self.port}",
        }

    def start(self) -> "ConnectWorker":
        """Start the worker; returns once its REST API lists every connector."""
        started = time.monotonic()
        self._process.start()
        deadline = started + self.startup_timeout
        while set(self._get("/connectors") or []) != set(self.connectors):
            if not self.running:
                raise self.failure("exited while starting")
            if time.monotonic() > deadline:
                raise self.failure(f"has not started its connectors {sorted(self.connectors)} after "
                                            f"{self.startup_timeout:.0f} s")
            time.sleep(0.5)
        self._progress(f"Kafka Connect worker {HOST}:{self.port} up in {time.monotonic() - started:.1f} s")
        return self

    def _get(self, path: str) -> Any:
        """The REST API's answer, or None while it does not answer (starting, or a 404 of a connector not
        created yet)."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}{path}", timeout=10) as response:
                return json.loads(response.read())
        except (OSError, ValueError):  # urllib.error.URLError is an OSError
            return None

    def status(self, connector: str) -> dict[str, Any] | None:
        """``{"connector": {"state": ...}, "tasks": [{"id": 0, "state": ..., "trace": ...}]}``."""
        return self._get(f"/connectors/{connector}/status")

    def failures(self) -> dict[str, str]:
        """Each failed connector or task (``<connector>`` or ``<connector>/<task id>``) with its error's
        trace."""
        failed = {}
        for name in self.connectors:
            status = self.status(name) or {}
            parts = [(name, status.get("connector", {}))]
            parts += [(f"{name}/{task['id']}", task) for task in status.get("tasks", [])]
            failed.update({where: part.get("trace", "") for where, part in parts
                           if part.get("state") == "FAILED"})
        return failed

    def wait_for_tasks(self, connector: str, timeout: float = 120.0) -> None:
        """Until the connector and each of its tasks run; raises with the error's trace if one failed."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(connector) or {}
            states = [status.get("connector", {}).get("state"),
                      *(task["state"] for task in status.get("tasks", []))]
            if len(states) > 1 and set(states) == {"RUNNING"}:
                return
            if "FAILED" in states:
                raise self.failure(f"connector {connector} failed")
            if time.monotonic() > deadline:
                raise self.failure(f"connector {connector} not running after {timeout:.0f} s: {status}")
            time.sleep(0.5)

    def failure(self, what: str) -> JvmError:
        """An error saying ``what``, with the log's tail, its first error and each failed task's trace (their
        first lines): a worker that stops on an error logs it before many lines of its shutdown."""
        lines = self.log.read_text(errors="replace").splitlines() if self.log.is_file() else []
        first = next((index for index, line in enumerate(lines) if "] ERROR " in line), None)
        logged = "" if first is None else "\n--- its first error ---\n" + "\n".join(
            line[:1000] for line in lines[first:first + 3])
        traces = "".join(f"\n--- {where} ---\n" + "\n".join(trace.splitlines()[:12])
                         for where, trace in self.failures().items())
        return JvmError(f"{self._process.failure(what)}{logged}{traces}")

    def stop(self) -> None:
        """SIGTERM: the worker stops its connectors and commits their offsets; SIGKILL after a minute."""
        if self.running:
            self._process.stop(60)
            self._progress(f"Kafka Connect worker {HOST}:{self.port} stopped")

    def kill(self) -> None:
        self._process.kill()


__all__ = ["ConnectWorker"]
