"""The merge engine, free of Spark: each replica's partition updates reconciled per primary key by Cassandra's
own rules (``reconcile``), into state kept per partition (``partition_state``), read back as full rows
(``table_view``, ``clustering``) and as the changes between them (before/after, TTL expiries included).
"""
