"""Spark pipeline: Kafka source, merge of per-node changes, exactly-once Kafka sink."""
