"""The tables the agent publishes, as the node beside it had them at its last read, kept in the state
directory: a table dropped while the agent was stopped is one of them that the node lacks at the agent's start
(a node's schema only ever loses a table by a ``DROP``).

A table whose drop is found stays in the file until the agent has published the drop: an agent stopped in
between finds it again at its next start (the pipeline writes one ``DROP`` per table, whoever publishes it).
The file is written only when the tables or their definitions change. Losing it costs only the drops made
while the agent was stopped; so an unreadable or unwritable file is logged, not fatal.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

from ..schema import SchemaError, TableMetadata, parse_schema
from .positions import private_directory, replace_durably

log = logging.getLogger(__name__)

TABLES_FILE = "tables.json"
FILE_VERSION = 1


class TablesSeen:
    def __init__(self, state_dir: Path) -> None:
        self._state_dir = state_dir
        self.path = state_dir / TABLES_FILE
        self._saved: dict[str, str] = {}  # the file's tables: definition by id

    def load(self) -> list[TableMetadata] | None:
        """The tables saved last; None when there are none to go by (a first start, an agent of an earlier
        version, an unreadable file)."""
        if not self.path.exists():
            return None
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != FILE_VERSION:
                raise ValueError(f"version {data.get('version')} is not {FILE_VERSION}")
            definitions = dict(data["tables"])
            tables = [_table(uuid.UUID(table_id), ddl, self.path) for table_id, ddl in definitions.items()]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.error("%s: unreadable (%s): a table dropped while the agent was stopped gets no drop; the file is "
                      "written again at the next schema read", self.path, error)
            return None
        self._saved = definitions
        return tables

    def save(self, tables: list[TableMetadata]) -> None:
        """Keep these tables (written durably, if they differ from those kept)."""
        definitions = {str(table.id): table.ddl() for table in tables}
        if definitions == self._saved:
            return
        text = json.dumps({"version": FILE_VERSION, "tables": definitions}, indent=1)
        try:
            private_directory(self._state_dir)
            replace_durably(self.path, text)
        except OSError as error:
            log.error("%s: cannot save the tables published (%s): a table dropped while the agent is stopped "
                      "would get no drop", self.path, error.strerror or error)
            return
        self._saved = definitions


def _table(table_id: uuid.UUID, ddl: str, path: Path) -> TableMetadata:
    table = parse_schema(ddl, source=str(path)).table_by_id(table_id)
    if table is None:
        raise SchemaError(f"the definition of table {table_id} does not define it", str(path))
    return table
