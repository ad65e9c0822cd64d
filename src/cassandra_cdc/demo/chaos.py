"""``cassandra-cdc demo --chaos``: crashes of the real system's processes while the demo writes.

Every ``interval`` seconds one process gets ``SIGKILL``, as from a crash or the OOM killer, and is
started again a few seconds later on the same configuration and data (a fault may come while an earlier
one still recovers, but a process is killed again only once it is back):

- an agent (its whole process group), which resumes from its state directory;
- the pipeline (its process group: the driver, Spark's JVM and Python workers), which resumes from its
  checkpoint;
- the Kafka broker, on the same port and data directory (it recovers its logs at start);
- a Cassandra node, on the same data (it replays its commit log at start; writes at CONSISTENCY ALL fail
  while it is down);
- with the pipeline on a Spark standalone cluster, a Spark worker (its JVM alone: its executors exit by
  themselves), which registers with the master again as a new worker; the master gives the pipeline an
  executor there again.

The kinds come in rounds, each a shuffle of all the targets' kinds, so that any round of faults covers
every kind;
everything random comes from one seed, so that a run can be repeated (the same faults, as far as the
timing of recoveries allows). A fault's recovery time runs from
the kill until the process is ready again: an agent or the pipeline shows its ready marker in its log, the
broker answers metadata requests, the node answers CQL, the master lists the worker as alive.

The injector's threads (one schedules, one per fault kills and restarts) live until :meth:`close`, once
the demo has stopped everything: on Linux, a child started with ``PR_SET_PDEATHSIG`` (the demo's agents,
pipeline and JVMs) gets its signal when the *thread* that started it ends.
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from .processes import ChildProcess

log = logging.getLogger(__name__)

KINDS = ("agent", "pipeline", "kafka", "cassandra", "spark worker")
DOWNTIME_SECONDS = (2.0, 6.0)  # how long a killed process stays down before it is started again
RECOVERY_TIMEOUT = 300.0  # a restarted process not ready by then fails the demo
SUPERVISOR_PAUSE_SECONDS = 2.0  # before starting again a process that exited while starting


@dataclass(frozen=True)
class Target:
    """A process the injector may kill: ``kill`` is immediate, ``restart`` returns once it is ready again
    (raising if it cannot be)."""

    kind: str
    name: str
    kill: Callable[[], None]
    restart: Callable[[], None]


@dataclass
class Fault:
    kind: str
    target: str
    at: float  # seconds since the injector started
    recovery_seconds: float | None = None  # None: not recovered (yet)


class ChaosError(RuntimeError):
    """A killed process could not be started again; the message says which and why."""


def child_target(kind: str, child: ChildProcess, report: Callable[[str], None],
                 timeout: float = RECOVERY_TIMEOUT, stopping: threading.Event | None = None) -> Target:
    """An agent or the pipeline: killed with its process group, ready again when its log says so. One that
    exits while starting (the broker it needs is down too) is started again, as a supervisor would, but
    never once ``stopping`` is set (the demo stops its children: one started after would be left behind)."""

    def start() -> None:
        if stopping is not None and stopping.is_set():
            raise ChaosError(f"{child.name} not started again: the demo is stopping")
        child.start()

    def restart() -> None:
        deadline = time.monotonic() + timeout
        start()
        while not child.wait_until_ready(max(0.0, deadline - time.monotonic())):
            if child.exit_code is None:
                raise ChaosError(f"{child.name} not ready {timeout:.0f} s after its restart; the end of "
                                 f"{child.log_path}:\n{child.log_tail()}")
            report(f"chaos: {child.name} exited with status {child.exit_code} while starting; starting it "
                   f"again (its log: {child.log_path})")
            time.sleep(SUPERVISOR_PAUSE_SECONDS)
            start()

    return Target(kind, child.name, child.kill, restart)


class FaultInjector:
    """Kills and restarts ``targets`` in background threads; ``report`` gets one line per kill and per
    recovery; the demo reads ``down`` (names of the targets killed and not yet ready), ``faults`` and
    ``error``. A fault is due every ``interval`` seconds even while earlier ones recover (a broker
    killed while a node restarts), but a target is never killed again before it has recovered. With
    ``limit``, no fault after the ``limit``-th (:attr:`finished` once it has recovered)."""

    def __init__(self, targets: Sequence[Target], interval: float, seed: int, report: Callable[[str], None],
                 downtime: tuple[float, float] = DOWNTIME_SECONDS, limit: int | None = None) -> None:
        unknown = {target.kind for target in targets} - set(KINDS)
        if unknown or not targets:
            raise ValueError(f"targets of the kinds {KINDS} needed, got {sorted(unknown) or 'none'}")
        self.targets = list(targets)
        # In KINDS' order, so that a seed shuffles them the same way every time.
        self.kinds = tuple(kind for kind in KINDS if any(target.kind == kind for target in targets))
        self.limit = limit
        self.interval = interval
        self.downtime = downtime
        self.seed = seed
        self._report = report
        self._random = random.Random(seed)
        self._round: list[str] = []
        self.faults: list[Fault] = []
        self.down: dict[str, Fault] = {}  # by target name, each killed target until it is ready again
        self.error: ChaosError | None = None
        self._lock = threading.Lock()
        self._recovered = threading.Condition(self._lock)
        self._started_at = 0.0
        self._stop_injecting = threading.Event()
        self._release = threading.Event()  # the demo stopped everything: the threads may end
        self._threads = [threading.Thread(target=self._schedule, name="fault injector", daemon=True)]

    def start(self) -> "FaultInjector":
        self._started_at = time.monotonic()
        self._threads[0].start()
        return self

    def stop_injecting(self, timeout: float = RECOVERY_TIMEOUT) -> bool:
        """No new fault; wait until every killed process is ready again. False if one is not in time."""
        with self._recovered:
            self._stop_injecting.set()  # under the lock: a fault is either marked down already, or never
            return self._recovered.wait_for(lambda: not self.down or self.error is not None, timeout)

    def close(self) -> None:
        """Once the demo has stopped every process the injector may have started: end its threads."""
        self._stop_injecting.set()
        self._release.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(10)

    @property
    def finished(self) -> bool:
        """Whether the ``limit``-th fault has been injected and everything killed is ready again."""
        with self._lock:
            return self.limit is not None and len(self.faults) >= self.limit and not self.down

    @property
    def current(self) -> str:
        """What is down right now, for the live view."""
        now = time.monotonic() - self._started_at
        with self._lock:
            return ", ".join(f"{name} down for {now - fault.at:.0f} s" for name, fault in self.down.items())

    def _schedule(self) -> None:
        """Every ``interval`` seconds, a target that is up is killed and a thread of its own restarts it."""
        next_at = self._started_at + self.interval
        while not self._stop_injecting.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval
            if self.limit is not None and len(self.faults) >= self.limit:
                break
            target = self._next_target()
            if target is None:
                continue  # everything that could be killed is down already
            fault = Fault(target.kind, target.name, time.monotonic() - self._started_at)
            with self._lock:
                if self._stop_injecting.is_set():
                    break  # asked to stop while this fault was being chosen
                self.faults.append(fault)
                # Before the kill: the demo must not take the exit for a failure.
                self.down[target.name] = fault
            downtime = self._random.uniform(*self.downtime)
            thread = threading.Thread(target=self._inject, args=(target, fault, len(self.faults), downtime),
                                      name=f"fault {len(self.faults)}", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._release.wait()

    def _next_target(self) -> Target | None:
        """A target of the next kind in the round with one up (the round a shuffle of every kind)."""
        if not self._round:
            self._round = list(self.kinds)
            self._random.shuffle(self._round)
        for kind in list(self._round):
            candidates = [t for t in self.targets if t.kind == kind and t.name not in self.down]
            if candidates:
                self._round.remove(kind)
                return self._random.choice(candidates)
        return None

    def _inject(self, target: Target, fault: Fault, number: int, downtime: float) -> None:
        killed_at = time.monotonic()
        try:
            target.kill()
            self._report(f"chaos: kill -9 of {target.name} (fault {number}); it starts again in "
                         f"{downtime:.0f} s")
            time.sleep(downtime)
            target.restart()
            fault.recovery_seconds = time.monotonic() - killed_at
            self._report(f"chaos: {target.name} ready again {fault.recovery_seconds:.1f} s after its kill")
            with self._recovered:
                del self.down[target.name]
                self._recovered.notify_all()
        except Exception as error:  # noqa: BLE001 - reported by the demo, which then stops
            log.debug("fault %d: restarting %s failed", number, target.name, exc_info=True)
            with self._recovered:
                self.error = error if isinstance(error, ChaosError) else ChaosError(
                    f"{target.name} could not be started again after its kill: {error}")
                self._recovered.notify_all()
        finally:
            self._release.wait()

    def summary(self) -> str:
        """Faults by kind and the recovery times, one line."""
        by_kind = ", ".join(f"{kind} {sum(1 for f in self.faults if f.kind == kind)}" for kind in self.kinds)
        times = [f.recovery_seconds for f in self.faults if f.recovery_seconds is not None]
        recovery = (f"recovery p50 {statistics.median(times):.1f} s, max {max(times):.1f} s"
                    if times else "none recovered")
        return f"{len(self.faults)} faults injected (seed {self.seed}): {by_kind}; {recovery}"


__all__ = ["ChaosError", "Fault", "FaultInjector", "KINDS", "Target", "child_target"]
