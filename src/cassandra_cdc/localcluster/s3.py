"""An S3 API server on loopback: S3Proxy over Apache jclouds' in-memory blob store, one JVM.

Example::

    with S3Server(work_dir) as s3:
        s3.create_bucket("checkpoints")
        conf = s3.spark_conf()               # Spark settings: Hadoop's S3A file system pointed at the server
        checkpoint = "s3a://checkpoints/pipeline"
        s3.list("checkpoints", "pipeline/")  # the keys under a prefix

Not Amazon S3: what the tests can run where no S3 can. The objects live in the server's memory (gone when
it stops); requests are not authenticated (the clients sign nothing). Spark reaches it through Hadoop's S3A
file system, the connector a cluster adds for ``s3a://`` checkpoints (``.jvm/lib/s3a``: hadoop-aws and the
AWS SDK's S3 client).
"""

from __future__ import annotations

import logging
import os
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Callable

from . import artifacts
from .process import SERVICE_JVM, JvmProcess, JvmService, properties_text

log = logging.getLogger(__name__)

_S3_NAMESPACE = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Server(JvmService):
    """S3Proxy under ``work_dir`` (its settings and log); a context manager that runs it."""

    def __init__(self, work_dir: str | Path, *, heap: str = "256m", startup_timeout: float = 60.0,
                 progress: Callable[[str], None] | None = None) -> None:
        self._place(work_dir, startup_timeout)
        self._progress = progress or log.info
        settings = self.work_dir / "s3proxy.properties"
        settings.write_text(properties_text({
            "s3proxy.endpoint": self.endpoint, "s3proxy.authorization": "none", "jclouds.provider": "transient"}))
        log_file = self.work_dir / "s3proxy.log"
        self._process = JvmProcess(f"S3 server {self.endpoint}", [
            artifacts.java_executable(), f"-Xmx{heap}", *SERVICE_JVM, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", artifacts.classpath(artifacts.S3PROXY), "org.gaul.s3proxy.Main", "--properties", str(settings)],
            self.work_dir, log_file)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def spark_conf(self) -> dict[str, str]:
        """Spark settings for ``s3a://`` paths on this server: the S3A file system on the driver's and the
        executors' classpath, pointed at the server, path-style and unsigned."""
        import pyspark

        jars = os.pathsep.join(str(jar) for jar in artifacts.jars_beside_spark(
            artifacts.S3A, Path(pyspark.__file__).parent / "jars"))
        return {
            "spark.driver.extraClassPath": jars, "spark.executor.extraClassPath": jars,
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider",
        }

    def create_bucket(self, bucket: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{urllib.parse.quote(bucket)}", method="PUT")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def list(self, bucket: str, prefix: str = "") -> list[str]:
        """The keys of ``bucket`` that start with ``prefix``, in order."""
        keys: list[str] = []
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix, **({"continuation-token": token} if token else {})}
            url = f"{self.endpoint}/{urllib.parse.quote(bucket)}?{urllib.parse.urlencode(query)}"
            with urllib.request.urlopen(url, timeout=30) as answer:
                listing = ElementTree.fromstring(answer.read())
            keys += [element.text or "" for element in listing.iter(f"{_S3_NAMESPACE}Key")]
            token = listing.findtext(f"{_S3_NAMESPACE}NextContinuationToken")
            if not token:
                return keys

    def start(self) -> float:
        """Start the server and wait until it answers; returns the seconds it took."""
        self._progress(f"starting S3 server {self.endpoint}")
        seconds = self._start_listening(self.host, self.port, self.startup_timeout)
        self._progress(f"S3 server {self.endpoint} up in {seconds:.1f} s")
        return seconds

    def stop(self, timeout: float = 30.0) -> None:
        if self.running:
            self._process.stop(timeout)
            self._progress(f"S3 server {self.endpoint} stopped")
