"""A Kafka-protocol broker for tests, benchmarks and the demo: ``noida-db`` with only its Kafka service.

``noida-db up`` daemonizes and ``noida-db down`` saves the broker's data before stopping it, so a later
``start()`` on the same data directory restores every topic and message: that is how tests simulate a
broker that goes away and comes back. Never ``kill -9`` it instead: it keeps messages in memory and
snapshots them asynchronously, so a kill right after a produce can lose acknowledged messages. Nor kill
the PID ``up`` prints: that is only a wrapper, and the broker would live on as an orphan.
"""

from __future__ import annotations

import atexit
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ..kafka.admin import create_missing_topics

# The executable comes with the noida-db wheel, in the interpreter's environment (not necessarily on PATH).
NOIDA_DB = Path(sys.executable).parent / "noida-db"
# The bundled binary warns about this on every run although it works; keep it out of error messages.
_HARMLESS_WARNING = "GLIBC_2.39"
COMMAND_TIMEOUT = 60.0
# Where the ports of servers started here are taken from: above the well-known and most registered ones.
FIRST_SERVER_PORT = 10000
_ports = random.Random()  # seeded per process, not by the tests' seeding of the module's generator
# The ports free_port has given in this process: a server given one may not have bound it yet.
_given_ports: set[int] = set()


class BrokerError(RuntimeError):
    """The broker did not start or stop; the message carries noida-db's own output."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing is bound to right now, for a server to listen on later.

    It is taken below the range the OS gives clients' connections their ports from: a port the OS picked
    could be given to a connection made before the server binds it, and the server would not start. Nor is
    a port given twice in a process.
    """
    ports = _server_ports()
    for _ in range(100):
        port = _ports.choice(ports)
        if port in _given_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            _given_ports.add(port)
            return port
    raise BrokerError(f"no free port on {host} in {ports.start}-{ports.stop - 1} after 100 tries")


def _server_ports() -> range:
    """From ``FIRST_SERVER_PORT`` to the first of the ports the OS gives clients (Linux's default where that
    cannot be read); to the last port where that range starts too low to leave any below it."""
    try:
        clients_from = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        clients_from = 32768
    return range(FIRST_SERVER_PORT, clients_from if clients_from > FIRST_SERVER_PORT + 1000 else 65536)


class EmbeddedBroker:
    """One single-node Kafka-protocol broker whose data lives in ``data_dir``.

    The port is fixed at construction (a free one when None) and kept across ``stop()``/``start()``, so
    clients configured with ``bootstrap_servers`` reconnect to the restarted broker by themselves.
    """

    def __init__(self, data_dir: str | Path, port: int | None = None, host: str = "127.0.0.1", *,
                 startup_timeout: float = 30.0) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.startup_timeout = startup_timeout
        self._running = False

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> "EmbeddedBroker":
        """Start the broker (restoring saved data) and return once it answers a metadata request."""
        if self._running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        output = self._noida("up", "--host", self.host, "--only", "kafka", "--kafka-port", str(self.port))
        if "already running" in output:
            # ``up`` then succeeds without starting anything, possibly on another port.
            raise BrokerError(f"a noida-db broker already runs on {self.data_dir} (left by a crashed process? "
                              f"stop it with: {NOIDA_DB} down --data-dir {self.data_dir})")
        self._running = True
        # A test that fails between start() and stop() must not leave a broker behind.
        atexit.register(self.stop)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the broker, saving its data; does nothing if it is not running."""
        if not self._running:
            return
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            try:
                self._noida("down")
                break
            except BrokerError as error:
                # On a loaded machine the broker can take longer to save its data and exit than ``down`` waits;
                # ``down`` again waits again (and reports success once it has exited).
                if "still running" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        self._running = False
        atexit.unregister(self.stop)

    @staticmethod
    def stop_leftover(data_dir: str | Path) -> bool:
        """Stop a broker a crashed process left running on ``data_dir``; return whether one was stopped."""
        if not NOIDA_DB.exists() or not Path(data_dir).is_dir():
            return False
        result = subprocess.run([str(NOIDA_DB), "down", "--data-dir", str(data_dir)], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        return result.returncode == 0

    def create_topic(self, name: str, partitions: int, compacted: bool = False, *, timeout: float = 30.0) -> None:
        """Create a topic unless it exists (replication factor 1: there is one broker); ``compacted`` sets
        cleanup.policy=compact."""
        create_missing_topics(self.admin(), {name: (partitions, compacted)}, timeout, replication_factor=1)

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        # Wait for the port first: librdkafka logs every refused connection to stderr.
        while not self._port_open():
            if time.monotonic() > deadline:
                raise BrokerError(f"the broker did not listen on {self.bootstrap_servers} within "
                                  f"{self.startup_timeout:.0f} s; {self._log_tail()}")
            time.sleep(0.05)
        admin = self.admin()
        while True:
            try:
                admin.list_topics(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
                return
            except KafkaException as error:
                if time.monotonic() > deadline:
                    raise BrokerError(f"the broker on {self.bootstrap_servers} does not answer metadata requests: "
                                      f"{error}; {self._log_tail()}") from error

    def _port_open(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            return probe.connect_ex((self.host, self.port)) == 0

    def _log_tail(self, lines: int = 10) -> str:
        log = self.data_dir / "noida.log"
        if not log.exists():
            return "no noida.log"
        tail = [line for line in log.read_text(errors="replace").splitlines() if _HARMLESS_WARNING not in line]
        return f"end of {log}:\n" + "\n".join(tail[-lines:])

    def _noida(self, command: str, *arguments: str) -> str:
        """Run a noida-db command on this data directory; return its output, raise on failure."""
        if not NOIDA_DB.exists():
            raise BrokerError(f"{NOIDA_DB} not found: install the noida-db package in this environment")
        try:
            result = subprocess.run([str(NOIDA_DB), command, "--data-dir", str(self.data_dir), *arguments],
                                    stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired as error:
            raise BrokerError(f"noida-db {command} did not finish within {COMMAND_TIMEOUT:.0f} s") from error
        output = "\n".join(line for line in (result.stdout + result.stderr).splitlines()
                           if _HARMLESS_WARNING not in line)
        if result.returncode != 0:
            raise BrokerError(f"noida-db {command} --data-dir {self.data_dir} failed "
                              f"(exit {result.returncode}):\n{output}")
        return output

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


__all__ = ["BrokerError", "EmbeddedBroker", "free_port"]
