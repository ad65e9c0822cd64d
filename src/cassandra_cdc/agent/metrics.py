"""The agent's Prometheus metrics (one registry per agent, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.segments_pending = Gauge("cdc_agent_segments_pending", "Segments in cdc_raw not yet fully published",
                                      registry=r)
        self.bytes_behind = Gauge("cdc_agent_bytes_behind",
                                  "Bytes between the idx offsets and the acknowledged positions", registry=r)
        self.mutations_read = Counter("cdc_agent_mutations_read", "Mutations read, by table", ["table"], registry=r)
        self.records_published = Counter("cdc_agent_records_published", "Raw records acknowledged by Kafka, by table",
                                         ["table"], registry=r)
        self.skipped = Counter("cdc_agent_mutations_skipped", "Mutations of unknown tables skipped", registry=r)
        self.errors = Counter("cdc_agent_errors", "Damaged or undecodable entries, by kind", ["kind"], registry=r)
        self.delivery_latency = Histogram("cdc_agent_kafka_delivery_seconds", "Time from produce to acknowledgement",
                                          buckets=(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30),
                                          registry=r)
        self.cdc_raw_bytes = Gauge("cdc_agent_cdc_raw_bytes", "Bytes of segments in cdc_raw", registry=r)
        self.cdc_raw_usage = Gauge("cdc_agent_cdc_raw_usage_ratio", "cdc_raw bytes / cdc_total_space", registry=r)
        self.kafka_reachable = Gauge("cdc_agent_kafka_reachable", "1 when Kafka accepts records", registry=r)
        self.kafka_reachable.set(1)

    def serve(self, host: str, port: int) -> None:
        if port:
            start_http_server(port, addr=host, registry=self.registry)
