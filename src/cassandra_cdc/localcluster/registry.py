"""A real schema registry speaking the Confluent API (Apicurio Registry 2.4, in-memory storage) on loopback,
over HTTPS and with HTTP basic authentication.

Example::

    with SchemaRegistryServer(work_dir, certificate, users={"cdc": "secret"}) as registry:
        client = SchemaRegistryClient({"url": registry.url, "basic.auth.user.info": "cdc:secret",
                                       "ssl.ca.location": str(ca)})

It runs the application ``make install`` builds into ``.jvm/lib/registry/`` (see ``jvm/registry/pom.xml``);
its settings (the users and passwords, the TLS files) are in ``work_dir/registry.properties``, not on its
command line; its log is ``work_dir/logs/stdout.log``. What it stores is gone when it stops.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Mapping

from . import artifacts
from .certificates import IssuedCertificate
from .process import SERVICE_JVM, JvmProcess, JvmService, properties_text

log = logging.getLogger(__name__)

# Where Apicurio serves the Confluent schema registry API (version 7 of it), and its own API, which its
# Kafka Connect converters use.
CONFLUENT_API = "/apis/ccompat/v7"
CORE_API = "/apis/registry/v2"


class SchemaRegistryServer(JvmService):
    """The registry under ``work_dir``, serving HTTPS with ``certificate`` (its key PKCS#8, unencrypted) to
    the ``users`` (name -> password) only; a context manager that runs it."""

    def __init__(self, work_dir: str | Path, certificate: IssuedCertificate, users: Mapping[str, str], *,
                 heap: str = "256m", startup_timeout: float = 120.0,
                 progress: Callable[[str], None] | None = None) -> None:
        self._place(work_dir, startup_timeout)
        self._progress = progress or log.info
        settings = self.work_dir / "registry.properties"
        settings.write_text(properties_text({
            "quarkus.http.host": self.host,
            "quarkus.http.ssl-port": self.port,
            "quarkus.http.insecure-requests": "disabled",  # HTTPS only
            "quarkus.http.ssl.certificate.files": certificate.certificate,
            "quarkus.http.ssl.certificate.key-files": certificate.key,
            **{f"quarkus.security.users.embedded.users.{name}": password for name, password in users.items()},
        }))
        settings.chmod(0o600)
        logs = self.work_dir / "logs"
        self._process = JvmProcess(
            f"schema registry {self.url}",
            [artifacts.java_executable(), f"-Xmx{heap}", *SERVICE_JVM,
             f"-Dquarkus.config.locations={settings}", "-jar", str(artifacts.registry_application())],
            logs, logs / "stdout.log")

    @property
    def url(self) -> str:
        """The Confluent API's URL, as a client's ``url`` setting takes it (by name: the certificate's)."""
        return f"https://localhost:{self.port}{CONFLUENT_API}"

    @property
    def core_url(self) -> str:
        """Apicurio's own API's URL, as its converters' ``apicurio.registry.url`` setting takes it."""
        return f"https://localhost:{self.port}{CORE_API}"

    def start(self) -> float:
        """Start the registry and wait until it listens; returns the seconds it took."""
        seconds = self._start_listening(self.host, self.port, self.startup_timeout)
        self._progress(f"schema registry {self.url} up in {seconds:.1f} s")
        return seconds

    def stop(self, timeout: float = 30.0) -> None:
        self._process.stop(timeout)
