"""One real Apache Kafka 4.x broker in KRaft mode (broker and controller in one JVM) on loopback.

Example::

    with KafkaBroker(work_dir) as broker:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers})

Its storage under ``work_dir/data`` is formatted (``kafka.tools.StorageTool``) on first start only, so
a restart keeps every topic. Both listeners take free ports on 127.0.0.1; logs go to ``work_dir/logs``.
Internal topics are created with one replica and few partitions, and consumer groups rebalance at once:
a test broker, not a production one.
"""

from __future__ import annotations

import base64
import logging
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from . import artifacts
from .process import JvmError, JvmProcess
from ..simulator.broker import EmbeddedBroker, free_port

log = logging.getLogger(__name__)

_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <File name="server" fileName="{log}">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="info"><AppenderRef ref="server"/></Root>
  </Loggers>
</Configuration>
"""

_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true"]


class KafkaBroker:
    """A single-node Kafka cluster (node id 1) under ``work_dir``; a context manager that runs it."""

    def __init__(self, work_dir: str | Path, port: int | None = None, *, heap: str = "512m",
                 progress: Callable[[str], None] | None = None, startup_timeout: float = 120.0) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.controller_port = free_port(self.host)
        self.data_dir = self.work_dir / "data"
        self.log_dir = self.work_dir / "logs"
        self.server_log = self.log_dir / "server.log"
        self.startup_timeout = startup_timeout
        self._progress = progress or log.info
        conf = self.work_dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.properties = conf / "server.properties"
        self.properties.write_text("".join(f"{key}={value}\n" for key, value in self._settings().items()))
        (conf / "log4j2.xml").write_text(_LOG4J2.format(log=self.server_log))
        self._java = [artifacts.java_executable(), f"-Xms{heap}", f"-Xmx{heap}", *_JVM,
                      f"-Dlog4j2.configurationFile={conf / 'log4j2.xml'}", f"-Dkafka.logs.dir={self.log_dir}",
                      "-cp", artifacts.classpath(artifacts.KAFKA)]
        self._process = JvmProcess(f"Kafka broker {self.bootstrap_servers}",
                                   [*self._java, "kafka.Kafka", str(self.properties)],
                                   self.log_dir, self.server_log)

    def _settings(self) -> dict[str, Any]:
        return {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": self.data_dir,
            "num.partitions": 1,
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            # After a kill, the controller waits out the dead incarnation's session before the broker can
            # register again: a short session makes that restart seconds, not the default's ten.
            "broker.session.timeout.ms": 3000,
            "broker.heartbeat.interval.ms": 500,
        }

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    # The embedded broker's interface, so that a test can run against either.
    create_topic = EmbeddedBroker.create_topic
    admin = EmbeddedBroker.admin

    @property
    def running(self) -> bool:
        return self._process.running

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _format_storage(self) -> None:
        """Give the log directory its cluster id and metadata (first start only, as ``kafka-storage.sh``)."""
        if (self.data_dir / "meta.properties").is_file():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        result = subprocess.run([*self._java, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                                 "-c", str(self.properties)], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise JvmError(f"formatting Kafka storage {self.data_dir} failed with status "
                           f"{result.returncode}: {(result.stderr or result.stdout).strip()[-2000:]}")

    def start(self) -> float:
        """Start the broker and wait until it answers metadata requests; returns the seconds it took."""
        started = time.monotonic()
        self._progress(f"starting Kafka broker {self.bootstrap_servers}")
        self._format_storage()
        self._process.start()
        try:
            self._process.wait_for_port(self.host, self.port, self.startup_timeout)
            self._wait_for_metadata(started + self.startup_timeout)
        except JvmError:
            self._process.kill()
            raise
        seconds = time.monotonic() - started
        self._progress(f"Kafka broker {self.bootstrap_servers} up in {seconds:.1f} s")
        return seconds

    def _wait_for_metadata(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        while True:
            try:
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:  # noqa: BLE001 - not answering yet: try again until the deadline
                pass
            if not self.running:
                raise self._process.failure("exited while starting")
            if time.monotonic() > deadline:
                raise self._process.failure("listens but does not answer metadata requests")
            time.sleep(0.2)

    def stop(self, timeout: float = 60.0) -> None:
        """A controlled shutdown (SIGTERM), SIGKILL after ``timeout``."""
        if self.running:
            self._process.stop(timeout)
            self._progress(f"Kafka broker {self.bootstrap_servers} stopped")

    def kill(self) -> None:
        """SIGKILL: Kafka recovers its logs on the next start."""
        self._process.kill()

    def restart(self) -> float:
        self.stop()
        return self.start()

    def __enter__(self) -> "KafkaBroker":
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
