"""One JVM program run in the background: started, awaited on a TCP port, stopped, killed.

The JVM's stdout and stderr go to ``<log_directory>/stdout.log``; errors carry the tail of that file and
of the program's own log. On Linux the JVM gets SIGKILL when the thread that started it dies, so a test
run that is itself killed leaves no JVM behind (start it from a thread that outlives it, e.g. the main one).
"""

from __future__ import annotations

import abc
import ctypes
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Self, Sequence

from ..simulator.broker import free_port

_PR_SET_PDEATHSIG = 1
_TCP_LISTEN = "0A"  # a socket's state in /proc/net/tcp
# Looked up before any fork: the child, between fork and exec, only calls it.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None

# A test service's JVM: C1 only (it starts sooner), a serial collector, no window system.
SERVICE_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
               "-Djava.awt.headless=true"]


class JvmError(RuntimeError):
    """A JVM program failed to start, to answer, or to stop."""


def _die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def as_user(user: str | None) -> dict[str, object]:
    """``subprocess.Popen``'s arguments that run a program as ``user`` and its group (None: as this
    process)."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def listening_sockets(port: int) -> set[str] | None:
    """The inodes of the TCP sockets (IPv4 and IPv6) listening on ``port``, from ``/proc/net``; None where
    there is no such file."""
    found: set[str] = set()
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not any(table.exists() for table in tables):
        return None
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def session_sockets(session: int) -> set[str]:
    """The inodes of the sockets the processes of ``session`` hold open (those this process may read)."""
    found: set[str] = set()
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            stat = (process / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[3]) != session:  # after "pid (comm)": state ppid pgrp sid
                continue
            for descriptor in (process / "fd").iterdir():
                target = os.readlink(descriptor)
                if target.startswith("socket:["):
                    found.add(target[8:-1])
        except (OSError, ValueError):  # gone meanwhile, or not readable
            continue
    return found


def properties_text(settings: Mapping[str, Any]) -> str:
    """A Java properties file holding ``settings``: a backslash there escapes the next character."""
    escaped = {key: str(value).replace("\\", "\\\\") for key, value in settings.items()}
    return "".join(f"{key}={value}\n" for key, value in escaped.items())


def tail(path: Path, lines: int = 20) -> str:
    if not path.is_file():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class JvmProcess:
    """``java <command>`` in the background, its output in ``log_directory``.

    ``name`` names it in errors; ``main_log`` is the program's own log file, quoted when it fails;
    ``environment`` replaces this process's environment for it (None: inherited); ``user`` runs it as that
    user (a program that refuses to run as root). Any program can run so, not only a JVM.
    """

    def __init__(self, name: str, command: Sequence[str], log_directory: Path, main_log: Path,
                 environment: Mapping[str, str] | None = None, user: str | None = None) -> None:
        self.name = name
        self.command = list(command)
        self.log_directory = log_directory
        self.main_log = main_log
        self.environment = None if environment is None else dict(environment)
        self.user = user
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def stdout_log(self) -> Path:
        return self.log_directory / "stdout.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self.running:
            raise JvmError(f"{self.name} is already running (pid {self.pid})")
        self.log_directory.mkdir(parents=True, exist_ok=True)
        with open(self.stdout_log, "ab") as output:
            self._process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=output,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             env=self.environment,
                                             preexec_fn=_die_with_parent if _prctl else None,
                                             **as_user(self.user))  # type: ignore[call-overload]

    def wait_for_port(self, host: str, port: int, timeout: float) -> None:
        """Until the program (or a process it started) listens on ``host:port`` and accepts connections;
        raises with the logs' tails if it exits first or ``timeout`` seconds pass.

        A listener of another process on that port is not taken for the program's: the program then
        fails to bind it, and its error says so.
        """
        deadline = time.monotonic() + timeout
        while not (port_open(host, port) and self._listens_on(port)):
            if not self.running:
                code = self._process.returncode if self._process else None
                raise self.failure(f"exited with status {code} before listening on {host}:{port}")
            if time.monotonic() > deadline:
                taken = " (another process listens there)" if port_open(host, port) else ""
                raise self.failure(f"not listening on {host}:{port} after {timeout:.0f} s{taken}")
            time.sleep(0.2)

    def _listens_on(self, port: int) -> bool:
        """Whether a process of the program's session holds a socket listening on ``port``; True where
        Linux's ``/proc`` cannot tell."""
        listeners = listening_sockets(port)
        if listeners is None or self.pid is None:
            return True
        return not listeners.isdisjoint(session_sockets(self.pid))

    def failure(self, what: str) -> JvmError:
        logs = dict.fromkeys([self.main_log, self.stdout_log])  # once, when the program logs to its output
        return JvmError(f"{self.name} {what}" + "".join(f"\n--- {log} ---\n{tail(log)}" for log in logs))

    def terminate(self) -> None:
        """SIGTERM: the program's own clean shutdown begins."""
        if self._process is not None and self.running:
            self._process.terminate()

    def stop(self, timeout: float = 60.0, how: signal.Signals = signal.SIGTERM) -> None:
        """The signal ``how`` (SIGTERM), then SIGKILL if it is still running after ``timeout``."""
        if not self.running:
            return
        assert self._process is not None
        self._process.send_signal(how)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: what a crash or a power cut leaves behind."""
        if self._process is not None and self.running:
            self._process.kill()
            self._process.wait()


class JvmService:
    """What a node, a broker or a server built on one :class:`JvmProcess` (``self._process``) shares; as a
    context manager it runs for the block (``start``, then ``stop``)."""

    _process: JvmProcess

    @property
    def running(self) -> bool:
        return self._process.running

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _place(self, work_dir: str | Path, startup_timeout: float) -> None:
        """A server's directory (made if missing), a free port on loopback, and how long it may take to start."""
        self.work_dir = Path(work_dir).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port = free_port(self.host)
        self.startup_timeout = startup_timeout

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _start_listening(self, host: str, port: int, timeout: float) -> float:
        """Start the program and wait until it listens on ``host:port`` (killed if it does not); the seconds
        it took."""
        started = time.monotonic()
        self._process.start()
        try:
            self._process.wait_for_port(host, port, timeout)
        except BaseException:
            self._process.kill()
            raise
        return time.monotonic() - started

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class JvmCluster(abc.ABC):
    """The context manager of a cluster of JVM programs: a start that fails kills what it had started,
    the end of the block stops it all."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start every program and wait until they work together; returns the cluster."""

    @abc.abstractmethod
    def kill(self) -> None:
        """SIGKILL of every program."""

    @abc.abstractmethod
    def stop(self) -> None:
        """A clean stop of every program."""

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.kill()
            raise

    def __exit__(self, *_: object) -> None:
        self.stop()


def run_tool(command: Sequence[str], what: str, timeout: float = 120.0, user: str | None = None) -> str:
    """Run a short-lived tool to completion (as ``user``, if given); its output, or a :class:`JvmError`
    naming ``what`` failed."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                            **as_user(user))  # type: ignore[call-overload]
    if result.returncode != 0:
        raise JvmError(f"{what} failed with status {result.returncode}: "
                       f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout
