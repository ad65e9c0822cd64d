"""The node's own settings, read by CQL from ``system_views.settings`` of the node beside the agent.

``max_mutation_size`` sizes the raw topic's records (``record_size.py``). What the agent does about space and
loss depends on the others: Cassandra acts once ``cdc_raw`` plus a new segment would exceed
``cdc_total_space``; with ``cdc_block_writes: true`` (the default, and the only behaviour of 4.0) it then rejects
writes to CDC tables, with ``false`` (4.1+) it deletes its oldest segments in ``cdc_raw``, published or not.
Reading them from the node spares the operator repeating them in the agent's configuration, where they would
drift. With a schema file there is no CQL connection: the configuration's values (or Cassandra's defaults)
stand in.

4.1 and 5.0 name the sizes ``cdc_total_space``, ``commitlog_segment_size`` and ``max_mutation_size`` with a
unit (``4096MiB``); 4.0 names them ``cdc_total_space_in_mb``, ``commitlog_segment_size_in_mb`` and
``max_mutation_size_in_kb`` (a number of the unit the name says) and has no ``cdc_block_writes``. Unset,
``max_mutation_size`` is half of ``commitlog_segment_size``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Mapping

from .agent_config import AgentConfig, CassandraSchemaSource
from .tables import cql_cluster, driver_log_at_debug

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Cassandra's defaults, for an agent given a schema file and none of the settings.
DEFAULT_CDC_TOTAL_SPACE_MIB = 4096
DEFAULT_COMMITLOG_SEGMENT_SIZE_MIB = 32

CONFIGURED = "the agent's configuration"
# Each size setting by its names: 4.1+'s, then 4.0's (whose suffix says its unit).
_SIZES = {"cdc_total_space": "cdc_total_space_in_mb", "commitlog_segment_size": "commitlog_segment_size_in_mb",
          "max_mutation_size": "max_mutation_size_in_kb"}
_NAMES = ("cdc_enabled", "cdc_block_writes", *_SIZES, *_SIZES.values())
_UNITS = {"B": 1, "KiB": 1024, "MiB": MIB, "GiB": 1024 * MIB}
_NAMED_UNITS = {"_in_kb": 1024, "_in_mb": MIB}
_DATA_STORAGE = re.compile(r"\s*([0-9]+)\s*(B|KiB|MiB|GiB)\s*")


@dataclass(frozen=True)
class NodeSettings:
    cdc_enabled: bool
    cdc_block_writes: bool
    cdc_total_space: int  # bytes
    commitlog_segment_size: int  # bytes
    max_mutation_size: int  # bytes
    source: str  # where they come from, for the log: "node 127.0.0.1" or "the agent's configuration"

    @property
    def where(self) -> str:
        """``source`` after a setting's value: "on node 127.0.0.1", "in the agent's configuration"."""
        return f"in {self.source}" if self.source == CONFIGURED else f"on {self.source}"

    @property
    def action_point(self) -> int:
        """The bytes in cdc_raw past which the node acts on its next segment (rejects writes to CDC tables, or
        deletes its oldest segments): a new segment is allowed only while it fits in cdc_total_space."""
        return self.cdc_total_space - self.commitlog_segment_size

    def describe_action(self) -> str:
        if self.cdc_block_writes:
            return "rejects writes to CDC tables"
        return "deletes its oldest CDC segments, published or not (cdc_block_writes: false)"


def configured_settings(config: AgentConfig) -> NodeSettings:
    """The settings the agent's configuration gives (Cassandra's defaults for those it does not)."""
    segment = (config.commitlog_segment_size_mb or DEFAULT_COMMITLOG_SEGMENT_SIZE_MIB) * MIB
    return NodeSettings(
        cdc_enabled=True,
        cdc_block_writes=config.cdc_block_writes if config.cdc_block_writes is not None else True,
        cdc_total_space=(config.cdc_total_space_mb or DEFAULT_CDC_TOTAL_SPACE_MIB) * MIB,
        commitlog_segment_size=segment,
        max_mutation_size=config.max_mutation_size_mb * MIB if config.max_mutation_size_mb else segment // 2,
        source=CONFIGURED)


def parse_data_storage(name: str, text: str) -> int:
    """Bytes of a Cassandra data storage setting (``256MiB``; 4.0's ``*_in_mb`` and ``*_in_kb`` settings: a
    number of the unit the name says)."""
    unit = next((size for suffix, size in _NAMED_UNITS.items() if name.endswith(suffix)), None)
    if unit is not None and text.strip().isdigit():
        return int(text) * unit
    match = _DATA_STORAGE.fullmatch(text)
    if match is None:
        raise ValueError(f"system_views.settings: {name} = {text!r} is not a size such as 256MiB")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_settings(rows: Mapping[str, str | None], source: str) -> NodeSettings:
    """NodeSettings from ``system_views.settings`` rows (name -> value)."""
    sizes: dict[str, int] = {}
    for name, old_name in _SIZES.items():
        for key in (name, old_name):
            value = rows.get(key)
            if value not in (None, "", "null"):
                sizes[name] = parse_data_storage(key, value)  # type: ignore[arg-type]
                break
    for name in ("cdc_total_space", "commitlog_segment_size"):
        if name not in sizes:
            raise ValueError(f"system_views.settings has no {name} (nor {_SIZES[name]})")
    segment = sizes["commitlog_segment_size"]
    return NodeSettings(cdc_enabled=(rows.get("cdc_enabled") or "false").lower() == "true",
                        cdc_block_writes=(rows.get("cdc_block_writes") or "true").lower() == "true",
                        cdc_total_space=sizes["cdc_total_space"], commitlog_segment_size=segment,
                        max_mutation_size=sizes.get("max_mutation_size", segment // 2), source=source)


def read_node_settings(settings: CassandraSchemaSource) -> NodeSettings:
    """The settings of the node beside the agent (``schema.cassandra``'s first contact point). Raises the
    driver's error (or ``OSError``) when it does not answer, ``ValueError`` when a value does not parse."""
    node = settings.contact_points[0]
    with driver_log_at_debug():
        cluster: Any = cql_cluster(settings, only_node=node)
        try:
            session = cluster.connect()
            names = ", ".join(f"'{name}'" for name in _NAMES)
            rows = session.execute(f"SELECT name, value FROM system_views.settings WHERE name IN ({names})")
            return parse_settings({row.name: row.value for row in rows}, f"node {node}")
        finally:
            cluster.shutdown()


def check_against_configuration(node: NodeSettings, config: AgentConfig) -> None:
    """Say where the configuration repeats a setting with another value than the node's (the node's wins)."""
    given = {"cdc_total_space_mb": (config.cdc_total_space_mb, node.cdc_total_space / MIB),
             "commitlog_segment_size_mb": (config.commitlog_segment_size_mb, node.commitlog_segment_size / MIB),
             "max_mutation_size_mb": (config.max_mutation_size_mb, node.max_mutation_size / MIB),
             "cdc_block_writes": (config.cdc_block_writes, node.cdc_block_writes)}
    for key, (configured, actual) in given.items():
        if configured is not None and configured != actual:
            log.warning("%s is %s in the agent's configuration but %s on %s: the node's value is used", key,
                        configured, f"{actual:g}" if isinstance(actual, float) else actual, node.source)


def warn_about(node: NodeSettings) -> None:
    """The start's lines on settings that put changes at risk."""
    log.info("CDC settings %s: cdc_total_space %d MiB, commitlog_segment_size %d MiB, cdc_block_writes %s: "
             "the node %s once cdc_raw holds %d MiB", node.where, node.cdc_total_space // MIB,
             node.commitlog_segment_size // MIB, str(node.cdc_block_writes).lower(), node.describe_action(),
             node.action_point // MIB)
    if not node.cdc_enabled:
        log.warning("cdc_enabled is false %s: the node writes nothing to cdc_raw, and the agent has nothing "
                    "to publish; set cdc_enabled: true in its cassandra.yaml", node.where)
    if not node.cdc_block_writes:
        log.warning("cdc_block_writes is false %s: once cdc_raw holds %d MiB the node deletes its oldest CDC "
                    "segments whether the agent has published them or not, so a stopped or slow agent loses "
                    "changes (each loss is an error line and counted in "
                    "cassandra_cdc_agent_segments_lost_total)",
                    node.where, node.action_point // MIB)
    if node.action_point < node.commitlog_segment_size:
        log.warning("cdc_total_space (%d MiB) holds fewer than two commit log segments of %d MiB %s: the "
                    "node %s as soon as one segment waits to be published", node.cdc_total_space // MIB,
                    node.commitlog_segment_size // MIB, node.where, node.describe_action())
