"""What each long-running component (agent, pipeline driver) serves over HTTP: its Prometheus metrics with
the standard process and Python metrics and the build's version, ``/healthz`` and ``/readyz``.

``/healthz`` answers 200 while the process serves at all (liveness); ``/readyz`` answers 200 when the
component does its work, 503 with the reason otherwise (readiness). Every other path serves the metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from wsgiref.simple_server import make_server

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Info
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from .settings import ConfigError

# Why a component is not ready, or None when it is.
Readiness = Callable[[], str | None]


def build_version() -> str:
    try:
        return version("cassandra-cdc")
    except PackageNotFoundError:  # the package shipped as files (spark-submit --py-files), not installed
        return "unknown"


def component_registry() -> CollectorRegistry:
    """A registry of its own (tests run several components in one process) holding what every component
    exports: ``process_*``, ``python_*`` and ``cassandra_cdc_build_info{version=...}``."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    Info("cassandra_cdc_build", "The cassandra-cdc version running", registry=registry).info(
        {"version": build_version()})
    return registry


class MetricsServer:
    """The HTTP endpoint of one component, in a thread of its own until ``stop``."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, readiness: Readiness) -> None:
        metrics = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "/")
            if path == "/healthz":
                return _text(start_response, "200 OK", "ok")
            if path == "/readyz":
                reason = readiness()
                if reason is None:
                    return _text(start_response, "200 OK", "ready")
                return _text(start_response, "503 Service Unavailable", f"not ready: {reason}")
            return metrics(environ, start_response)

        self._server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_SilentHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _text(start_response: Callable[..., Any], status: str, text: str) -> list[bytes]:
    body = f"{text}\n".encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body)))])
    return [body]


def serve_metrics(host: str, port: int, registry: CollectorRegistry,
                  readiness: Readiness) -> MetricsServer | None:
    """The component's endpoint on ``host:port``; None when ``port`` is 0 (no endpoint). ConfigError when it
    cannot listen there."""
    if not port:
        return None
    try:
        return MetricsServer(host, port, registry, readiness)
    except OSError as error:
        raise ConfigError(f"metrics.port: cannot listen on {host}:{port} ({error.strerror}): choose another "
                          "port, or 0 for no metrics endpoint") from None
