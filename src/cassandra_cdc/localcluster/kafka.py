"""Real Apache Kafka 4.x in KRaft mode on loopback: one broker (:class:`KafkaBroker`, broker and controller
in one JVM), or a cluster of them (:class:`KafkaCluster`, each a broker and a voter of the controller quorum).

Example::

    with KafkaBroker(work_dir) as broker:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers})

A broker's storage under ``work_dir/data`` is formatted (``kafka.tools.StorageTool``) on first start only,
so a restart keeps every topic. Both listeners take free ports on 127.0.0.1; logs go to ``work_dir/logs``.
A single broker creates internal topics with one replica and few partitions, and consumer groups rebalance
at once: a test broker, not a production one. A cluster replicates every topic to all its brokers by
default (internal ones too), with ``min.insync.replicas`` 2, as production runs Kafka.

With ``sasl_ssl``, its client listener (and the broker's own connections to itself: transaction
markers) is SASL_SSL: TLS with the given PEM certificate, users logging in with PLAIN, SCRAM-SHA-256 or
SCRAM-SHA-512. ``client_settings()`` then gives librdkafka's settings of its administrator.
"""

from __future__ import annotations

import base64
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Self

from . import artifacts
from .process import SERVICE_JVM, JvmCluster, JvmError, JvmProcess, JvmService, properties_text, run_tool
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


def new_cluster_id() -> str:
    """A Kafka cluster id (a UUID in URL-safe base64), as ``kafka-storage.sh random-uuid`` makes one."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class KafkaBroker(JvmService):
    """A Kafka node (broker and controller) under ``work_dir``; a context manager that runs it.

    Alone (the default), it is a single-node cluster of node id 1. In a :class:`KafkaCluster`, it is node
    ``node_id`` of the quorum ``voters`` (node id -> controller port on 127.0.0.1) of cluster ``cluster_id``,
    whose topics have ``replicas`` replicas by default.
    """

    def __init__(self, work_dir: str | Path, port: int | None = None, *, heap: str = "512m",
                 progress: Callable[[str], None] | None = None, startup_timeout: float = 120.0,
                 sasl_ssl: SaslSsl | None = None, node_id: int = 1, voters: Mapping[int, int] | None = None,
                 cluster_id: str | None = None, replicas: int = 1) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.sasl_ssl = sasl_ssl
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.node_id = node_id
        self.voters = dict(voters) if voters is not None else {node_id: free_port(self.host)}
        self.controller_port = self.voters[node_id]
        self.cluster_id = cluster_id
        self.replicas = replicas
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
        # Writes acknowledged by all in-sync replicas need two of them when there are more than one.
        in_sync = min(self.replicas, 2)
        return {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": ",".join(f"{node}@{self.host}:{port}"
                                                 for node, port in self.voters.items()),
            "listeners": f"{listener}://{self.host}:{self.port},"
                         f"CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"{listener}://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
            **security,
            "log.dirs": self.data_dir,
            "num.partitions": 1,
            "default.replication.factor": self.replicas,
            "min.insync.replicas": in_sync,
            "offsets.topic.replication.factor": self.replicas,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": self.replicas,
            "transaction.state.log.min.isr": in_sync,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": self.replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
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
        # Attached to its option: an id that starts with "-" (one in 64) would read as an option of its own.
        users = self.sasl_ssl.scram_credentials() if self.sasl_ssl else []
        run_tool([*self._java, "kafka.tools.StorageTool", "format",
                  f"--cluster-id={self.cluster_id or new_cluster_id()}", "-c", str(self.properties), *users],
                 f"formatting Kafka storage {self.data_dir}")

    def start(self) -> float:
        """Start the broker and wait until it answers metadata requests; returns the seconds it took. A
        node of a :class:`KafkaCluster` starts alone only where the others make a quorum."""
        started = time.monotonic()
        self.launch()
        self.wait_until_serving(started + self.startup_timeout, brokers=1)
        seconds = time.monotonic() - started
        self._progress(f"Kafka broker {self.bootstrap_servers} up in {seconds:.1f} s")
        return seconds

    def launch(self) -> None:
        """Start the broker's process, without waiting for it (:meth:`wait_until_serving`)."""
        self._progress(f"starting Kafka broker {self.bootstrap_servers}")
        self._format_storage()
        self._process.start()

    def wait_until_serving(self, deadline: float, brokers: int) -> None:
        """Until the broker answers metadata requests listing at least ``brokers`` brokers (killed if it
        does not by ``deadline``)."""
        try:
            self._process.wait_for_port(self.host, self.port, max(deadline - time.monotonic(), 0.0))
            self._wait_for_metadata(deadline, brokers)
        except JvmError:
            self._process.kill()
            raise

    def _wait_for_metadata(self, deadline: float, brokers: int) -> None:
        admin = self.admin()
        while True:
            try:
                if len(admin.list_topics(timeout=2).brokers) >= brokers:
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

    def request_stop(self) -> None:
        """Ask for a controlled shutdown without waiting for it (:meth:`stop` then waits)."""
        if self.running:
            self._process.terminate()

    def kill(self) -> None:
        """SIGKILL: Kafka recovers its logs on the next start."""
        self._process.kill()

    def tool(self, main_class: str, *arguments: str) -> str:
        """Run one of Kafka's command-line tools (by its main class) to completion; its output."""
        return run_tool([*self._java, main_class, *arguments],
                        f"{main_class.rsplit('.', 1)[1]} {' '.join(arguments)}")

    def restart(self) -> float:
        self.stop()
        return self.start()


class KafkaCluster(JvmCluster):
    """``brokers`` Kafka nodes under ``work_dir/broker<N>`` (node ids 1 to N), each a broker and a voter of
    the controller quorum; a context manager that runs them. Topics get a replica on every broker unless
    created with fewer (``default.replication.factor``), internal ones too, and writes acknowledged by all
    in-sync replicas need two of them (``min.insync.replicas``). Killing one node leaves a quorum and a
    leader for every partition."""

    def __init__(self, work_dir: str | Path, brokers: int = 3, *, heap: str = "384m",
                 progress: Callable[[str], None] | None = None, startup_timeout: float = 120.0) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be 1 or more, not {brokers}")
        work = Path(work_dir).resolve()
        voters = {node_id: free_port() for node_id in range(1, brokers + 1)}
        cluster_id = new_cluster_id()
        self.startup_timeout = startup_timeout
        self._progress = progress or log.info
        self.brokers = [KafkaBroker(work / f"broker{node_id}", heap=heap, progress=progress,
                                    startup_timeout=startup_timeout, node_id=node_id, voters=voters,
                                    cluster_id=cluster_id, replicas=brokers)
                        for node_id in voters]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(broker.bootstrap_servers for broker in self.brokers)

    def client_settings(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers}

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client_settings())

    create_topic = EmbeddedBroker.create_topic

    def start(self) -> Self:
        """Start the brokers that are not running, all at once (a quorum needs most of them), and wait until
        each serves metadata listing every broker."""
        started = time.monotonic()
        stopped = [broker for broker in self.brokers if not broker.running]
        for broker in stopped:
            broker.launch()
        for broker in stopped:
            broker.wait_until_serving(started + self.startup_timeout, brokers=len(self.brokers))
        seconds = time.monotonic() - started
        self._progress(f"Kafka cluster of {len(self.brokers)} brokers ready in {seconds:.1f} s")
        return self

    def stop(self) -> None:
        """A controlled shutdown of every broker, all at once."""
        for broker in self.brokers:
            broker.request_stop()
        for broker in self.brokers:
            broker.stop()

    def kill(self) -> None:
        for broker in self.brokers:
            broker.kill()

    def broker(self, node_id: int) -> KafkaBroker:
        return self.brokers[node_id - 1]

    def leader(self, topic: str, partition: int) -> KafkaBroker:
        """The broker that leads ``topic``'s ``partition`` now."""
        metadata = self.admin().list_topics(topic, timeout=10).topics[topic]
        return self.broker(metadata.partitions[partition].leader)

    def active_controller(self) -> KafkaBroker:
        """The leader of the controller quorum now (``kafka-metadata-quorum.sh describe --status``)."""
        return self.broker(int(self._tool_field("org.apache.kafka.tools.MetadataQuorumCommand",
                                                ["describe", "--status"], "LeaderId")))

    def transaction_coordinator(self, transactional_id: str) -> KafkaBroker:
        """The broker coordinating the transactions of ``transactional_id`` now (``kafka-transactions.sh
        describe``)."""
        return self.broker(int(self._tool_field("org.apache.kafka.tools.TransactionsCommand",
                                                ["describe", "--transactional-id", transactional_id],
                                                "CoordinatorId")))

    def _tool_field(self, tool: str, arguments: list[str], name: str) -> str:
        """A field of what one of Kafka's command-line tools prints: ``Name: value`` lines or a table
        whose header row names the field."""
        running = next(broker for broker in self.brokers if broker.running)
        output = running.tool(tool, "--bootstrap-server", self.bootstrap_servers, *arguments)
        match = re.search(rf"^{name}:\s*(\S+)", output, re.MULTILINE)
        if match is not None:
            return match.group(1)
        header, *rows = [line.split() for line in output.splitlines() if line.strip()]
        if name not in header or not rows:
            raise JvmError(f"no {name} in the output of {tool}: {output}")
        return rows[0][header.index(name)]
