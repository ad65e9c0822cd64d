"""A real PostgreSQL server on loopback, in a temporary data directory: what a JDBC sink writes into.

Example::

    with PostgresServer(work_dir) as server:
        connection = psycopg.connect(server.connection_string)

The server is zonky's build of PostgreSQL for linux-amd64, fetched from Maven by ``make install`` and
unpacked there (see :mod:`.artifacts`): the project's own files install it on any machine, where a
distribution's package may not be installable. Each start runs ``initdb`` into a new data directory
(user ``postgres``, trust authentication, UTF-8, locale C) and ``postgres -D ... -p <free port>
-k <socket directory>``; the stop removes the data directory. Nothing is tuned for durability
(``fsync=off``): a test server.

PostgreSQL refuses to run as root: as root, the server runs as ``nobody``, its data directory under the
system's temporary directory (where ``nobody`` may enter, unlike a root-only ``work_dir``). The server's
output goes to ``work_dir/stdout.log``, which stays.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable

from . import artifacts
from .process import JvmCluster, JvmProcess, JvmService, run_tool
from ..simulator.broker import free_port

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
USER = "postgres"
DATABASE = "postgres"
_UNPRIVILEGED_USER = "nobody"
# What the server prints once it accepts connections (before that, a connection may be refused with
# "the database system is starting up").
_READY = "database system is ready to accept connections"
_SETTINGS = {"listen_addresses": HOST, "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
             "shared_buffers": "16MB", "max_connections": "200", "logging_collector": "off"}


class PostgresServer(JvmService, JvmCluster):
    """One PostgreSQL server on ``127.0.0.1:<port>``; a context manager that starts and stops it."""

    def __init__(self, work_dir: str | Path, port: int | None = None, *,
                 progress: Callable[[str], None] | None = None, startup_timeout: float = 60.0) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.port = port or free_port(HOST)
        self.startup_timeout = startup_timeout
        self._progress = progress or log.info
        self.home = artifacts.postgres_home()
        self.user = _UNPRIVILEGED_USER if os.geteuid() == 0 else None
        self._directory: Path | None = None
        self._process = JvmProcess(f"PostgreSQL {HOST}:{self.port}", [], self.work_dir,
                                   self.work_dir / "stdout.log", user=self.user)

    @property
    def connection_string(self) -> str:
        """libpq's form (psycopg.connect)."""
        return f"host={HOST} port={self.port} user={USER} dbname={DATABASE}"

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{HOST}:{self.port}/{DATABASE}"

    def _new_directory(self) -> Path:
        """Owned by the server's user, only: the data directory and the server's Unix socket go in it."""
        directory = Path(tempfile.mkdtemp(prefix="cassandra-cdc-postgres-"))
        if self.user is not None:
            os.chown(directory, pwd.getpwnam(self.user).pw_uid, -1)
        return directory

    def start(self) -> "PostgresServer":
        """initdb, then the server; returns once it accepts connections. A start that fails leaves neither
        a server nor its data directory behind."""
        started = time.monotonic()
        self._directory = self._new_directory()
        try:
            self._start_in(self._directory, started + self.startup_timeout)
        except BaseException:
            self.kill()
            raise
        self._progress(f"PostgreSQL {HOST}:{self.port} up in {time.monotonic() - started:.1f} s")
        return self

    def _start_in(self, directory: Path, deadline: float) -> None:
        data = directory / "data"
        run_tool([str(self.home / "bin" / "initdb"), "-D", str(data), "-U", USER, "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync"], f"initdb of {data}", user=self.user)
        settings = [argument for name, value in _SETTINGS.items() for argument in ("-c", f"{name}={value}")]
        self._process.command = [str(self.home / "bin" / "postgres"), "-D", str(data), "-p", str(self.port),
                                 "-k", str(directory), *settings]
        self._process.start()
        while _READY not in self._process.stdout_log.read_text(errors="replace"):
            if not self.running:
                raise self._process.failure("exited before accepting connections")
            if time.monotonic() > deadline:
                raise self._process.failure(f"not accepting connections after {self.startup_timeout:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        """A fast shutdown (SIGINT: open sessions are ended), then the data directory removed."""
        if self.running:
            self._process.stop(30, how=signal.SIGINT)
            self._progress(f"PostgreSQL {HOST}:{self.port} stopped")
        self._remove_directory()

    def kill(self) -> None:
        self._process.kill()
        self._remove_directory()

    def _remove_directory(self) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


__all__ = ["PostgresServer"]
