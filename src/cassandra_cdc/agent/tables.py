"""The tables the agent publishes: CDC-enabled ones from the schema, with the config's filter applied.

Table metadata comes from a CQL file or from the cluster's ``system_schema``, and is reloaded when a
mutation names a table id the agent does not know (a table created since it started), when the schema
file changes, and when the node logs a schema change (a mutation of ``system_schema``, which every
``CREATE``/``ALTER``/``DROP`` writes to the commit log before any data that uses the new definition).

A user table's id the schema does not know is either a table created since the schema was loaded (its
schema may reach the agent late: a reload that failed, a schema file not updated yet) or a dropped one,
which the schema cannot tell apart. Its mutation holds reading back while the schema is reloaded
(:meth:`TableRegistry.await_table`), for up to ``unknown_table_wait_seconds``; only then are its
mutations skipped, as Cassandra skips a dropped table's. A system table a schema file leaves out is
skipped at once.

A published table that a read of the node beside the agent's schema no longer has was dropped: a read may
lag behind the node's schema changes, never run ahead of them, and a table is only ever gone by a ``DROP``.
Only that node's reads count: another node's, read while it is down, may not have a table created moments
before yet. The registry keeps a dropped table in ``dropped`` until the agent has published the drop
(``drop_published``). The tables of the last such read are kept in the state directory (``TablesSeen``), so
that the first read after a start finds the tables dropped while the agent was stopped. A schema file that
leaves a table out does not say that it was dropped (it may be an edit): with a file, no drop is published.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import ssl
import time
import uuid
from typing import Any, Callable, Iterator

from ..schema import Schema, SchemaError, TableMetadata, load_schema_files
from ..schema.system_schema import VersionedSchema, fetch_versioned_schema, schema_version
from .agent_config import AgentConfig, CassandraSchemaSource, ConfigError
from .tables_seen import TablesSeen

log = logging.getLogger(__name__)
driver_log = logging.getLogger("cassandra_cdc.cassandra_driver")
# The driver's loggers that report connection attempts: each failed one with a traceback.
_DRIVER_CONNECTION_LOGGERS = ("cassandra.cluster", "cassandra.connection", "cassandra.pool")

# A table id given up on (unknown for longer than unknown_table_wait_seconds) is looked up again at most this
# often.
RELOAD_INTERVAL_SECONDS = 10.0
# While no node answers the first schema read, it is tried again this often.
UNREACHABLE_RETRY_SECONDS = 2.0
# While a mutation of an unknown table holds reading back, the schema is reloaded this often.
AWAIT_RELOAD_SECONDS = 1.0
# A changed schema file is read once it has stayed unchanged this long: an editor or a copy may still be
# writing it, and a half-written file could parse into a schema that lacks tables.
SETTLE_SECONDS = 0.5


class TableRegistry:
    def __init__(self, config: AgentConfig, loader: Callable[[], Schema] | None = None) -> None:
        """``loader``: reads the schema (default: from the config's source). One that reads the cluster's says
        whether the node beside the agent answered its last read (``node_beside_answered``, as
        ``ClusterSchemaReader``): only then is a table it lost taken for dropped."""
        self._config = config
        self._load = loader or _schema_loader(config)
        # Published tables the cluster's schema has lost, by id, until the agent has published their drop; the
        # published tables of the schema read last from the node beside the agent (at a start: as saved).
        self.dropped: dict[uuid.UUID, TableMetadata] = {}
        self._seen = TablesSeen(config.state_dir)
        self._beside: list[TableMetadata] | None = self._seen.load()
        self._beside_schema: Schema | None = None  # the schema those are of, once read
        # While the schema read last is another node's: when to read it again (monotonic).
        self._beside_read_due: float | None = None
        self._loaded_at = 0.0
        self._changed: tuple[tuple[int, int] | None, float] | None = None  # (new stamp, first seen at)
        self._unknown_logged: set[uuid.UUID] = set()
        # Ids still unknown after unknown_table_wait_seconds: their mutations are skipped without waiting.
        self._given_up: set[uuid.UUID] = set()
        # Per table id (its 16 bytes), for the schema loaded: what the per-record path needs of the table.
        self._routes: dict[bytes, Route] = {}
        # After a logged schema change that a read did not show yet: until when records are checked against
        # the schema loaded, and when to read it again (monotonic).
        self._checking_until: float | None = None
        self._read_again_at = 0.0
        self.schema = Schema()
        self._first_load()

    def _first_load(self) -> None:
        """Load the schema, waiting while no node of the cluster answers (a refusal of the agent's login or
        TLS is an error at once): one line when the wait starts, one when it ends."""
        since: float | None = None
        while True:
            try:
                self.reload()
            except CassandraUnreachable as error:
                if since is None:
                    since = time.monotonic()
                    log.warning("%s; the agent waits for a node to answer (trying every %.0f s)", error,
                                UNREACHABLE_RETRY_SECONDS)
                time.sleep(UNREACHABLE_RETRY_SECONDS)
                continue
            if since is not None:
                log.info("the cluster answered after %.0f s: schema read", time.monotonic() - since)
            return

    def reload(self) -> None:
        self._stamp = self._file_stamp()
        schema = self._load()
        self._loaded_at = time.monotonic()
        self._note_drops(schema)
        if schema is self.schema:
            return  # the schema read last, unchanged since
        self.schema = schema
        self._routes.clear()  # tables may have changed
        names = self.published_names()
        log.info("publishing %d CDC tables: %s", len(names), ", ".join(names) or "none")

    def _note_drops(self, schema: Schema) -> None:
        beside_answered = getattr(self._load, "node_beside_answered", None)
        if beside_answered is None:  # a schema file
            return
        if not beside_answered:
            if self._beside_read_due is None:
                log.info("the schema was read from another node than the one beside the agent (down, or "
                         "slow to answer): it is read again every %.0f s until that node answers, whose "
                         "reads alone show the tables dropped", RELOAD_INTERVAL_SECONDS)
            self._beside_read_due = time.monotonic() + RELOAD_INTERVAL_SECONDS
            return
        self._beside_read_due = None
        if schema is self._beside_schema:
            return
        self._beside_schema = schema
        previous, self._beside = self._beside, [table for table in schema if self.is_published(table)]
        for table in previous or ():
            if self.is_published(table) and schema.table_by_id(table.id) is None:
                self.dropped[table.id] = table
                log.info("%s (id %s) was dropped: publishing its drop", table.qualified_name, table.id)
        self._save_seen()

    def read_node_beside_when_due(self) -> None:
        """While the schema read last is not the node beside's, read it again every
        ``RELOAD_INTERVAL_SECONDS``, until that node answers: only its reads find the tables dropped meanwhile
        (at a start, those dropped while the agent was stopped)."""
        if self._beside_read_due is not None and time.monotonic() >= self._beside_read_due:
            self._reload_or_keep()

    def drop_published(self, table_id: uuid.UUID) -> None:
        """The agent published the drop of this table of ``dropped``: forget it."""
        del self.dropped[table_id]
        self._save_seen()

    def _save_seen(self) -> None:
        self._seen.save([*(self._beside or ()), *self.dropped.values()])

    def close(self) -> None:
        """Close the connection the schema is read on, if any."""
        close = getattr(self._load, "close", None)
        if close is not None:
            close()

    def reload_if_changed(self) -> None:
        """Reload when the schema file was modified since the last load and has settled.

        A file that cannot be read or parsed leaves the loaded schema in place (logged), until it changes again.
        """
        path = self._config.schema_.file
        stamp = self._file_stamp()
        if path is None or stamp == self._stamp:
            return
        now = time.monotonic()
        if self._changed is None or self._changed[0] != stamp:
            self._changed = (stamp, now)
            return
        if now - self._changed[1] < SETTLE_SECONDS:
            return
        log.info("schema file %s changed: reloading it", path)
        self._reload_or_keep()

    def _reload_or_keep(self) -> bool:
        """Reload while running: a schema that cannot be loaded now keeps the previous one rather than stopping
        the agent (it is tried again when the file changes or the next reload is due). Whether it loaded."""
        try:
            self.reload()
        except Exception as error:  # noqa: BLE001 - any loader's failure (parse, I/O, cluster unreachable)
            self._loaded_at = time.monotonic()
            log.error("the schema cannot be loaded (%s): keeping the schema loaded before", error)
            return False
        return True

    def schema_changed(self) -> None:
        """The node logged a schema change: reload, so later records use the new definition. Not rate-limited:
        the data that needs the change follows it at once, and DDL statements come close together (ALTER
        after CREATE), so a skipped reload would leave the next table unknown and its mutations skipped.

        The read may still lack the change: the node logs it before it applies it (a read in between sees the
        schema before; a node under load applies it seconds later), and a read can fail (the previous schema
        kept). A node applies its schema changes one at a time, in the order it logs them: a read that has a
        change newer than the last one read, with no earlier change in doubt, has this one. Otherwise
        ``may_lag`` says so for ``unknown_table_wait_seconds`` after the change (each later change in doubt
        starting it again), while the schema is read again every ``AWAIT_RELOAD_SECONDS``: no read can tell
        that it has the change (a read with a newer schema may have an earlier change only), so the records
        are checked against the schema loaded meanwhile, and one that names a column it lacks waits for the
        newer definition (``reload_for_undecodable``)."""
        before = self.schema
        if not self._reload_or_keep() or self.schema is before or self._checking_until is not None:
            now = time.monotonic()
            self._checking_until = now + self._config.unknown_table_wait_seconds
            self._read_again_at = now + AWAIT_RELOAD_SECONDS

    def may_lag(self) -> bool:
        """Whether the schema loaded may lack a schema change the node logged (see ``schema_changed``); reads
        it again when the time has come."""
        if self._checking_until is None:
            return False
        now = time.monotonic()
        if now >= self._checking_until:
            self._checking_until = None
            return False
        if now >= self._read_again_at:
            self._reload_or_keep()
            self._read_again_at = time.monotonic() + AWAIT_RELOAD_SECONDS
        return True

    def reload_for_undecodable(self, where: str, pause: Callable[[float], bool]) -> bool | None:
        """A mutation at ``where`` does not decode with the schema loaded, which may be older than the one its
        node wrote it with (see ``schema_changed``): read the schema again, waiting while it cannot be read,
        and while a logged change is in doubt (``may_lag``) until it differs (every ``AWAIT_RELOAD_SECONDS``,
        for up to ``unknown_table_wait_seconds``). True when the schema read differs from the one loaded
        before (decode again), False when not (the mutation is damaged), None when the agent stops meanwhile
        (``pause`` returned True)."""
        before = self.schema
        in_doubt = self.may_lag()
        loaded = self._reload_until(lambda loaded: loaded and (self.schema is not before or not in_doubt),
                                    pause)
        if loaded is None:
            return None
        if not loaded or self.schema is before:
            return False
        log.info("%s: a mutation that does not decode with the schema loaded: decoding it again with the "
                 "schema read now", where)
        return True

    def _reload_until(self, done: Callable[[bool], bool], pause: Callable[[float], bool]) -> bool | None:
        """Reload every ``AWAIT_RELOAD_SECONDS`` until ``done(whether the reload loaded)``, for up to
        ``unknown_table_wait_seconds``: True once done, False when the time ran out, None when the agent stops
        meanwhile (``pause(seconds)`` waits between reloads and returns True then)."""
        deadline = time.monotonic() + self._config.unknown_table_wait_seconds
        while not done(self._reload_or_keep()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if pause(min(AWAIT_RELOAD_SECONDS, remaining)):
                return None
        return True

    def _file_stamp(self) -> tuple[int, int] | None:
        path = self._config.schema_.file
        try:
            stat = path.stat() if path is not None else None
        except FileNotFoundError:
            return None
        return (stat.st_mtime_ns, stat.st_size) if stat else None

    def published_names(self) -> list[str]:
        """The names of the tables published, in order."""
        return sorted(t.qualified_name for t in self.schema if self.is_published(t))

    def is_published(self, table: TableMetadata) -> bool:
        return table.cdc and self._config.tables.accepts(table.qualified_name)

    def lookup(self, table_id: uuid.UUID) -> TableMetadata | None:
        """The table with this id, reloading the schema (rate-limited) when it is unknown."""
        table = self.schema.table_by_id(table_id)
        if table is None and time.monotonic() - self._loaded_at >= RELOAD_INTERVAL_SECONDS:
            self._reload_or_keep()
            table = self.schema.table_by_id(table_id)
        if table is None and table_id not in self._unknown_logged:
            self._unknown_logged.add(table_id)
            # A name-based id is one of Cassandra's own tables, which have no CDC: e.g. a system table that
            # a newer version added, logged by an upgraded node before its schema is read.
            log.log(logging.INFO if table_id.version == 3 else logging.WARNING,
                    "mutations of unknown table id %s are skipped (as Cassandra skips them) until the schema "
                    "has it", table_id)
        return table

    def await_table(self, table_id: uuid.UUID, where: str,
                    pause: Callable[[float], bool]) -> TableMetadata | None:
        """The table with this id, for a mutation at ``where`` (segment and offset) that names it: when the
        schema does not have it, reload the schema every ``AWAIT_RELOAD_SECONDS`` until it does, for up to
        ``unknown_table_wait_seconds``. ``pause(seconds)`` waits between reloads and returns True when the
        agent stops (then None: the mutation is read again after the restart). None as well for a table
        given up on: its mutations are skipped."""
        table = self.schema.table_by_id(table_id)
        if table is not None:
            return table
        # Cassandra gives the tables CREATE TABLE makes time-based ids (version 1), its own tables ids made
        # from their names (version 3): those of system tables a schema file leaves out are never waited for.
        if table_id.version != 1 or table_id in self._given_up:
            return self.lookup(table_id)
        wait = self._config.unknown_table_wait_seconds
        log.warning("%s: a mutation of table id %s, which the schema does not have: reading waits there "
                    "while the schema is reloaded, for up to %.0f s (unknown_table_wait_seconds)",
                    where, table_id, wait)
        if self._reload_until(lambda _: self.schema.table_by_id(table_id) is not None, pause) is None:
            return None
        table = self.schema.table_by_id(table_id)
        if table is not None:
            log.info("table id %s is %s: reading goes on", table_id, table.qualified_name)
            return table
        self._given_up.add(table_id)
        self._unknown_logged.add(table_id)
        log.error("%s: table id %s is still unknown after %.0f s: its mutations are skipped, as Cassandra "
                  "skips a dropped table's (if the table exists, give the agent its schema and raise "
                  "unknown_table_wait_seconds)", where, table_id, wait)
        return None

    def route(self, table_id: bytes) -> Route | None:
        """The table of an update, by its id bytes; None for a table the schema does not know (then see
        ``await_table``)."""
        route = self._routes.get(table_id)
        if route is None:
            table = self.schema.table_by_id(uuid.UUID(bytes=table_id))
            if table is None:
                return None
            route = self._routes[table_id] = Route(table, self.is_published(table))
        return route


class Route:
    """What the per-record path needs of a table, worked out once per schema load."""

    __slots__ = ("name", "published", "schema_change", "schema_published", "table")

    def __init__(self, table: TableMetadata, published: bool) -> None:
        self.table = table
        self.name = table.qualified_name
        self.published = published
        self.schema_change = table.keyspace == "system_schema"  # the node logged a CREATE/ALTER/DROP
        self.schema_published = False


def _schema_loader(config: AgentConfig) -> Callable[[], Schema]:
    source = config.schema_
    if source.file is not None:
        path = source.file

        def from_file() -> Schema:
            schema = load_schema_files([path])
            if not len(schema):
                raise SchemaError("no CREATE TABLE statement", str(path))
            return schema
        return from_file
    assert source.cassandra is not None
    return ClusterSchemaReader(source.cassandra)


class ClusterSchemaReader:
    """The cluster's schema, read from the node beside the agent over a connection kept open between reads
    (opened again after a failure). The node logs each of its schema changes as several ``system_schema``
    mutations, and an agent's start meets every one still in cdc_raw: a read at the schema version read last
    is answered with that schema, not read again."""

    def __init__(self, settings: CassandraSchemaSource) -> None:
        self._settings = settings
        self._node = _address(settings.contact_points[0])
        self._cluster: Any = None
        self._session: Any = None
        self._last: VersionedSchema | None = None
        self._read_at = 0.0  # when the schema was last read whole (monotonic)

    def _ask_node_beside_again(self) -> bool:
        """Whether to read the whole schema again although its version is the one read last: that read was
        another node's, at least ``RELOAD_INTERVAL_SECONDS`` ago (a read that says which node answered)."""
        return (self._last is not None and self._last.node != self._node
                and time.monotonic() - self._read_at >= RELOAD_INTERVAL_SECONDS)

    @property
    def node_beside_answered(self) -> bool:
        """Whether the schema read last is the node beside's (another node's while it is down)."""
        return self._last is not None and self._last.node == self._node

    def __call__(self) -> Schema:
        from cassandra import DriverException
        from cassandra.cluster import NoHostAvailable

        with driver_log_at_debug():
            try:
                if self._session is None:
                    self._cluster = cql_cluster(self._settings)
                    self._session = self._cluster.connect()
                if (self._last is None or self._ask_node_beside_again()
                        or schema_version(self._session, self._node) != self._last.version):
                    # The node beside the agent has applied every schema change its commit log holds (but for
                    # one it logged and is applying now: see TableRegistry.schema_changed).
                    read = fetch_versioned_schema(self._session, self._node)
                    self._read_at = time.monotonic()
                    if self._last is not None and read.version == self._last.version:  # the same schema
                        read = read._replace(schema=self._last.schema)
                    self._last = read
                return self._last.schema
            except (NoHostAvailable, DriverException, OSError) as error:
                self.close()
                failure = CassandraUnreachable if _nodes_unreachable(error) else ConfigError
                nodes = ", ".join(self._settings.contact_points)
                raise failure(_schema_read_failure(self._settings, nodes, error)) from None

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = None


def _address(host: str) -> str:
    """A contact point's IP address, as the driver names the node (the name itself if it does not resolve)."""
    try:
        return socket.getaddrinfo(host, None)[0][4][0]
    except OSError:
        return host


def _schema_read_failure(settings: CassandraSchemaSource, nodes: str, error: Exception) -> str:
    """One line on why no node answered the schema read."""
    from cassandra import AuthenticationFailed

    reasons = getattr(error, "errors", None)
    if not isinstance(reasons, dict) or not reasons:
        if settings.local_dc is not None:  # no node to ask: none is in the local datacenter
            return (f"schema.cassandra.local_dc: no node of datacenter {settings.local_dc} among {nodes}: "
                    "give the datacenter of the contact points")
        reasons = {}
    distrusted = _reasons(reasons, _node_not_trusted)
    if distrusted:
        return (f"schema.cassandra: the agent does not trust the certificate of {distrusted}; check "
                "schema.cassandra.tls.ca_file (the CA that signed the nodes' certificates) and "
                "verify_hostname")
    handshakes_refused = _reasons(reasons, _handshake_refused)
    if handshakes_refused:
        tls = settings.tls
        advice = ("the nodes may require a client certificate: give schema.cassandra.tls.cert_file and "
                  "key_file, signed by a CA of their client_encryption_options.truststore"
                  if tls is None or tls.cert_file is None else
                  "check schema.cassandra.tls.cert_file and key_file: the nodes accept client certificates "
                  "signed by a CA of their client_encryption_options.truststore")
        return (f"schema.cassandra: the nodes refused the agent's TLS connection: {handshakes_refused}; "
                f"{advice}")
    refused = _reasons(reasons, lambda problem: isinstance(problem, AuthenticationFailed))
    if refused:
        user = f"user {settings.username}" if settings.username else "a client without a user"
        return (f"schema.cassandra: the nodes refused the login of {user}: {refused}; check "
                "schema.cassandra.username and schema.cassandra.password (or password_file)")
    reason = "; ".join(f"{host}: {problem}" for host, problem in reasons.items()) or str(error)
    return f"schema.cassandra: cannot read the schema from {nodes} port {settings.port}: {reason}"


class CassandraUnreachable(ConfigError):
    """No node answered (connections refused or timed out): not a refusal of the agent's login or TLS."""


def _nodes_unreachable(error: Exception) -> bool:
    """Whether no node answered the agent at all, as opposed to refusing it (TLS, login)."""
    from cassandra import AuthenticationFailed, OperationTimedOut
    from cassandra.connection import ConnectionException

    reasons = getattr(error, "errors", None)
    problems = list(reasons.values()) if isinstance(reasons, dict) and reasons else [error]
    return all(isinstance(problem, (OSError, ConnectionException, OperationTimedOut))
               and not isinstance(problem, AuthenticationFailed)
               and not _node_not_trusted(problem) and not _handshake_refused(problem) for problem in problems)


def _reasons(reasons: dict[Any, Exception], kind: Callable[[Exception], bool]) -> str:
    """The hosts whose connection failed for a reason of ``kind``, with it: "host: reason; ..."."""
    return "; ".join(f"{host}: {problem}" for host, problem in reasons.items() if kind(problem))


# The driver reports a failed TLS handshake as text only (an OSError naming the last error), and a node's
# alert after it as the ssl module's error: OpenSSL's words for both are what tells them apart.
_NODE_NOT_TRUSTED = re.compile(r"CERTIFICATE_VERIFY_FAILED")
# A TLS alert from the node, or the connection closed in the handshake: Cassandra does either, depending on
# the TLS version and where the check fails, when it does not accept the client's certificate.
_HANDSHAKE_REFUSED = re.compile(r"\[SSL: \w*ALERT\w*\]|EOF occurred in violation of protocol")


def _node_not_trusted(problem: Exception) -> bool:
    return _NODE_NOT_TRUSTED.search(str(problem)) is not None


def _handshake_refused(problem: Exception) -> bool:
    return _HANDSHAKE_REFUSED.search(str(problem)) is not None


class _ToDebug(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        driver_log.debug("%s: %s", record.name, record.getMessage(), exc_info=record.exc_info)
        return False


@contextlib.contextmanager
def driver_log_at_debug() -> Iterator[None]:
    """The driver's connection lines at DEBUG: a schema read that fails is reported as one line with the
    driver's reasons (a ConfigError), not as the driver's warnings and tracebacks of each attempt."""
    to_debug = _ToDebug()
    loggers = [logging.getLogger(name) for name in _DRIVER_CONNECTION_LOGGERS]
    for logger in loggers:
        logger.addFilter(to_debug)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(to_debug)


def cql_cluster(settings: CassandraSchemaSource, only_node: str | None = None) -> Any:
    """A cassandra-driver ``Cluster`` as ``schema.cassandra`` says: login, TLS, and the local datacenter as
    the only one queried; or, with ``only_node``, that node alone (for what only it knows: its
    ``system.local``)."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy, WhiteListRoundRobinPolicy

    auth = PlainTextAuthProvider(settings.username, settings.password) if settings.username else None
    context = None
    if settings.tls is not None:
        tls = settings.tls
        context = ssl.create_default_context(cafile=str(tls.ca_file))
        context.check_hostname = tls.verify_hostname
        if tls.cert_file is not None:
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file), tls.key_password)
    if only_node is not None:
        contact_points, policy = [only_node], WhiteListRoundRobinPolicy([only_node])
    else:
        # Without local_dc the driver takes the contact points' datacenter as the local one.
        contact_points = settings.contact_points
        policy = TokenAwarePolicy(DCAwareRoundRobinPolicy(settings.local_dc))
    profile = ExecutionProfile(load_balancing_policy=policy)
    # The agent reads system_schema itself: the driver's own copy of the schema, refreshed at every schema
    # change while the connection is kept open, would be read for nothing.
    return Cluster(contact_points, port=settings.port, auth_provider=auth, ssl_context=context,
                   execution_profiles={EXEC_PROFILE_DEFAULT: profile}, schema_metadata_enabled=False)
