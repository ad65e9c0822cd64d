"""A Spark standalone cluster on loopback: one master and N workers, from the pyspark installation.

Example::

    with SparkStandaloneCluster(work_dir, workers=2) as cluster:
        subprocess.run(["spark-submit", "--master", cluster.master_url, ...])
        cluster.workers[0].kill()   # kill -9 of a worker: its executors exit with it

Each daemon is ``spark-class org.apache.spark.deploy.master.Master`` (or ``...worker.Worker``) as a
process of its own, as ``sbin/start-master.sh`` and ``sbin/start-worker.sh`` would start it, with every
port free-picked on 127.0.0.1 and its output in ``work_dir/<name>/stdout.log``. Workers run their
executors in ``work_dir/<worker>/work`` (an application's executor logs are there). The daemons' own
heaps are small: they only schedule; the executors get what ``spark.executor.memory`` asks, within a
worker's ``memory``. Nothing of ``$SPARK_HOME/conf`` is read: the cluster has its own conf directory
(``work_dir/conf``). A worker killed or stopped can be started again; it joins with new ports, as a new
worker.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping

from pyspark.find_spark_home import _find_spark_home

from .process import JvmCluster, JvmError, JvmProcess, JvmService
from ..simulator.broker import free_port

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

# Read by the daemons from the cluster's own conf directory. The master's REST submission server would
# take the fixed port 6066. (The worker timeout stays Spark's minute: a loaded machine can hold a worker's
# heartbeats back for many seconds, and the master would then drop a live worker and its executors. A
# killed worker is dropped at once anyway: its connection closes.)
_DEFAULTS = {"spark.master.rest.enabled": "false"}


def spark_home() -> Path:
    return Path(_find_spark_home())


def daemon_environment(conf_directory: Path, daemon_memory: str) -> dict[str, str]:
    """What ``spark-class`` reads from the environment, set so that this cluster is self-contained."""
    return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_CONF_DIR": str(conf_directory),
            "SPARK_DAEMON_MEMORY": daemon_memory, "SPARK_LOCAL_IP": HOST}


class SparkWorker(JvmService):
    """One worker of a :class:`SparkStandaloneCluster`; :meth:`start` picks new ports each time."""

    def __init__(self, name: str, directory: Path, master_url: str, cores: int, memory: str,
                 environment: Mapping[str, str]) -> None:
        self.name = name
        self.directory = directory
        self.work_directory = directory / "work"
        self.master_url = master_url
        self.cores = cores
        self.memory = memory
        self.environment = dict(environment)
        self.port = 0
        self._process = self._new_process()

    def _new_process(self) -> JvmProcess:
        self.port = free_port(HOST)
        command = [str(spark_home() / "bin" / "spark-class"), WORKER_CLASS, "--host", HOST,
                   "--port", str(self.port), "--webui-port", str(free_port(HOST)),
                   "--cores", str(self.cores), "--memory", self.memory,
                   "--work-dir", str(self.work_directory), self.master_url]
        return JvmProcess(f"Spark {self.name}", command, self.directory, self.directory / "stdout.log",
                          self.environment)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> None:
        """Start the worker (awaited by the cluster until the master lists it)."""
        if self._process.pid is not None and not self.running:
            self._process = self._new_process()
        self._process.start()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (its executors are stopped with it), SIGKILL after ``timeout``."""
        self._process.stop(timeout)

    def failure(self, what: str) -> JvmError:
        return self._process.failure(what)

    def kill(self) -> None:
        """SIGKILL of the worker's JVM alone, as a crash: its executors notice and exit by themselves."""
        self._process.kill()


class SparkStandaloneCluster(JvmCluster):
    """A master and ``workers`` workers under ``work_dir``; a context manager that starts and stops them.

    Each worker offers ``worker_cores`` cores and ``worker_memory`` for executors; ``daemon_memory`` is
    the heap of the master and worker daemons themselves.
    """

    def __init__(self, work_dir: str | Path, workers: int = 2, *, worker_cores: int = 1,
                 worker_memory: str = "1g", daemon_memory: str = "256m",
                 progress: Callable[[str], None] | None = None, startup_timeout: float = 120.0) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.startup_timeout = startup_timeout
        self._progress = progress or log.info
        conf = self.work_dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "spark-defaults.conf").write_text("".join(f"{key} {value}\n"
                                                          for key, value in _DEFAULTS.items()))
        environment = daemon_environment(conf, daemon_memory)
        self.port = free_port(HOST)
        self.ui_port = free_port(HOST)
        master_directory = self.work_dir / "master"
        self._master = JvmProcess(
            "Spark master", [str(spark_home() / "bin" / "spark-class"), MASTER_CLASS, "--host", HOST,
                             "--port", str(self.port), "--webui-port", str(self.ui_port)],
            master_directory, master_directory / "stdout.log", environment)
        self.workers = [SparkWorker(f"worker{index + 1}", self.work_dir / f"worker{index + 1}",
                                    self.master_url, worker_cores, worker_memory, environment)
                        for index in range(workers)]

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._master.running

    @property
    def master_pid(self) -> int | None:
        return self._master.pid

    def status(self) -> dict[str, Any]:
        """The master's view (its web UI's ``/json``): ``aliveworkers``, ``workers``, ``activeapps``,
        ``completedapps``..."""
        with urllib.request.urlopen(f"http://{HOST}:{self.ui_port}/json/", timeout=10) as response:
            return json.loads(response.read())

    def alive_workers(self) -> set[str]:
        """The ``host:port`` of each worker the master counts as alive (none while it starts up)."""
        try:
            workers = self.status()["workers"]
        except (OSError, ValueError):  # not answering yet, or an empty answer before it leads
            return set()
        return {f"{worker['host']}:{worker['port']}" for worker in workers if worker["state"] == "ALIVE"}

    def start(self) -> "SparkStandaloneCluster":
        """Start the master, then every worker; returns once the master lists them all as alive."""
        started = time.monotonic()
        self._master.start()
        self._master.wait_for_port(HOST, self.port, self.startup_timeout)
        self._master.wait_for_port(HOST, self.ui_port, self.startup_timeout)
        for worker in self.workers:
            worker.start()
        self.wait_for_workers(self.workers)
        self._progress(f"Spark master {self.master_url} with {len(self.workers)} workers up in "
                       f"{time.monotonic() - started:.1f} s")
        return self

    def start_worker(self, worker: SparkWorker) -> None:
        """Start one (killed or stopped) worker again and wait until the master lists it."""
        worker.start()
        self.wait_for_workers([worker])

    def wait_for_workers(self, workers: list[SparkWorker]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not {worker.address for worker in workers} <= self.alive_workers():
            for worker in workers:
                if not worker.running:
                    raise worker.failure("exited before registering with the master")
            if time.monotonic() > deadline:
                raise JvmError(f"the Spark master {self.master_url} lists {sorted(self.alive_workers())}, "
                               f"not every one of {[worker.address for worker in workers]}, after "
                               f"{self.startup_timeout:.0f} s (logs under {self.work_dir})")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master."""
        for worker in self.workers:
            worker.stop()
        if self.running:
            self._master.stop()
            self._progress(f"Spark master {self.master_url} stopped")

    def kill(self) -> None:
        for worker in self.workers:
            worker.kill()
        self._master.kill()


__all__ = ["SparkStandaloneCluster", "SparkWorker"]
