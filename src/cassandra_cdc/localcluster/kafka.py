"""One real Apache Kafka 4.x broker in KRaft mode (broker and controller in one JVM) on loopback.

Example::

    with KafkaBroker(work_dir) as broker:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers})

Its storage under ``work_dir/data`` is formatted (``kafka.tools.StorageTool``) on first start only, so
a restart keeps every topic. Both listeners take free ports on 127.0.0.1; logs go to ``work_dir/logs``.
Internal topics are created with one replica and few partitions, and consumer groups rebalance at once:
a test broker, not a production one.

With ``sasl_ssl``, its client listener (and the broker's own connections to itself: transaction
markers) is SASL_SSL: TLS with the given PEM certificate, users logging in with PLAIN, SCRAM-SHA-256 or
SCRAM-SHA-512. ``client_settings()`` then gives librdkafka's settings of its administrator.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from . import artifacts
from .process import SERVICE_JVM, JvmError, JvmProcess, JvmService, properties_text, run_tool
from ..kafka.security import KafkaSecurity, jaas_quoted
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

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_ADMIN = "admin"


@dataclass(frozen=True)
class SaslSsl:
    """A SASL_SSL client listener: the broker's PEM certificate and key (PKCS#8, unencrypted), the CA that
    signed it, and the users (name -> password) every mechanism accepts, besides the broker's ``admin``."""

    certificate: Path
    key: Path
    ca: Path
    users: Mapping[str, str] = field(default_factory=dict)
    admin_password: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def all_users(self) -> dict[str, str]:
        return {_ADMIN: self.admin_password, **self.users}

    def broker_settings(self, key_store: Path) -> dict[str, str]:
        plain_users = " ".join(f"user_{name}={jaas_quoted(password)}"
                               for name, password in self.all_users.items())
        login = f"username={jaas_quoted(_ADMIN)} password={jaas_quoted(self.admin_password)}"
        return {
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {login} {plain_users};",
            **{f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config":
               f"org.apache.kafka.common.security.scram.ScramLoginModule required {login};"
               for mechanism in SASL_MECHANISMS[1:]},
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(key_store),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }

    def scram_credentials(self) -> list[str]:
        """StorageTool's ``--add-scram`` arguments: SCRAM users exist from the first start."""
        return [argument for mechanism in SASL_MECHANISMS[1:] for name, password in self.all_users.items()
                for argument in ("--add-scram", f"{mechanism}=[name={name},password={password}]")]


class KafkaBroker(JvmService):
    """A single-node Kafka cluster (node id 1) under ``work_dir``; a context manager that runs it."""

    def __init__(self, work_dir: str | Path, port: int | None = None, *, heap: str = "512m",
                 progress: Callable[[str], None] | None = None, startup_timeout: float = 120.0,
                 sasl_ssl: SaslSsl | None = None) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.sasl_ssl = sasl_ssl
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
        self.properties.write_text(properties_text(self._settings()))
        (conf / "log4j2.xml").write_text(_LOG4J2.format(log=self.server_log))
        self._java = [artifacts.java_executable(), f"-Xms{heap}", f"-Xmx{heap}", *SERVICE_JVM,
                      f"-Dlog4j2.configurationFile={conf / 'log4j2.xml'}", f"-Dkafka.logs.dir={self.log_dir}",
                      "-cp", artifacts.classpath(artifacts.KAFKA)]
        self._process = JvmProcess(f"Kafka broker {self.bootstrap_servers}",
                                   [*self._java, "kafka.Kafka", str(self.properties)],
                                   self.log_dir, self.server_log)

    @property
    def _listener(self) -> str:
        return "SASL_SSL" if self.sasl_ssl else "PLAINTEXT"

    def _settings(self) -> dict[str, Any]:
        listener = self._listener
        security: dict[str, str] = {}
        if self.sasl_ssl is not None:
            key_store = self.work_dir / "conf" / "broker-keystore.pem"  # the key, then its certificate
            key_store.write_text(self.sasl_ssl.key.read_text() + self.sasl_ssl.certificate.read_text())
            key_store.chmod(0o600)
            security = self.sasl_ssl.broker_settings(key_store)
        return {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"{listener}://{self.host}:{self.port},"
                         f"CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"{listener}://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
            **security,
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
            # Transactions open past their timeout are aborted at the next check (every 10 s by default).
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
        }

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def security(self, user: str = _ADMIN, password: str | None = None,
                 mechanism: str = "SCRAM-SHA-512") -> KafkaSecurity:
        """The ``kafka.security`` section of a client logging in as ``user`` (PLAINTEXT without sasl_ssl)."""
        if self.sasl_ssl is None:
            return KafkaSecurity()
        return KafkaSecurity(protocol="SASL_SSL", sasl_mechanism=mechanism,  # type: ignore[arg-type]
                             username=user,
                             password=password if password is not None else self.sasl_ssl.all_users[user],
                             ca_file=self.sasl_ssl.ca)

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings of the broker's administrator."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.security().librdkafka()}

    # The embedded broker's interface, so that a test can run against either.
    create_topic = EmbeddedBroker.create_topic

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client_settings())

    def _format_storage(self) -> None:
        """Give the log directory its cluster id and metadata (first start only, as ``kafka-storage.sh``)."""
        if (self.data_dir / "meta.properties").is_file():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        # Attached to its option: an id that starts with "-" (one in 64) would read as an option of its own.
        users = self.sasl_ssl.scram_credentials() if self.sasl_ssl else []
        run_tool([*self._java, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                  "-c", str(self.properties), *users], f"formatting Kafka storage {self.data_dir}")

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
        admin = self.admin()
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
