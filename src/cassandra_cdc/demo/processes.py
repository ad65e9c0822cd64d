"""The demo's child processes: ``cassandra-cdc agent`` and ``cassandra-cdc pipeline``, started as in production.

Each runs in its own session (process group), so a Ctrl-C in the terminal reaches only the demo, which
then stops them in order; each writes its log to a file. Stopping sends the process's own clean-stop
signal, waits, and only then kills the whole group (a pipeline's JVM and Python workers included).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# The command line of the children: the installed ``cassandra-cdc`` command, run by this interpreter.
COMMAND = [sys.executable, "-m", "cassandra_cdc"]
PR_SET_PDEATHSIG = 1


def _terminate_with_parent() -> None:
    """In the child before exec: get SIGTERM when the demo dies without stopping it (``kill -9``, a CI timeout);
    being in its own session, it would otherwise run on. Linux only (``prctl(PR_SET_PDEATHSIG)``)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcess:
    """One ``cassandra-cdc`` subcommand running in the background, its output in ``log_path``.

    ``ready_marker``: a text its log shows once it is up (None: up as soon as it runs).
    """

    def __init__(self, name: str, arguments: list[str], log_path: Path, ready_marker: str | None = None) -> None:
        self.name = name
        self.arguments = arguments
        self.log_path = log_path
        self.ready_marker = ready_marker
        self._ready = ready_marker is None
        self._log_scanned = 0
        self._ready_lock = threading.Lock()  # the demo's fault injector restarts and awaits it too
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def command_line(self) -> str:
        return "cassandra-cdc " + " ".join(self.arguments)

    def start(self) -> "ChildProcess":
        """Start it (again, after it exited: ready once its log, appended to, shows the marker again); nothing
        if it runs (the demo and its fault injector may both restart it)."""
        if self.exit_code is None and self.process is not None:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._ready_lock:
            self._ready = self.ready_marker is None
            self._log_scanned = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([*COMMAND, *self.arguments], stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                            preexec_fn=_terminate_with_parent)
        return self

    @property
    def exit_code(self) -> int | None:
        """None while running (or before ``start``)."""
        return None if self.process is None else self.process.poll()

    @property
    def ready(self) -> bool:
        """Whether its log shows it is up (read incrementally, only until it does)."""
        with self._ready_lock:
            if not self._ready and self.log_path.exists():
                with open(self.log_path, "rb") as log:
                    log.seek(max(0, self._log_scanned - len(self.ready_marker or "")))
                    chunk = log.read()
                    self._log_scanned = log.tell()
                self._ready = (self.ready_marker or "").encode() in chunk
            return self._ready

    def wait_until_ready(self, timeout: float) -> bool:
        """Until it is ready (True), exits or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            if self.exit_code is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    @property
    def state(self) -> str:
        code = self.exit_code
        if self.process is None:
            return "not started"
        if code is not None:
            return f"exited ({code})"
        return "running" if self.ready else "starting"

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Send ``sig`` and wait up to ``timeout`` s; then kill its process group. Return its exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            try:
                process.send_signal(sig)
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_group(signal.SIGKILL)
                process.wait(10)
        self._reap_group()
        return process.returncode

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process (not its group) if it runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self._kill_group(signal.SIGKILL)
            self.process.wait(10)

    def _reap_group(self, timeout: float = 15.0) -> None:
        """Wait for what the process started (a JVM, its Python workers) to go; kill what stays."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._kill_group(0):
                return
            time.sleep(0.2)
        self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: int) -> bool:
        """Signal the process group; False when it no longer exists."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        kept = [line for line in text.splitlines() if "GLIBC_2.39" not in line]
        return "\n".join(kept[-lines:])
