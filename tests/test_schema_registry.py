"""The schema registry client (confluent-kafka's, with basic auth and TLS) as the Avro encoder uses it,
against a real registry speaking the Confluent API (Apicurio Registry, ``SchemaRegistryServer``) over HTTPS
with a certificate made here and HTTP basic authentication: events and schema changes encoded by the
pipeline are registered there and read back through it, as a consumer of the topics does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import pytest

from cassandra_cdc.events.event_encoder import EventEncoder, SchemaRegistry
from cassandra_cdc.localcluster.artifacts import registry_application
from cassandra_cdc.localcluster.certificates import CertificateAuthority
from cassandra_cdc.pipeline.schema_changes import SchemaChangeEncoder
from cassandra_cdc.pipeline.pipeline_config import SchemaRegistrySettings
from conftest import require_jvm_artifacts
from test_events import ROW, SOURCE, TABLE
from test_schema_changes import ORDERS, RECORD, offline_config

USER, PASSWORD = "cdc-pipeline", "registry: secret"


class Registry(NamedTuple):
    url: str
    ca: Path  # the CA of its certificate


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    require_jvm_artifacts(registry_application)
    from cassandra_cdc.localcluster import SchemaRegistryServer

    directory = tmp_path_factory.mktemp("registry")
    authority = CertificateAuthority.create(directory / "tls")
    certificate = authority.issue(directory / "tls", "registry", hosts=["localhost", "127.0.0.1"])
    with SchemaRegistryServer(directory, certificate, users={USER: PASSWORD}) as server:
        yield Registry(server.url, authority.certificate)


def registry_client(registry: Registry, **login: Any) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    settings = SchemaRegistrySettings(url=registry.url, ca_file=registry.ca,
                                      **({"username": USER, "password": PASSWORD} | login))
    return SchemaRegistryClient(settings.client_settings())


def test_avro_events_register_through_basic_auth_over_tls_and_read_back(registry: Registry) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    settings = SchemaRegistrySettings(url=registry.url, username=USER, password=PASSWORD, ca_file=registry.ca)
    encoder = EventEncoder("prod", TABLE, "avro", SchemaRegistry(settings.client_settings()))
    value = encoder.value(None, ROW, "c", SOURCE, 1)
    subject = "prod.shop.everything-value"
    client = registry_client(registry)
    latest = client.get_latest_version(subject)
    assert value[:5] == b"\x00" + latest.schema_id.to_bytes(4, "big")  # the Confluent wire format
    assert encoder.value(None, ROW, "c", SOURCE, 2)[:5] == value[:5]  # one schema, one id
    # A consumer decodes the event with the schema it fetches from the registry by that id.
    event = AvroDeserializer(client)(value, SerializationContext("prod.shop.everything", MessageField.VALUE))
    assert event["op"] == "c" and event["before"] is None
    assert event["source"]["table"] == "everything" and event["after"] is not None


def test_schema_changes_register_and_read_back(registry: Registry) -> None:
    """The schema change records in Avro (records, arrays of records) as a consumer decodes them."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    encoder = SchemaChangeEncoder(offline_config(**{
        "output.format": "avro", "output.schema_registry.url": registry.url,
        "output.schema_registry.username": USER, "output.schema_registry.password": PASSWORD,
        "output.schema_registry.ca_file": str(registry.ca)}))
    decode = AvroDeserializer(registry_client(registry))
    key = decode(encoder.key("shop"), SerializationContext("prod", MessageField.KEY))
    value = decode(encoder.value(RECORD, ORDERS, "CREATE", 1714979290000),
                   SerializationContext("prod", MessageField.VALUE))
    assert key == {"databaseName": "shop"}
    json_value = SchemaChangeEncoder(offline_config()).value(RECORD, ORDERS, "CREATE", 1714979290000)
    assert value == json.loads(json_value)["payload"]


def test_a_wrong_registry_password_is_refused(registry: Registry) -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    settings = SchemaRegistrySettings(url=registry.url, username=USER, password="wrong", ca_file=registry.ca)
    with pytest.raises(SchemaRegistryError) as refused:
        SchemaRegistry(settings.client_settings()).register("s-value", {"type": "string"})
    assert refused.value.http_status_code == 401
    assert "s-value" not in registry_client(registry).get_subjects()


def test_an_untrusted_registry_certificate_is_refused(registry: Registry, tmp_path: Path) -> None:
    other = CertificateAuthority.create(tmp_path)
    settings = SchemaRegistrySettings(url=registry.url, username=USER, password=PASSWORD,
                                      ca_file=other.certificate)
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        SchemaRegistry(settings.client_settings()).register("s-value", {"type": "string"})
