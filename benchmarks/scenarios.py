"""The long scenarios on real clusters, which `make test` leaves out to stay within its time: each is a test
module marked ``scenario`` (its checks are the scenario's), run here by pytest with what it prints (its
timings and counts). Record a run's figures in benchmarks/RESULTS.md.

    python benchmarks/scenarios.py                     # every scenario
    python benchmarks/scenarios.py rolling-upgrade     # one
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "rolling-upgrade": "tests/test_real_upgrade.py",  # 3 nodes from Cassandra 4.1 to 5.0 under load
    "kafka-failover": "tests/test_real_kafka_cluster.py",  # 3 brokers, leaders and coordinators killed
    "topology": "tests/test_real_topology.py",  # nodes join, are repaired, removed, decommissioned, replaced
    "two-datacenters": "tests/test_real_two_datacenters.py",  # 2 + 2 nodes, agents in both or in one
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"one of {', '.join(SCENARIOS)} (default: all)")
    arguments = parser.parse_args()
    unknown = [name for name in arguments.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"no scenario {', '.join(unknown)}: one of {', '.join(SCENARIOS)}")
    modules = [SCENARIOS[name] for name in arguments.scenarios or SCENARIOS]
    # Missing JVM artifacts fail the run instead of skipping it.
    environment = {**os.environ, "CASSANDRA_CDC_REQUIRE_JVM": "1"}
    command = [sys.executable, "-m", "pytest", "-m", "scenario", "-s", "-p", "no:cacheprovider", *modules]
    return subprocess.run(command, cwd=ROOT, env=environment, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
