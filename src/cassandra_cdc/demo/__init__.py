"""``cassandra-cdc demo``: the whole system live on one machine.

Three real Cassandra 5.0 nodes (RF=3) and a real Kafka broker (``real_runner``), or, with
``--simulated``, a simulated three-node cluster writing commit logs and ``cdc_raw`` as Cassandra 4.1
does and an embedded Kafka-protocol broker (``runner``); three ``cassandra-cdc agent`` processes and
one ``cassandra-cdc pipeline`` process, started exactly as in production (same commands, YAML
configurations written to the work directory), turn the writes into change events; a live view shows
what flows, and a final check replays the events into tables and compares them with what the tables
hold: ``SELECT *`` at CONSISTENCY ALL on the real cluster, the simulator's independent model otherwise.

- ``table_check``: replaying events into tables and comparing them with the tables (also used by tests);
- ``cql_workload``: the CQL workload for a real cluster and its tables read back in event shapes
  (shared with the real end-to-end test);
- ``feed``: the background consumer of the event topics behind the view and the check;
- ``view``: the live terminal view (rich), or periodic summary lines when not on a terminal;
- ``runner``, ``real_runner``: the processes, the workload and their lifecycle.
"""

from .table_check import CheckResult, compare_rows, normalized, replay
from .runner import DemoOptions, run_demo

__all__ = ["CheckResult", "DemoOptions", "compare_rows", "normalized", "replay", "run_demo"]
