"""The fault injector of ``cassandra-cdc demo --chaos`` on real processes (``sleep``), killed with SIGKILL and
started again; the demo on the real system with it is tests/test_demo.py's real demo test."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from typing import Iterator

import pytest

from cassandra_cdc.demo.chaos import KINDS, ChaosError, FaultInjector, Target

INTERVAL = 0.3
QUICK_RESTART = (0.0, 0.05)


class SleepingProcess:
    """A real process to kill and start again."""

    def __init__(self) -> None:
        self.exit_codes: list[int] = []
        self.process = self._spawn()

    @staticmethod
    def _spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(["sleep", "300"])

    def kill(self) -> None:
        self.process.kill()
        self.exit_codes.append(self.process.wait(10))

    def restart(self) -> None:
        self.process = self._spawn()

    @property
    def running(self) -> bool:
        return self.process.poll() is None


@pytest.fixture
def processes() -> Iterator[dict[str, SleepingProcess]]:
    """Two processes of each kind, by name."""
    made = {f"{kind} {n}": SleepingProcess() for kind in KINDS for n in (1, 2)}
    yield made
    for process in made.values():
        if process.running:
            process.kill()


def _targets(processes: dict[str, SleepingProcess]) -> list[Target]:
    return [Target(name.split()[0], name, process.kill, process.restart) for name, process in processes.items()]


def _run_until(injector: FaultInjector, faults: int) -> None:
    injector.start()
    deadline = time.monotonic() + 60
    while len(injector.faults) < faults and injector.error is None:
        assert time.monotonic() < deadline, f"{len(injector.faults)} faults in 60 s"
        time.sleep(0.05)
    assert injector.stop_injecting(30), "every killed process is ready again"


def test_faults_come_in_rounds_of_every_kind_and_a_seed_repeats_them(
        processes: dict[str, SleepingProcess]) -> None:
    lines: list[str] = []
    first = FaultInjector(_targets(processes), INTERVAL, seed=18, report=lines.append, downtime=QUICK_RESTART)
    try:
        _run_until(first, 8)
    finally:
        first.close()
    assert first.error is None
    kinds = [fault.kind for fault in first.faults[:8]]
    assert sorted(kinds[:4]) == sorted(KINDS) and sorted(kinds[4:]) == sorted(KINDS), kinds
    killed = [fault.target for fault in first.faults]
    assert all(code == -signal.SIGKILL for process in processes.values() for code in process.exit_codes)
    assert sum(len(process.exit_codes) for process in processes.values()) == len(killed)
    assert all(process.running for process in processes.values()), "every killed process was started again"
    assert not first.down and all(fault.recovery_seconds is not None for fault in first.faults)
    for name in killed[:8]:
        assert f"chaos: kill -9 of {name} (fault" in "\n".join(lines)
        assert re.search(f"chaos: {name} ready again [0-9.]+ s after its kill", "\n".join(lines))
    assert re.fullmatch(rf"{len(killed)} faults injected \(seed 18\): agent \d+, pipeline \d+, kafka \d+, "
                        r"cassandra \d+; recovery p50 [0-9.]+ s, max [0-9.]+ s", first.summary())

    again = FaultInjector(_targets(processes), INTERVAL, seed=18, report=lambda _: None, downtime=QUICK_RESTART)
    try:
        _run_until(again, 8)
    finally:
        again.close()
    assert [fault.target for fault in again.faults[:8]] == killed[:8]


def test_no_fault_once_asked_to_stop(processes: dict[str, SleepingProcess]) -> None:
    injector = FaultInjector(_targets(processes), INTERVAL, seed=1, report=lambda _: None,
                             downtime=QUICK_RESTART)
    try:
        _run_until(injector, 2)
        injected = len(injector.faults)
        time.sleep(3 * INTERVAL)
        assert len(injector.faults) == injected
    finally:
        injector.close()


def test_a_process_that_does_not_start_again_is_an_error(processes: dict[str, SleepingProcess]) -> None:
    def refuse() -> None:
        raise OSError("no space left on device")

    targets = [Target(t.kind, t.name, t.kill, refuse) for t in _targets(processes)]
    injector = FaultInjector(targets, INTERVAL, seed=1, report=lambda _: None, downtime=QUICK_RESTART)
    try:
        _run_until(injector, 1)  # the first restart fails: no second fault is awaited
        deadline = time.monotonic() + 30
        while injector.error is None:
            assert time.monotonic() < deadline, "no error 30 s after a restart failed"
            time.sleep(0.05)
    finally:
        injector.close()
    assert isinstance(injector.error, ChaosError)
    failed = re.fullmatch("(.+) could not be started again after its kill: no space left on device",
                          str(injector.error))
    assert failed, injector.error
    assert failed.group(1) in injector.down, "it stays down: the demo stops with the error"
    assert all(fault.recovery_seconds is None for fault in injector.faults)
