"""The Spark layer of the pipeline: the Kafka source (``kafka_source``), the stateful operator that feeds the
merge engine (``change_processor``), the exactly-once event writes (``event_sink``), the session
(``spark_session``) and the streaming job (``streaming_job``). The merge itself is ``cassandra_cdc.merge``.
"""
