"""Change events as consumers read them: Debezium-style envelopes in Kafka Connect JSON or Avro
(``event_encoder``), CQL values mapped to their fields (``field_mapping``), and one-line text of an event for
people (``event_text``).
"""
