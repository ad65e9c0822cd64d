"""The fault injector of ``cassandra-cdc demo --chaos`` on real processes (``sleep``), killed with SIGKILL and
started again; the demo on the real system with it is tests/test_demo.py's real demo test."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
from rich.console import Console

from cassandra_cdc.demo.chaos import KINDS, ChaosError, FaultInjector, Target, child_target
from cassandra_cdc.demo.processes import ChildProcess
from cassandra_cdc.demo.runner import DemoBase, DemoError, DemoOptions

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
    """Two processes of each kind, by name ("<kind> <n>")."""
    made = {f"{kind} {n}": SleepingProcess() for kind in KINDS for n in (1, 2)}
    yield made
    for process in made.values():
        if process.running:
            process.kill()


def _targets(processes: dict[str, SleepingProcess]) -> list[Target]:
    return [Target(name.rsplit(maxsplit=1)[0], name, process.kill, process.restart)
            for name, process in processes.items()]


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
    rounds = 2 * len(KINDS)
    try:
        _run_until(first, rounds)
    finally:
        first.close()
    assert first.error is None
    kinds = [fault.kind for fault in first.faults[:rounds]]
    assert sorted(kinds[:len(KINDS)]) == sorted(KINDS) and sorted(kinds[len(KINDS):]) == sorted(KINDS), kinds
    killed = [fault.target for fault in first.faults]
    assert all(code == -signal.SIGKILL for process in processes.values() for code in process.exit_codes)
    assert sum(len(process.exit_codes) for process in processes.values()) == len(killed)
    assert all(process.running for process in processes.values()), "every killed process was started again"
    assert not first.down and all(fault.recovery_seconds is not None for fault in first.faults)
    for name in killed[:rounds]:
        assert f"chaos: kill -9 of {name} (fault" in "\n".join(lines)
        assert re.search(f"chaos: {name} ready again [0-9.]+ s after its kill", "\n".join(lines))
    assert re.fullmatch(rf"{len(killed)} faults injected \(seed 18\): agent \d+, pipeline \d+, kafka \d+, "
                        r"cassandra \d+, spark worker \d+; recovery p50 [0-9.]+ s, max [0-9.]+ s",
                        first.summary())

    again = FaultInjector(_targets(processes), INTERVAL, seed=18, report=lambda _: None, downtime=QUICK_RESTART)
    try:
        _run_until(again, rounds)
    finally:
        again.close()
    assert [fault.target for fault in again.faults[:rounds]] == killed[:rounds]


def test_rounds_cover_the_kinds_there_are_targets_of(processes: dict[str, SleepingProcess]) -> None:
    """Without a Spark cluster there is no Spark worker to kill: the rounds are of the other four kinds."""
    targets = [target for target in _targets(processes) if target.kind != "spark worker"]
    injector = FaultInjector(targets, INTERVAL, seed=3, report=lambda _: None, downtime=QUICK_RESTART)
    try:
        _run_until(injector, 8)
    finally:
        injector.close()
    kinds = [fault.kind for fault in injector.faults[:8]]
    assert sorted(kinds[:4]) == sorted(kinds[4:]) == ["agent", "cassandra", "kafka", "pipeline"], kinds
    assert re.fullmatch(r"\d+ faults injected \(seed 3\): agent \d+, pipeline \d+, kafka \d+, cassandra \d+; "
                        r"recovery p50 [0-9.]+ s, max [0-9.]+ s", injector.summary())


def test_with_a_limit_no_fault_after_the_last_and_finished_once_it_recovered(
        processes: dict[str, SleepingProcess]) -> None:
    recovered = threading.Event()

    def slow_restart(restart: Callable[[], None]) -> Callable[[], None]:
        def restart_when_allowed() -> None:
            recovered.wait(30)
            restart()
        return restart_when_allowed

    targets = [Target(t.kind, t.name, t.kill, slow_restart(t.restart)) for t in _targets(processes)]
    injector = FaultInjector(targets, INTERVAL, seed=5, report=lambda _: None, downtime=QUICK_RESTART,
                             limit=3)
    try:
        injector.start()
        deadline = time.monotonic() + 30
        while len(injector.faults) < 3:
            assert time.monotonic() < deadline, f"{len(injector.faults)} faults in 30 s"
            time.sleep(0.05)
        assert not injector.finished, "the last faults have not recovered yet"
        time.sleep(4 * INTERVAL)
        assert len(injector.faults) == 3 and not injector.finished
        recovered.set()
        deadline = time.monotonic() + 30
        while not injector.finished:
            assert time.monotonic() < deadline, f"not finished 30 s after the restarts: {injector.current}"
            time.sleep(0.05)
        time.sleep(2 * INTERVAL)
        assert len(injector.faults) == 3
    finally:
        recovered.set()
        injector.close()
    assert injector.error is None and all(process.running for process in processes.values())


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


def _restarts_before_giving_up(demo: DemoBase) -> int:
    """Let the demo's pipeline exit again and again; how many times the demo starts it before it fails."""
    assert demo.pipeline is not None
    demo.pipeline.start()
    while True:
        assert demo.pipeline.process is not None
        demo.pipeline.process.wait(60)
        try:
            demo._check_children()
        except DemoError as error:
            assert "pipeline exited with status 2" in str(error)
            return demo.pipeline_restarts


def test_each_broker_kill_allows_the_pipeline_one_more_exit(
        processes: dict[str, SleepingProcess], tmp_path: Path) -> None:
    """A pipeline that exits (here: its configuration is missing, status 2) is started again by the demo
    at most 3 times; under chaos, once more for each broker kill, as the broker's outage may be why."""
    def demo_with_a_failing_pipeline() -> DemoBase:
        demo = DemoBase(DemoOptions(workdir=tmp_path), Console(file=io.StringIO()))
        demo.pipeline = ChildProcess("pipeline", ["pipeline", "--config", str(tmp_path / "missing.yaml")],
                                     tmp_path / "pipeline.log")
        return demo

    assert _restarts_before_giving_up(demo_with_a_failing_pipeline()) == 3

    brokers = [target for target in _targets(processes) if target.kind == "kafka"]
    injector = FaultInjector(brokers, INTERVAL, seed=1, report=lambda _: None, downtime=QUICK_RESTART,
                             limit=2)
    demo = demo_with_a_failing_pipeline()
    demo.chaos = injector
    try:
        _run_until(injector, 2)
    finally:
        injector.close()
    assert _restarts_before_giving_up(demo) == 5


def test_a_child_is_not_started_again_once_the_demo_is_stopping(tmp_path: Path) -> None:
    """The supervisor of a child that exits while starting (here: a pipeline whose configuration is missing)
    stops starting it once the demo stops its children: one started after that would be left running."""
    pipeline = ChildProcess("pipeline", ["pipeline", "--config", str(tmp_path / "missing.yaml")],
                            tmp_path / "pipeline.log", ready_marker="pipeline running")
    stopping = threading.Event()
    lines: list[str] = []

    def stop_after_the_first_exit(line: str) -> None:
        lines.append(line)
        stopping.set()

    target = child_target("pipeline", pipeline, stop_after_the_first_exit, timeout=120, stopping=stopping)
    with pytest.raises(ChaosError, match="^pipeline not started again: the demo is stopping$"):
        target.restart()
    assert len(lines) == 1 and "pipeline exited with status 2 while starting" in lines[0], lines
    assert pipeline.exit_code == 2, "started once, never again"
    assert pipeline.log_path.read_text().count("error: ") == 1, pipeline.log_path.read_text()
