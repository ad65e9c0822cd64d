"""The schema registry client (confluent-kafka's, with basic auth and TLS) as the Avro encoder uses it.

No Confluent-compatible registry can run here (see docs/security.md), so the server is a stand-in that
speaks the one call the pipeline makes, ``POST /subjects/<subject>/versions``, over real HTTPS with a
certificate made here, and demands HTTP basic authentication as a registry configured for it does. The
client, its TLS and its login are the real ones."""

from __future__ import annotations

import base64
import io
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import fastavro
import pytest

from cassandra_cdc.events.event_encoder import EventEncoder, SchemaRegistry
from cassandra_cdc.localcluster.certificates import CertificateAuthority
from cassandra_cdc.pipeline.pipeline_config import SchemaRegistrySettings
from test_events import ROW, SOURCE, TABLE

USER, PASSWORD = "cdc-pipeline", "registry: secret"


class StandInRegistry(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.schemas: dict[tuple[str, str], int] = {}  # (subject, schema text) -> id
        self.authorizations: list[str | None] = []

    @property
    def url(self) -> str:
        return f"https://localhost:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: StandInRegistry

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        authorization = self.headers.get("Authorization")
        self.server.authorizations.append(authorization)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        subject = self.path.split("/")[2]
        if authorization != expected:
            self._answer(401, {"error_code": 40101, "message": "Unauthorized"})
        elif not self.path.startswith("/subjects/") or "/versions" not in self.path:
            self._answer(404, {"error_code": 404, "message": "not found"})
        else:
            key = (subject, body["schema"])
            schema_id = self.server.schemas.setdefault(key, len(self.server.schemas) + 1)
            self._answer(200, {"id": schema_id})

    def _answer(self, status: int, document: dict[str, Any]) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StandInRegistry, Path]]:
    directory = tmp_path_factory.mktemp("registry-tls")
    authority = CertificateAuthority.create(directory)
    certificate = authority.issue(directory, "registry", hosts=["localhost", "127.0.0.1"])
    server = StandInRegistry()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate.certificate, certificate.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, authority.certificate
    server.shutdown()
    server.server_close()


def test_avro_events_register_through_basic_auth_over_tls(registry: tuple[StandInRegistry, Path]) -> None:
    server, ca = registry
    settings = SchemaRegistrySettings(url=server.url, username=USER, password=PASSWORD, ca_file=ca)
    encoder = EventEncoder("prod", TABLE, "avro", SchemaRegistry(settings.client_settings()))
    value = encoder.value(None, ROW, "c", SOURCE, 1)
    subject = "prod.shop.everything-value"
    (registered_subject, text), schema_id = next(iter(server.schemas.items()))
    assert registered_subject == subject and value[:5] == b"\x00" + schema_id.to_bytes(4, "big")
    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(json.loads(text)))
    assert record["op"] == "c" and record["before"] is None
    requests = len(server.authorizations)
    assert encoder.value(None, ROW, "c", SOURCE, 2)[:5] == value[:5]
    assert len(server.authorizations) == requests  # the id is cached


def test_a_wrong_registry_password_is_refused(registry: tuple[StandInRegistry, Path]) -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    server, ca = registry
    settings = SchemaRegistrySettings(url=server.url, username=USER, password="wrong", ca_file=ca)
    with pytest.raises(SchemaRegistryError) as refused:
        SchemaRegistry(settings.client_settings()).register("s-value", {"type": "string"})
    assert refused.value.http_status_code == 401


def test_an_untrusted_registry_certificate_is_refused(registry: tuple[StandInRegistry, Path],
                                                      tmp_path: Path) -> None:
    server, _ = registry
    other = CertificateAuthority.create(tmp_path)
    settings = SchemaRegistrySettings(url=server.url, username=USER, password=PASSWORD,
                                      ca_file=other.certificate)
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        SchemaRegistry(settings.client_settings()).register("s-value", {"type": "string"})
