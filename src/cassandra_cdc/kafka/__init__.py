"""Kafka, for every component: topic names, what goes on the topics between agent, bootstrap and pipeline,
and how they are read. Imports no Spark.

- ``raw_records``: the raw change records the agents (and bootstrap) publish and the pipeline consumes;
- ``schema_records``: the table schema records on the compacted schema topic; ``schema_catalog`` reads them;
- ``consume``: reading partitions with a consumer (offset ranges, what is queued, pausing at the end);
- ``admin``: creating the topics and the admin clients' settings;
- ``topic_names``: the topics' names (re-exported here).
"""

from .topic_names import RAW_TOPIC_PARTITIONS, ServerTopics, event_topic

__all__ = ["RAW_TOPIC_PARTITIONS", "ServerTopics", "event_topic"]
