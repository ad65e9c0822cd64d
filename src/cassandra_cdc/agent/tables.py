"""The tables the agent publishes: CDC-enabled ones from the schema, with the config's filter applied.

Table metadata comes from a CQL file or from the cluster's ``system_schema``, and is reloaded when a
mutation names a table id the agent does not know (a table created since it started).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Callable

from ..schema import Schema, TableMetadata, load_schema_files
from ..schema.system_schema import fetch_schema
from .config import AgentConfig

log = logging.getLogger(__name__)

# A table id nobody knows is looked up again at most this often.
RELOAD_INTERVAL_SECONDS = 10.0


class TableRegistry:
    def __init__(self, config: AgentConfig, loader: Callable[[], Schema] | None = None) -> None:
        self._config = config
        self._load = loader or _schema_loader(config)
        self._loaded_at = 0.0
        self._unknown_logged: set[uuid.UUID] = set()
        self.schema = Schema()
        self.reload()

    def reload(self) -> None:
        self.schema = self._load()
        self._loaded_at = time.monotonic()
        names = sorted(t.qualified_name for t in self.schema if self.is_published(t))
        log.info("publishing %d CDC tables: %s", len(names), ", ".join(names) or "none")

    def is_published(self, table: TableMetadata) -> bool:
        return table.cdc and self._config.tables.accepts(table.qualified_name)

    def lookup(self, table_id: uuid.UUID) -> TableMetadata | None:
        """The table with this id, reloading the schema (rate-limited) when it is unknown."""
        table = self.schema.table_by_id(table_id)
        if table is None and time.monotonic() - self._loaded_at >= RELOAD_INTERVAL_SECONDS:
            self.reload()
            table = self.schema.table_by_id(table_id)
        if table is None and table_id not in self._unknown_logged:
            self._unknown_logged.add(table_id)
            log.warning("mutations of unknown table id %s are skipped (as Cassandra skips them) "
                        "until the schema has it", table_id)
        return table


def _schema_loader(config: AgentConfig) -> Callable[[], Schema]:
    source = config.schema_
    if source.file is not None:
        path = source.file
        return lambda: load_schema_files([path])

    def from_cluster() -> Schema:
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import Cluster

        settings = source.cassandra
        assert settings is not None
        auth = PlainTextAuthProvider(settings.username, settings.password) if settings.username else None
        cluster = Cluster(settings.contact_points, port=settings.port, auth_provider=auth)
        try:
            return fetch_schema(cluster.connect())
        finally:
            cluster.shutdown()

    return from_cluster
