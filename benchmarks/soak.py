"""The soak: the real demo under chaos for a long time, and what it cost.

Runs ``cassandra-cdc demo --chaos`` (:class:`cassandra_cdc.demo.real_runner.RealDemo` with its fault
injector, by default with the pipeline on a local Spark standalone cluster so that Spark workers are killed
too) at a steady write rate until ``--faults`` faults have been injected and have recovered, or for
``--minutes`` of writing; then the demo's own final check (the events replayed equal ``SELECT *`` at
CONSISTENCY ALL, none read twice by a read_committed consumer). Meanwhile every long-running process's
resident memory is sampled from ``/proc`` (the agents, the pipeline's driver, JVM and Python workers, the
broker, the nodes, the Spark master, workers and executors), by process group, as is the load average.

Printed at the end, and written to ``--output`` as a markdown block for benchmarks/RESULTS.md: faults by
kind with the time to recover (p50, max), rows lost or wrong (must be 0), events read twice (0), peak RSS
per process and whether it stayed flat (the median of the first fifth of the writing against that of the
last fifth), the check's result, the seed and the load average.

    python benchmarks/soak.py --faults 50 --fault-interval 20
    python benchmarks/soak.py --minutes 60 --fault-interval 60 --seed 7

Exit status: the demo's (0 once its check passed).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cassandra_cdc.demo import DemoOptions  # noqa: E402
from cassandra_cdc.demo.real_runner import DEFAULT_RATE, RealDemo  # noqa: E402
from cassandra_cdc.demo.table_check import CheckResult  # noqa: E402
from cassandra_cdc.demo.view import View  # noqa: E402

SAMPLE_SECONDS = 5.0
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
GROWTH_TOLERATED = 1.25  # last fifth's median RSS over the first fifth's: more is reported as growth
MIB = 1024 * 1024


@dataclass
class ProcessInfo:
    pid: int
    group: int
    command: str
    rss_bytes: int


def processes() -> list[ProcessInfo]:
    """Every process of this machine we may read, with its process group and resident memory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        command = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # from the state on: group 3rd, RSS pages 22nd
        if fields[0] == "Z":
            continue  # killed, not yet reaped: no memory
        found.append(ProcessInfo(int(entry.name), int(fields[2]), command, int(fields[21]) * PAGE_BYTES))
    return found


@dataclass
class MemorySamples:
    """RSS samples by label (a role and a kind of process: "pipeline: driver JVM"), each (time, bytes)."""

    series: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: collections.defaultdict(list))
    load: list[float] = field(default_factory=list)  # the 1-minute load average at each sample


class SoakDemo(RealDemo):
    """The real demo under chaos, sampled: memory and load while it runs, the last comparison of the tables
    with the events, and the final check's result."""

    def __init__(self, options: DemoOptions) -> None:
        super().__init__(options)
        self.samples = MemorySamples()
        self.result: CheckResult | None = None
        self.last_differences: dict[str, list[str]] = {}
        self.writing: tuple[float, float] | None = None  # monotonic start and end of the writing
        self._sampling = threading.Event()
        self._sampling_from = 0.0
        self._sampler = threading.Thread(target=self._sample, name="memory sampler", daemon=True)

    def _write(self, view: View) -> None:
        self._sampling_from = time.monotonic()
        self._sampler.start()
        try:
            super()._write(view)
        finally:
            self.writing = (self._sampling_from, time.monotonic())

    def _table_differences(self) -> dict[str, list[str]]:
        self.last_differences = super()._table_differences()
        return self.last_differences

    def _report(self, result: CheckResult | None) -> None:
        self.result = result
        super()._report(result)

    def _shutdown(self) -> None:
        self._sampling.set()
        if self._sampler.is_alive():
            self._sampler.join(30)
        super()._shutdown()

    def _groups(self) -> dict[int, str]:
        """The process group of each long-running process the demo started, by its leader's pid."""
        groups = {os.getpgrp(): "demo (event feed, workload)"}
        named = [(agent.process, agent.name) for agent in self.agents]
        if self.pipeline is not None:
            named.append((self.pipeline.process, "pipeline"))
        for popen, name in named:
            if popen is not None:
                groups[popen.pid] = name
        nodes = self.cluster.nodes if self.cluster else []
        workers = self.spark.workers if self.spark else []
        services = [(self.kafka, "Kafka broker"),
                    *((node, f"Cassandra node {node.address}") for node in nodes),
                    *((worker, f"Spark {worker.name}") for worker in workers)]
        for service, name in services:
            if service is not None and service.pid is not None:
                groups[service.pid] = name
        if self.spark is not None and self.spark.master_pid is not None:
            groups[self.spark.master_pid] = "Spark master"
        return groups

    def _sample(self) -> None:
        while not self._sampling.wait(SAMPLE_SECONDS):
            now = time.monotonic() - self._sampling_from
            groups = self._groups()
            totals: dict[str, int] = collections.Counter()
            for process in processes():
                role = groups.get(process.group)
                if role is not None:
                    label = f"{role}: {_kind(role, process, process.pid == process.group)}"
                    totals[label] += process.rss_bytes
            for label, rss in totals.items():
                self.samples.series[label].append((now, rss))
            self.samples.load.append(os.getloadavg()[0])


def _kind(role: str, process: ProcessInfo, leader: bool) -> str:
    """What a process is within its group: the pipeline's driver and workers, a Spark worker's executors."""
    jvm = process.command == "java"
    if role == "pipeline":
        return "driver JVM" if jvm else "driver (Python)" if leader else "Python workers"
    if role.startswith("Spark worker"):
        return "daemon JVM" if jvm and leader else "executor JVM" if jvm else "executor Python workers"
    return "JVM" if jvm else process.command


def _median_between(series: list[tuple[float, int]], start: float, end: float) -> float | None:
    values = [rss for at, rss in series if start <= at <= end]
    return statistics.median(values) if values else None


def memory_rows(demo: SoakDemo) -> list[str]:
    """A markdown row per process label: peak RSS, the first and last fifth's median, flat or growing."""
    assert demo.writing is not None
    # The samples' times count from the start of the writing.
    writing_seconds = demo.writing[1] - demo.writing[0]
    fifth = writing_seconds / 5
    rows = []
    for label, series in sorted(demo.samples.series.items()):
        peak = max(rss for _, rss in series)
        first = _median_between(series, 0, fifth)
        last = _median_between(series, writing_seconds - fifth, writing_seconds)
        if not first or not last:
            trend = "not running in both fifths"
        else:
            ratio = last / first
            trend = (f"{first / MIB:,.0f} → {last / MIB:,.0f} MiB ({ratio:.2f}×): "
                     + ("flat" if ratio <= GROWTH_TOLERATED else "**grows**"))
        rows.append(f"| {label} | {peak / MIB:,.0f} MiB | {trend} |")
    return rows


def fault_rows(demo: SoakDemo) -> list[str]:
    assert demo.chaos is not None
    rows = []
    for kind in demo.chaos.kinds:
        faults = [fault for fault in demo.chaos.faults if fault.kind == kind]
        times = [fault.recovery_seconds for fault in faults if fault.recovery_seconds is not None]
        recovery = f"{statistics.median(times):.1f} s | {max(times):.1f} s" if times else "– | –"
        rows.append(f"| {kind} | {len(faults)} | {len(times)} | {recovery} |")
    return rows


def results_section(demo: SoakDemo, arguments: argparse.Namespace, exit_code: int,
                    wall_seconds: float) -> str:
    chaos, result, status = demo.chaos, demo.result, demo.status
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = demo.samples.load
    compared = result is not None
    lost = sum(len(problems) for problems in demo.last_differences.values()) if compared else "not compared"
    duplicates = demo.feed.duplicates if compared and demo.feed is not None else "not counted"
    outcome = ("passed" if result is not None and result.passed else
               "FAILED" if result is not None else f"not reached (exit status {exit_code})")
    writing = (demo.writing[1] - demo.writing[0]) if demo.writing else 0.0
    lines = [
        f"### Soak, {when}: `benchmarks/soak.py {' '.join(sys.argv[1:])}`",
        "",
        f"- Seed {arguments.seed} (`--seed {arguments.seed}` repeats the faults); a fault every "
        f"{arguments.fault_interval:.0f} s; {arguments.rate:.0f} statements/s; pipeline "
        + ("on a Spark standalone cluster (a master, 2 workers of 1 core)" if arguments.spark_cluster
           else "in local[2]") + f"; {writing / 60:.1f} min of writing, {wall_seconds / 60:.1f} min in all.",
        f"- The check: **{outcome}**. {status.statements_total:,} statements "
        f"({demo.failed_statements:,} failed: timed out or too few replicas up), "
        f"{status.feed.total if status.feed else 0:,} events; rows lost or wrong at the last comparison: "
        f"**{lost}**; events read twice (read_committed): **{duplicates}**; the pipeline exited by itself "
        f"{demo.pipeline_restarts} times (restarted from its checkpoint).",
        f"- Load average (1 min) during the run: min {min(load, default=0):.1f}, median "
        f"{statistics.median(load) if load else 0:.1f}, max {max(load, default=0):.1f} on "
        f"{os.cpu_count()} cores, shared with other engineers' test runs.",
        "",
        f"{len(chaos.faults) if chaos else 0} faults:",
        "",
        "| kind | injected | recovered | recovery p50 | recovery max |",
        "|---|---|---|---|---|",
        *(fault_rows(demo) if chaos else []),
        "",
        f"Resident memory, sampled every {SAMPLE_SECONDS:.0f} s by process group (a killed process starts "
        "again small: its flatness is that of its last life):",
        "",
        "| process | peak RSS | median RSS, first → last fifth of the writing |",
        "|---|---|---|",
        *(memory_rows(demo) if demo.writing else []),
    ]
    if result is not None and result.failures:
        lines += ["", "Failures of the check:", "", "```", *result.failures, "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--faults", type=int, help="stop writing once this many faults have recovered")
    length.add_argument("--minutes", type=float, help="minutes of writing")
    parser.add_argument("--fault-interval", type=float, default=20.0, help="seconds between two faults")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="CQL statements per second")
    parser.add_argument("--seed", type=int, default=None, help="of the faults (default: random, printed)")
    parser.add_argument("--no-spark-cluster", dest="spark_cluster", action="store_false",
                        help="the pipeline in local[2] (no Spark worker faults)")
    parser.add_argument("--workdir", type=Path, default=Path("soak-data"))
    parser.add_argument("--catchup-timeout", type=float, default=900.0)
    parser.add_argument("--recovery-timeout", type=float, default=900.0,
                        help="seconds a killed process may take to be ready again before the soak fails")
    parser.add_argument("--output", type=Path, default=Path("soak-result.md"),
                        help="where the markdown block is written")
    arguments = parser.parse_args()
    if (arguments.faults is not None and arguments.faults < 1) or arguments.fault_interval <= 0:
        parser.error("--faults must be at least 1 and --fault-interval positive")
    if arguments.seed is None:
        arguments.seed = random.randrange(1_000_000)
    options = DemoOptions(workdir=arguments.workdir, check=True, rate=arguments.rate, seed=arguments.seed,
                          catchup_timeout=arguments.catchup_timeout, live=False, chaos=True,
                          fault_interval=arguments.fault_interval, faults=arguments.faults,
                          duration=None if arguments.minutes is None else arguments.minutes * 60,
                          spark_cluster=arguments.spark_cluster,
                          recovery_timeout=arguments.recovery_timeout)
    demo = SoakDemo(options)
    started = time.monotonic()
    exit_code = demo.run()
    section = results_section(demo, arguments, exit_code, time.monotonic() - started)
    print(section)
    arguments.output.write_text(section)
    print(f"written to {arguments.output}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
