"""``cassandra-cdc demo``: the whole system live on one machine.

A simulated three-node cluster (RF=3) writes commit logs and ``cdc_raw`` as Cassandra 4.1 does; three
``cassandra-cdc agent`` processes and one ``cassandra-cdc pipeline`` process, started exactly as in
production (same commands, YAML configurations written to the work directory), turn them into change
events on an embedded Kafka-protocol broker; a live view shows what flows, and a final check replays
the events into tables and compares them with the simulator's independent model of the tables.

- ``check``: replaying events into tables and comparing them with the model (also used by the tests);
- ``feed``: the background consumer of the event topics behind the view and the check;
- ``view``: the live terminal view (rich), or periodic summary lines when not on a terminal;
- ``runner``: the processes, the workload and their lifecycle.
"""

from .table_check import CheckResult, compare_rows, normalized, replay
from .runner import DemoOptions, run_demo

__all__ = ["CheckResult", "DemoOptions", "compare_rows", "normalized", "replay", "run_demo"]
