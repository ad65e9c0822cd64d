"""A real Apache Hadoop HDFS on loopback: one NameNode and one DataNode, each its own JVM.

Example::

    with HdfsCluster(work_dir) as hdfs:
        checkpoint = f"{hdfs.uri}/pipeline/checkpoint"  # hdfs://127.0.0.1:<port>/pipeline/checkpoint
        hdfs.list("/pipeline/checkpoint")               # names in a directory, through WebHDFS

The daemons are Hadoop's own (``NameNode``, ``DataNode`` from the jars ``make install`` fetches into
``.jvm/lib/hdfs``), configured as a deployment is, by ``core-site.xml`` and ``hdfs-site.xml`` on their
classpath. The namespace is formatted on the first start only, so a restart keeps every file. One replica,
permissions off: a test file system, not a production one.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable
from xml.sax.saxutils import escape

from . import artifacts
from .process import SERVICE_JVM, JvmCluster, JvmError, JvmProcess, run_tool
from ..simulator.broker import free_port

log = logging.getLogger(__name__)

_LOG4J = """log4j.rootLogger=INFO,file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${hadoop.log.file}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d %p %c: %m%n
"""
# The daemons' web servers look their web applications up on the classpath: the jars on Maven Central
# leave them out (Hadoop's distribution has them as files), and the servers start with empty ones.
_WEB_APPLICATIONS = ("hdfs", "datanode", "static")


def _site_xml(settings: dict[str, Any]) -> str:
    properties = "".join(f"  <property><name>{escape(name)}</name><value>{escape(str(value))}</value></property>\n"
                         for name, value in settings.items())
    return f"<?xml version=\"1.0\"?>\n<configuration>\n{properties}</configuration>\n"


class HdfsCluster(JvmCluster):
    """A NameNode and a DataNode under ``work_dir``; a context manager that runs them."""

    def __init__(self, work_dir: str | Path, *, heap: str = "256m", startup_timeout: float = 120.0,
                 progress: Callable[[str], None] | None = None) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.host = "127.0.0.1"
        self.port = free_port(self.host)
        self.http_port = free_port(self.host)
        self.startup_timeout = startup_timeout
        self._progress = progress or log.info
        conf = self.work_dir / "conf"
        for application in _WEB_APPLICATIONS:
            (conf / "webapps" / application).mkdir(parents=True, exist_ok=True)
        (conf / "core-site.xml").write_text(_site_xml({"fs.defaultFS": self.uri}))
        (conf / "hdfs-site.xml").write_text(_site_xml({
            "dfs.namenode.name.dir": self.work_dir / "name",
            "dfs.datanode.data.dir": self.work_dir / "data",
            "dfs.namenode.http-address": f"{self.host}:{self.http_port}",
            "dfs.datanode.address": f"{self.host}:0",
            "dfs.datanode.http.address": f"{self.host}:0",
            "dfs.datanode.ipc.address": f"{self.host}:0",
            "dfs.datanode.hostname": self.host,
            "dfs.replication": 1,
            "dfs.permissions.enabled": False,
        }))
        (conf / "log4j.properties").write_text(_LOG4J)
        self.log_dir = self.work_dir / "logs"
        self._java = [artifacts.java_executable(), f"-Xmx{heap}", *SERVICE_JVM,
                      "-cp", f"{conf}:{artifacts.classpath(artifacts.HDFS)}"]
        self.namenode = self._daemon("namenode", "org.apache.hadoop.hdfs.server.namenode.NameNode")
        self.datanode = self._daemon("datanode", "org.apache.hadoop.hdfs.server.datanode.DataNode")

    def _daemon(self, name: str, main_class: str) -> JvmProcess:
        main_log = self.log_dir / name / f"{name}.log"
        return JvmProcess(f"HDFS {name} of {self.uri}", [*self._java, f"-Dhadoop.log.file={main_log}", main_class],
                          main_log.parent, main_log)

    @property
    def uri(self) -> str:
        return f"hdfs://{self.host}:{self.port}"

    def start(self) -> "HdfsCluster":
        started = time.monotonic()
        self._progress(f"starting HDFS {self.uri}")
        if not (self.work_dir / "name").is_dir():
            run_tool([*self._java, f"-Dhadoop.log.file={self.log_dir / 'format.log'}",
                      "org.apache.hadoop.hdfs.server.namenode.NameNode", "-format", "-nonInteractive"],
                     f"formatting HDFS {self.work_dir / 'name'}")
        self.namenode.start()
        self.datanode.start()
        self.namenode.wait_for_port(self.host, self.port, self.startup_timeout)
        self._wait_for_a_datanode(started + self.startup_timeout)
        self._progress(f"HDFS {self.uri} up in {time.monotonic() - started:.1f} s")
        return self

    def _wait_for_a_datanode(self, deadline: float) -> None:
        """Until the NameNode has a live DataNode and has left safe mode: until then writes fail."""
        while True:
            try:
                if (self._namenode_bean("FSNamesystemState").get("NumLiveDataNodes", 0) >= 1
                        and not self._namenode_bean("NameNodeInfo").get("Safemode")):
                    return
            except (OSError, ValueError):
                pass  # not answering yet
            for daemon in (self.namenode, self.datanode):
                if not daemon.running:
                    raise daemon.failure("exited while starting")
            if time.monotonic() > deadline:
                raise JvmError(f"HDFS {self.uri}: no live DataNode after {self.startup_timeout:.0f} s")
            time.sleep(0.5)

    def _namenode_bean(self, name: str) -> dict[str, Any]:
        """One of the NameNode's JMX beans (``Hadoop:service=NameNode,name=<name>``), through its web server."""
        query = urllib.parse.quote(f"Hadoop:service=NameNode,name={name}")
        with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/jmx?qry={query}", timeout=5) as answer:
            beans = json.load(answer)["beans"]
        return beans[0] if beans else {}

    def _webhdfs(self, path: str, operation: str) -> Any:
        url = (f"http://{self.host}:{self.http_port}/webhdfs/v1{urllib.parse.quote(path)}"
               f"?op={operation}&user.name=cassandra-cdc")
        return urllib.request.urlopen(url, timeout=30)

    def list(self, path: str) -> list[str]:
        """The names in the directory ``path`` (absolute, without the ``hdfs://`` part); [] if there is none."""
        try:
            with self._webhdfs(path, "LISTSTATUS") as answer:
                return sorted(status["pathSuffix"] for status in json.load(answer)["FileStatuses"]["FileStatus"])
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return []
            raise

    def read(self, path: str) -> bytes:
        """The content of the file ``path`` (absolute, without the ``hdfs://`` part)."""
        with self._webhdfs(path, "OPEN") as answer:
            return answer.read()

    def stop(self) -> None:
        for daemon in (self.datanode, self.namenode):
            daemon.stop()
        self._progress(f"HDFS {self.uri} stopped")

    def kill(self) -> None:
        for daemon in (self.datanode, self.namenode):
            daemon.kill()
