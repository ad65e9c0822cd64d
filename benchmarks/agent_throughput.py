"""Agent throughput and latency: one agent process, the embedded broker, segments from a simulated 4.1 node.

(a) Throughput: N typical mutations (a 9-column table, 100-500 serialized bytes each, fixed seed) are
    written into COMPLETED segments by ``SimulatedNode``; the agent (``cassandra-cdc agent``, its own
    process) is started on an empty ``cdc_raw``, the segments and idx files are moved in, and the clock
    runs until the agent has deleted every segment, i.e. read it and had every record acknowledged by
    Kafka. Reported: mutations/s and MB/s of wall time, and per core: per CPU second of the agent process
    (all its threads, librdkafka's included; from /proc). MB = 10^6 bytes of segment data.
(b) Latency: with the agent running, the node writes at a steady rate and syncs every ``--sync-ms`` (each
    sync rewrites ``_cdc.idx``); a consumer in this process notes when each record becomes visible on the
    raw topic. Reported: percentiles of (record visible to a consumer) - (idx rewritten), over every
    mutation. The consumer, the writer and the broker share the machine with the agent.

Targets (from the issue): 100,000 mutations/s on one core; p99 latency under 200 ms.

    python benchmarks/agent_throughput.py                      # both, prints the figures
    python benchmarks/agent_throughput.py --mutations 500000 --results benchmarks/RESULTS.md
    python benchmarks/agent_throughput.py --profile            # also cProfile the agent (in-process)

This machine's speed moves by up to ~40% over a day (other tenants). Each throughput run is therefore preceded
by a fixed pure-Python reference loop, reported with it: a slow run beside a slow reference says the machine, not
the code, was slow. ``--runs`` repeats the throughput run on copies of the same segments.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition  # noqa: E402

from cassandra_cdc.agent import Agent, AgentConfig  # noqa: E402
from cassandra_cdc.commitlog import Mutation, MutationSerializer  # noqa: E402
from cassandra_cdc.kafka.topic_names import RAW_TOPIC_PARTITIONS  # noqa: E402
from cassandra_cdc.schema import parse_schema  # noqa: E402
from cassandra_cdc.simulator import EmbeddedBroker, Insert, SimulatedNode, to_mutation  # noqa: E402

THROUGHPUT_TARGET = 100_000  # mutations/s on one core
LATENCY_P99_TARGET = 0.200  # seconds
MB = 1_000_000
CLI = Path(sys.executable).parent / "cassandra-cdc"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SCHEMA_CQL = """
CREATE TABLE bench.users (id uuid, ts timestamp, bucket int, name text, email text, age int, score double,
    tags set<text>, attrs map<text, text>, PRIMARY KEY ((id), ts)) WITH cdc = true;
"""
SCHEMA = parse_schema(SCHEMA_CQL)
_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
          "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
          "whiskey", "xray", "yankee", "zulu"]
_SEGMENT_POSITION = struct.Struct(">qq")  # segment id, position: offset 20 of a raw record


# --- the workload -----------------------------------------------------------------------------------

def typical_mutations(count: int, seed: int = 1) -> list[Mutation]:
    """INSERTs of 5-9 columns (text, numbers, a set, a map) into bench.users: 100-500 bytes serialized."""
    rng = random.Random(seed)
    start = 1_700_000_000_000_000

    def words(low: int, high: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))
    mutations = []
    for i in range(count):
        values: dict[str, object] = {"id": uuid.UUID(int=rng.getrandbits(128), version=4),
                                     "ts": 1_700_000_000_000 + i, "name": words(1, 3)}
        optional = {"bucket": rng.randrange(64), "email": f"{words(1, 2).replace(' ', '.')}@example.com",
                    "age": rng.randint(18, 90), "score": rng.random() * 100,
                    "tags": {rng.choice(_WORDS) for _ in range(rng.randint(1, 4))},
                    "attrs": {rng.choice(_WORDS): words(1, 6) for _ in range(rng.randint(1, 5))}}
        for name in rng.sample(sorted(optional), rng.randint(3, 6)):
            values[name] = optional[name]
        mutations.append(to_mutation(Insert("bench.users", values, timestamp=start + i), SCHEMA))
    return mutations


@dataclass
class Segments:
    directory: Path  # the node's cdc_raw: COMPLETED segments and their idx files
    mutations: int
    logical_bytes: int  # what the idx files say: the segment data the agent reads
    body_sizes: list[int] = field(default_factory=list)


def write_segments(root: Path, mutations: list[Mutation], segment_mib: int, compression: str | None) -> Segments:
    node = SimulatedNode(root, "bench", SCHEMA, "4.1", segment_size=segment_mib << 20, compression=compression,
                         first_segment_id=1_000)
    sizes = []
    unsynced = 0
    for mutation in mutations:
        sizes.append(len(MutationSerializer.serialize(mutation, node.version)))
        node.write(mutation)
        unsynced += sizes[-1]
        if unsynced >= 1 << 20:  # a periodic sync every MiB or so
            node.sync()
            unsynced = 0
    node.close()
    logical = sum(int(p.read_text().split()[0]) for p in node.cdc_raw_dir.glob("*_cdc.idx"))
    return Segments(node.cdc_raw_dir, len(mutations), logical, sizes)


# --- the agent ------------------------------------------------------------------------------------

def agent_settings(broker: EmbeddedBroker, server: str, cdc_raw: Path, state: Path, schema: Path) -> dict:
    return {"server": server, "node_id": "bench", "cdc_raw": str(cdc_raw), "state_dir": str(state),
            "schema": {"file": str(schema)}, "kafka": {"bootstrap_servers": broker.bootstrap_servers},
            "metrics": {"port": 0}}


class AgentProcess:
    def __init__(self, settings: dict, work: Path) -> None:
        config = work / f"{settings['server']}.yaml"
        config.write_text(yaml.safe_dump(settings))
        self.log = work / f"{settings['server']}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([str(CLI), "agent", "--config", str(config), "--log-level", "WARNING"],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the agent process so far (every thread)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def thread_cpu(self) -> dict[str, float]:
        """CPU seconds so far per thread name (librdkafka names its threads rdk:*)."""
        usage: dict[str, float] = {}
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # the thread ended meanwhile
            kind = "rdk:broker*" if name.startswith("rdk:broker") else name
            usage[kind] = usage.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        return usage

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


def wait_for_topic(broker: EmbeddedBroker, topic: str, timeout: float = 60) -> list[int]:
    """The raw topic's partitions, once the agent has created all of them. Asked for as part of every topic's
    metadata: a request naming the topic would have the broker auto-create it with one partition first."""
    admin = broker.admin()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metadata = admin.list_topics(timeout=5).topics.get(topic)
        if metadata is not None and metadata.error is None and len(metadata.partitions) == RAW_TOPIC_PARTITIONS:
            return sorted(metadata.partitions)
        time.sleep(0.05)
    raise RuntimeError(f"topic {topic} did not appear with its {RAW_TOPIC_PARTITIONS} partitions")


def records_on(broker: EmbeddedBroker, topic: str, partitions: list[int]) -> int:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"bench-{uuid.uuid4()}"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
    finally:
        consumer.close()


def move_in(source: Path, cdc_raw: Path) -> None:
    """Segments first, then their idx files, as a node would make them appear."""
    for pattern in ("*.log", "*_cdc.idx"):
        for path in sorted(source.glob(pattern)):
            os.rename(path, cdc_raw / path.name)


# --- (a) throughput -------------------------------------------------------------------------------

@dataclass
class Throughput:
    mutations: int
    logical_bytes: int
    wall: float
    cpu: float
    threads: dict[str, float]  # CPU seconds per thread (name)
    reference_ns: float  # the machine's speed just before: ns per iteration of ``reference_loop``

    @property
    def per_core(self) -> float:
        return self.mutations / self.cpu

    def report(self) -> list[tuple[str, str]]:
        return [("mutations", f"{self.mutations:,}"), ("segment data", f"{self.logical_bytes / MB:.1f} MB"),
                ("wall time", f"{self.wall:.2f} s"), ("agent CPU time", f"{self.cpu:.2f} s"),
                ("mutations/s (wall)", f"{self.mutations / self.wall:,.0f}"),
                ("mutations/s per core (CPU)", f"{self.per_core:,.0f}"),
                ("MB/s (wall)", f"{self.logical_bytes / MB / self.wall:.1f}"),
                ("MB/s per core (CPU)", f"{self.logical_bytes / MB / self.cpu:.1f}"),
                ("CPU by thread", ", ".join(f"{name} {used:.2f} s" for name, used in self.threads.items())),
                ("machine reference loop", f"{self.reference_ns:.0f} ns per iteration")]


def reference_loop(iterations: int = 300_000) -> float:
    """ns per iteration of a fixed pure-Python loop of the agent's kind of work (slices, struct, CRC, a dict, a
    call): the machine's speed at the moment, best of three."""
    data = bytes(range(256)) * 2
    header = struct.Struct(">iI")
    counts: dict[int, int] = {}

    def step(i: int) -> int:
        size, _ = header.unpack_from(data, i & 255)
        counts[size & 7] = counts.get(size & 7, 0) + 1
        return zlib.crc32(data[i & 255:(i & 255) + 64]) ^ size

    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for i in range(iterations):
            step(i)
        best = min(best, time.perf_counter() - started)
    return best / iterations * 1e9


def measure_throughput(broker: EmbeddedBroker, segments: Segments, work: Path, schema: Path) -> Throughput:
    """One run: the segments are moved into the agent's cdc_raw (``segments.directory`` is left empty)."""
    reference_ns = reference_loop()
    server = f"tp{uuid.uuid4().hex[:8]}"
    cdc_raw = work / f"{server}-cdc_raw"
    cdc_raw.mkdir()
    agent = AgentProcess(agent_settings(broker, server, cdc_raw, work / f"{server}-state", schema), work)
    try:
        partitions = wait_for_topic(broker, f"{server}.raw")
        time.sleep(0.5)  # let it settle into its idle loop
        cpu0, threads0, wall0 = agent.cpu_seconds(), agent.thread_cpu(), time.monotonic()
        move_in(segments.directory, cdc_raw)
        while any(cdc_raw.iterdir()):
            if agent.process.poll() is not None:
                raise RuntimeError(f"the agent exited: {agent.log.read_text()[-2000:]}")
            time.sleep(0.01)
        wall, cpu = time.monotonic() - wall0, agent.cpu_seconds() - cpu0
        threads = {name: used - threads0.get(name, 0.0) for name, used in agent.thread_cpu().items()}
    finally:
        agent.stop()
    published = records_on(broker, f"{server}.raw", partitions)
    if published != segments.mutations:
        raise RuntimeError(f"{published} records on the raw topic, {segments.mutations} mutations written")
    return Throughput(segments.mutations, segments.logical_bytes, wall, cpu,
                      {name: used for name, used in sorted(threads.items(), key=lambda t: -t[1]) if used >= 0.01},
                      reference_ns)


def profile_agent(broker: EmbeddedBroker, segments: Segments, work: Path, schema: Path, top: int = 25) -> str:
    """The same run in this process under cProfile (the agent's own thread only)."""
    server = f"pf{uuid.uuid4().hex[:8]}"
    cdc_raw = work / f"{server}-cdc_raw"
    cdc_raw.mkdir()
    agent = Agent(AgentConfig.model_validate(agent_settings(broker, server, cdc_raw, work / f"{server}-st", schema)))
    profiler = cProfile.Profile()

    def run() -> None:
        profiler.enable()
        try:
            agent.run()
        finally:
            profiler.disable()
    thread = threading.Thread(target=run)
    thread.start()
    wait_for_topic(broker, f"{server}.raw")
    started = time.monotonic()
    move_in(segments.directory, cdc_raw)
    while any(cdc_raw.iterdir()):
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    agent.stop()
    thread.join()
    out = io.StringIO()
    out.write(f"profiled run: {segments.mutations:,} mutations in {elapsed:.2f} s (with cProfile overhead)\n")
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# --- (b) latency ----------------------------------------------------------------------------------

@dataclass
class Latency:
    samples: list[float]
    rate: int
    sync_ms: float
    seconds: float
    by_quarter: list[float]  # p99 of each quarter of the run, in write order
    agent_cpu: float  # the agent's CPU seconds per second of writing (1.0: a whole core)

    def percentile(self, p: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    def report(self) -> list[tuple[str, str]]:
        def ms(seconds: float) -> str:
            return f"{seconds * 1000:.1f} ms"
        return [("write rate", f"{self.rate:,} mutations/s, sync every {self.sync_ms:g} ms, {self.seconds:g} s"),
                ("samples", f"{len(self.samples):,}"),
                ("p50", ms(self.percentile(50))), ("p90", ms(self.percentile(90))),
                ("p99", ms(self.percentile(99))), ("max", ms(max(self.samples))),
                ("p99 by quarter of the run", ", ".join(ms(q) for q in self.by_quarter)),
                ("agent CPU while the node writes", f"{self.agent_cpu:.0%} of a core")]


def measure_latency(broker: EmbeddedBroker, work: Path, schema: Path, rate: int, sync_ms: float, seconds: float,
                    segment_mib: int) -> Latency:
    server = f"lt{uuid.uuid4().hex[:8]}"
    per_sync = max(1, round(rate * sync_ms / 1000))
    batches = int(seconds * 1000 / sync_ms)
    mutations = typical_mutations(per_sync * batches, seed=2)
    node = SimulatedNode(work / f"{server}-node", "bench", SCHEMA, "4.1", segment_size=segment_mib << 20,
                         first_segment_id=5_000)
    agent = AgentProcess(agent_settings(broker, server, node.cdc_raw_dir, work / f"{server}-state", schema), work)
    synced_at: dict[tuple[int, int], float] = {}
    order: list[tuple[int, int]] = []
    seen: dict[tuple[int, int], float] = {}
    done = threading.Event()
    try:
        partitions = wait_for_topic(broker, f"{server}.raw")
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"bench-{uuid.uuid4()}",
                             "fetch.wait.max.ms": 5, "enable.auto.commit": False})
        consumer.assign([TopicPartition(f"{server}.raw", p, OFFSET_BEGINNING) for p in partitions])

        def consume() -> None:
            while not (done.is_set() and len(seen) >= len(order)):
                for message in consumer.consume(10_000, 0.005):
                    if message.error() is None:
                        key = _SEGMENT_POSITION.unpack_from(message.value(), 20)
                        seen.setdefault(key, time.monotonic())
            consumer.close()
        reader = threading.Thread(target=consume)
        reader.start()
        time.sleep(1.0)  # the consumer has its assignment and the agent its idle loop
        next_sync = started = time.monotonic()
        cpu_before = agent.cpu_seconds()
        for batch in range(batches):
            pending = [node.write(m) for m in mutations[batch * per_sync:(batch + 1) * per_sync]]
            node.sync()  # rewrites _cdc.idx
            now = time.monotonic()
            for key in pending:
                synced_at[key] = now
            order.extend(pending)
            next_sync += sync_ms / 1000
            time.sleep(max(0.0, next_sync - time.monotonic()))
        agent_cpu = (agent.cpu_seconds() - cpu_before) / (time.monotonic() - started)
        done.set()
        reader.join(120)
        if reader.is_alive():
            raise RuntimeError(f"only {len(seen)} of {len(order)} records became visible")
    finally:
        done.set()
        agent.stop()
        node.close()
    samples = [seen[key] - synced_at[key] for key in order]
    quarter = len(samples) // 4
    by_quarter = [statistics.quantiles(samples[i * quarter:(i + 1) * quarter], n=100)[98] for i in range(4)]
    return Latency(samples, rate, sync_ms, seconds, by_quarter, agent_cpu)


# --- results --------------------------------------------------------------------------------------

def results_section(args: argparse.Namespace, sizes: list[int], runs: list[Throughput], latency: Latency | None,
                    notes: str) -> str:
    throughput = median_run(runs)
    compression = f" --compression {args.compression}" if args.compression else ""
    command = (f"python benchmarks/agent_throughput.py --mutations {args.mutations} "
               f"--segment-size {args.segment_size}{compression}")
    machine = (f"{time.strftime('%Y-%m-%d')}, {platform.python_implementation()} {platform.python_version()}, "
               f"{os.cpu_count()} cores, broker noida-db on loopback (same machine), load average "
               f"{os.getloadavg()[1]:.1f} over the last 5 minutes (other work on the machine inflates wall "
               f"times and latencies; the CPU figures are the agent's own)")
    workload = (f"Mutations: bench.users INSERTs, {min(sizes)}–{max(sizes)} bytes serialized "
                f"(mean {statistics.mean(sizes):.0f}), one raw record each; 4.1 segments of {args.segment_size} MiB.")
    lines = ["## Agent", "", f"`{command}` — {machine}.", "", workload, "",
             ("**(a) Throughput**, segment → acknowledged by Kafka (segment deleted), one agent process "
              f"(target {THROUGHPUT_TARGET:,} mutations/s on one core):"), "",
             "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in throughput.report()]
    if len(runs) > 1:
        lines += ["", f"The median of {len(runs)} runs; each run's mutations/s per core (reference loop): "
                  + ", ".join(f"{run.per_core:,.0f} ({run.reference_ns:.0f} ns)" for run in runs) + "."]
    if latency is not None:
        lines += ["", ("**(b) Latency**, idx rewritten → record visible to a consumer "
                       f"(target p99 < {LATENCY_P99_TARGET * 1000:.0f} ms):"), "",
                  "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in latency.report()]
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines) + "\n"


def median_run(runs: list[Throughput]) -> Throughput:
    return sorted(runs, key=lambda run: run.per_core)[len(runs) // 2]


def write_results(path: Path, section: str) -> None:
    """Replace this benchmark's section (``## Agent``) or append it at the end; other sections stay."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "## Agent"), None)
    if start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        text = "".join(lines[:start]) + section + ("\n" + "".join(lines[end:]) if end < len(lines) else "")
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutations", type=int, default=300_000, help="mutations for the throughput run")
    parser.add_argument("--segment-size", type=int, default=32, help="segment size in MiB (Cassandra: 32)")
    parser.add_argument("--compression", default=None, help="e.g. LZ4Compressor (default: plain segments)")
    parser.add_argument("--rate", type=int, default=5_000, help="latency run: mutations/s written")
    parser.add_argument("--sync-ms", type=float, default=20.0, help="latency run: sync (idx rewrite) period")
    parser.add_argument("--seconds", type=float, default=15.0, help="latency run: duration")
    parser.add_argument("--runs", type=int, default=3, help="throughput runs on copies of the same segments "
                                                             "(the median is reported)")
    parser.add_argument("--skip-latency", action="store_true", help="only measure throughput")
    parser.add_argument("--profile", action="store_true", help="also cProfile the agent on the same segments")
    parser.add_argument("--results", type=Path, default=None, help="write the figures to this markdown file "
                                                                    "(its '## Agent' section)")
    parser.add_argument("--notes", default="", help="text appended to the results section")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="agent-bench-"))
    try:
        schema = work / "schema.cql"
        schema.write_text(SCHEMA_CQL)
        print(f"generating {args.mutations:,} mutations ...", flush=True)
        started = time.monotonic()
        mutations = typical_mutations(args.mutations)
        segments = write_segments(work / "node", mutations, args.segment_size, args.compression)
        del mutations
        sizes = segments.body_sizes
        print(f"  {time.monotonic() - started:.1f} s; bodies {min(sizes)}-{max(sizes)} bytes "
              f"(mean {statistics.mean(sizes):.0f}), {segments.logical_bytes / MB:.1f} MB of segments", flush=True)
        with EmbeddedBroker(work / "broker") as broker:
            runs = []
            for run in range(1, args.runs + 1):
                copy = work / f"run-{run}"
                shutil.copytree(segments.directory, copy)
                runs.append(measure_throughput(broker, Segments(copy, segments.mutations, segments.logical_bytes),
                                               work, schema))
                print(f"  run {run}: {runs[-1].per_core:,.0f} mutations/s per core (reference loop "
                      f"{runs[-1].reference_ns:.0f} ns)", flush=True)
            print(f"\n(a) throughput, segment -> acknowledged in Kafka (median of {len(runs)} runs)")
            for name, value in median_run(runs).report():
                print(f"  {name:28} {value}")
            if args.profile:  # the last use of the generated segments: moved into its cdc_raw
                print("\n" + profile_agent(broker, segments, work, schema))
        latency = None
        if not args.skip_latency:
            # A broker of its own: one holding the throughput runs' records pauses to save them (p99 ×5).
            with EmbeddedBroker(work / "latency-broker") as broker:
                latency = measure_latency(broker, work, schema, args.rate, args.sync_ms, args.seconds,
                                          args.segment_size)
            print("\n(b) latency, idx rewritten -> record visible to a consumer")
            for name, value in latency.report():
                print(f"  {name:28} {value}")
        if args.results is not None:
            write_results(args.results, results_section(args, sizes, runs, latency, args.notes))
            print(f"\nwritten to {args.results}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
