"""A Kafka outage under a steady write load: the broker (real Apache Kafka) stopped for
``--outage-seconds``, then started again on the same port and data.

Two simulated 4.1 nodes write INSERTs at ``--rate`` per node (each with a primary key of its own), an agent
per node (``cassandra-cdc agent``, its own process) publishes them, and the pipeline (``cassandra-cdc
pipeline``, its own process, Python Kafka source, exactly once) turns them into events. After
``--warmup-seconds``, and once the pipeline has written events, the broker is stopped; the nodes go on
writing during the outage and for ``--warmup-seconds`` after it, then stop.
Reported:

- whether the pipeline and the agents waited (their processes never exited; the pipeline's lines saying it
  waits for Kafka and that Kafka is back),
- each agent's RSS, and the pipeline's (all its processes), before the outage, the highest during it, and
  after (from /proc, every second),
- the events a read_committed consumer sees against the inserts written: missing and duplicated (both must
  be 0).

    python benchmarks/kafka_outage.py                          # a 30 s outage
    python benchmarks/kafka_outage.py --outage-seconds 300     # the 5-minute one
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from cassandra_cdc.localcluster import KafkaBroker  # noqa: E402
from cassandra_cdc.schema import parse_schema  # noqa: E402
from cassandra_cdc.simulator import Insert, SimulatedNode, to_mutation  # noqa: E402

CLI = Path(sys.executable).parent / "cassandra-cdc"
SCHEMA_CQL = "CREATE TABLE bench.items (id int PRIMARY KEY, node text, payload text) WITH cdc = true;\n"
SCHEMA = parse_schema(SCHEMA_CQL)
SERVER = "outage"
EVENTS_TOPIC = f"{SERVER}.bench.items"
NODES = 2


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def session_rss_mib(session: int) -> float:
    """The RSS of every process of a session, added up: the pipeline is a driver, its JVM and the JVM's
    Python workers, all in the session it was started in."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == session:
                total += rss_mib(int(stat.parent.name))
        except (OSError, ValueError):
            continue  # the process ended meanwhile
    return total


class Writer(threading.Thread):
    """One node writing an INSERT of a new id every 1/rate s, synced (its idx rewritten) every 50 ms."""

    def __init__(self, root: Path, index: int, rate: int) -> None:
        super().__init__(name=f"node{index}", daemon=True)
        self.node = SimulatedNode(root / f"node{index}", f"node{index}", SCHEMA, "4.1", segment_size=1 << 20,
                                  first_segment_id=1_000 * (index + 1))
        self.index, self.rate = index, rate
        self.written = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        last_sync = started
        while not self.stopping.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.written < due:
                record_id = self.written * NODES + self.index
                values = {"id": record_id, "node": self.node.node_id, "payload": "x" * 100}
                self.node.write(to_mutation(Insert("bench.items", values, timestamp=time.time_ns() // 1000),
                                            SCHEMA))
                self.written += 1
            if time.monotonic() - last_sync >= 0.05:
                self.node.sync()
                last_sync = time.monotonic()
            time.sleep(0.01)
        self.node.sync()


def start_process(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("wb") as output:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def committed_ids(bootstrap_servers: str) -> Counter[int]:
    """The ids of every event of the events topic, read_committed, up to its last stable offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"bench-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    ids: Counter[int] = Counter()
    try:
        metadata = consumer.list_topics(EVENTS_TOPIC, timeout=30).topics[EVENTS_TOPIC]
        if metadata.error is not None:
            return ids
        consumer.assign([TopicPartition(EVENTS_TOPIC, partition, 0) for partition in metadata.partitions])
        pending = set(metadata.partitions)
        deadline = time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is not None:
                    pending.discard(message.partition())
                elif message.value() is not None:
                    ids[json.loads(message.value())["payload"]["after"]["id"]] += 1
    finally:
        consumer.close()
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outage-seconds", type=float, default=30.0,
                        help="how long the broker stays stopped")
    parser.add_argument("--warmup-seconds", type=float, default=40.0,
                        help="writing before the outage, and again after it")
    parser.add_argument("--rate", type=int, default=100, help="INSERTs per second per node")
    parser.add_argument("--max-buffered-mib", type=int, default=16,
                        help="each agent's kafka.max_buffered_bytes, in MiB (its bound on queued records)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="kafka-outage-") as directory:
        work = Path(directory)
        (work / "schema.cql").write_text(SCHEMA_CQL)
        with KafkaBroker(work / "kafka", heap="384m") as broker:
            writers = [Writer(work, index, args.rate) for index in range(NODES)]
            agents = []
            for writer in writers:
                config = work / f"{writer.node.node_id}.yaml"
                config.write_text(yaml.safe_dump({
                    "server": SERVER, "node_id": writer.node.node_id, "cdc_raw": str(writer.node.cdc_raw_dir),
                    "state_dir": str(work / f"state-{writer.node.node_id}"),
                    "schema": {"file": str(work / "schema.cql")}, "metrics": {"port": 0},
                    "kafka": {"bootstrap_servers": broker.bootstrap_servers, "raw_topic_partitions": 4,
                              "max_buffered_bytes": args.max_buffered_mib << 20}}))
                agents.append(start_process([str(CLI), "agent", "--config", str(config)],
                                            work / f"{writer.node.node_id}.log"))
            pipeline_config = work / "pipeline.yaml"
            pipeline_config.write_text(yaml.safe_dump({
                "server": SERVER, "checkpoint": str(work / "checkpoint"),
                "kafka": {"bootstrap_servers": broker.bootstrap_servers, "source": "python",
                          "max_offsets_per_trigger": 20_000},
                "spark": {"trigger_interval": "1 second"}}))
            pipeline_log = work / "pipeline.log"
            pipeline = start_process([str(CLI), "pipeline", "--config", str(pipeline_config)], pipeline_log)
            samples: dict[str, list[tuple[float, float]]] = {f"agent node{i}": [] for i in range(NODES)}
            samples["pipeline (driver, JVM, Python workers)"] = []
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(1.0):
                    for name, agent in zip(samples, agents):
                        if agent.poll() is None:
                            samples[name].append((time.monotonic(), rss_mib(agent.pid)))
                    if pipeline.poll() is None:
                        samples["pipeline (driver, JVM, Python workers)"].append(
                            (time.monotonic(), session_rss_mib(pipeline.pid)))
            sampler = threading.Thread(target=sample, daemon=True)
            try:
                for writer in writers:
                    writer.start()
                sampler.start()
                time.sleep(args.warmup_seconds)
                # Stopped mid-stream: once the pipeline has written events (Spark takes a while to start).
                deadline = time.monotonic() + 600
                while not committed_ids(broker.bootstrap_servers) and time.monotonic() < deadline:
                    if pipeline.poll() is not None:
                        sys.exit(f"the pipeline exited before the outage: see {pipeline_log}")
                    time.sleep(2)
                outage_start = time.monotonic()
                broker.stop()
                print(f"broker stopped for {args.outage_seconds:.0f} s", flush=True)
                time.sleep(args.outage_seconds)
                broker.start()
                outage_end = time.monotonic()
                print("broker started again", flush=True)
                time.sleep(args.warmup_seconds)
                for writer in writers:
                    writer.stopping.set()
                    writer.join()
                expected = {writer.index + NODES * i for writer in writers for i in range(writer.written)}
                deadline = time.monotonic() + 600
                while len(ids := committed_ids(broker.bootstrap_servers)) < len(expected):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(5)
                caught_up = time.monotonic()
                time.sleep(5)
                ids = committed_ids(broker.bootstrap_servers)
                named = [("pipeline", pipeline), *zip(samples, agents)]
                exited = {name: process.poll() for name, process in named if process.poll() is not None}
            finally:
                sampling.set()
                for process in (pipeline, *agents):
                    stop_process(process)
                for writer in writers:
                    writer.stopping.set()
            log_lines = pipeline_log.read_text(errors="replace").splitlines()
            waited = [line for line in log_lines if "Kafka at" in line and ("is unreachable" in line
                                                                            or "is back after" in line)]
            print(f"\noutage: {args.outage_seconds:.0f} s, {NODES} nodes writing {args.rate} INSERTs/s each")
            print(f"processes that exited during the run: {exited or 'none'}")
            print("the pipeline's lines about Kafka:" if waited else "the pipeline logged no wait for Kafka")
            for line in waited:
                print(f"  {line[:200]}")
            print(f"caught up {caught_up - outage_end:.0f} s after the broker was back")
            for name, points in samples.items():
                before = [rss for at, rss in points if at < outage_start]
                during = [rss for at, rss in points if outage_start <= at < outage_end]
                after = [rss for at, rss in points if at >= caught_up - 5]
                print(f"{name} RSS MiB: before {before[-1]:.0f}, during max {max(during):.0f} "
                      f"(last {during[-1]:.0f}), after {after[-1] if after else float('nan'):.0f}")
            missing = expected - set(ids)
            duplicated = sum(count - 1 for count in ids.values() if count > 1)
            unexpected = set(ids) - expected
            print(f"events: {len(expected)} inserts written, {len(set(ids))} distinct events read_committed, "
                  f"missing {len(missing)}, duplicated {duplicated}, unexpected {len(unexpected)}")
            sys.exit(0 if not (missing or duplicated or unexpected or exited) else 1)


if __name__ == "__main__":
    main()
