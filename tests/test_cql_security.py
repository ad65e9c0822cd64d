"""The agent's CQL connection (table schemas read from the cluster) on a real Cassandra 5.0 node whose native
port speaks TLS (a certificate made here): the CA checked, ``local_dc`` used and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from cassandra_cdc.agent.agent_config import CassandraSchemaSource
from cassandra_cdc.agent.tables import cql_cluster
from cassandra_cdc.localcluster.certificates import CertificateAuthority
from cassandra_cdc.schema.system_schema import fetch_schema
from conftest import require_jvm_artifacts


@pytest.fixture(scope="module")
def tls_cassandra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """One node; TLS is optional on its native port, so that the cluster's own checks connect without it."""
    require_jvm_artifacts()
    from cassandra_cdc.localcluster import CassandraCluster

    root = tmp_path_factory.mktemp("tls-cassandra")
    authority = CertificateAuthority.create(root / "tls")
    node = authority.issue(root / "tls", "node", hosts=["127.0.0.1", "localhost"])
    key_store = root / "tls" / "node-keystore.pem"
    key_store.write_text(node.key.read_text() + node.certificate.read_text())
    pem = {"class_name": "org.apache.cassandra.security.PEMBasedSslContextFactory"}
    encryption = {"enabled": True, "optional": True, "require_client_auth": False, "ssl_context_factory": pem,
                  "keystore": str(key_store), "truststore": str(authority.certificate)}
    config = {"client_encryption_options": encryption}
    with CassandraCluster(root / "cluster", nodes=1, config=config) as cluster:
        yield cluster, authority.certificate


def source(cluster: Any, **settings: Any) -> CassandraSchemaSource:
    return CassandraSchemaSource(contact_points=cluster.contact_points, port=cluster.native_port, **settings)


def test_the_schema_is_read_over_tls_from_the_local_datacenter(tls_cassandra: tuple[Any, Path]) -> None:
    cluster, ca = tls_cassandra
    driver = cql_cluster(source(cluster, tls={"ca_file": ca}, local_dc="datacenter1"))
    try:
        schema = fetch_schema(driver.connect())
        assert schema.table("system_schema", "tables") is not None
        assert driver.control_connection._connection.ssl_context is not None  # TLS, not the plain fallback
    finally:
        driver.shutdown()


def test_a_certificate_from_another_ca_is_refused(tls_cassandra: tuple[Any, Path], tmp_path: Path) -> None:
    from cassandra.cluster import NoHostAvailable

    cluster, _ = tls_cassandra
    other = CertificateAuthority.create(tmp_path)
    driver = cql_cluster(source(cluster, tls={"ca_file": other.certificate}))
    try:
        with pytest.raises(NoHostAvailable, match="CERTIFICATE_VERIFY_FAILED"):
            driver.connect()
    finally:
        driver.shutdown()


def test_a_local_dc_no_node_has_is_one_clear_error(tls_cassandra: tuple[Any, Path], tmp_path: Path) -> None:
    from cassandra_cdc.agent.tables import TableRegistry
    from cassandra_cdc.agent.agent_config import AgentConfig, ConfigError

    cluster, ca = tls_cassandra
    (tmp_path / "cdc_raw").mkdir()
    config = AgentConfig.model_validate({
        "server": "s", "cdc_raw": str(tmp_path / "cdc_raw"), "state_dir": str(tmp_path / "state"),
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        "schema": {"cassandra": {"contact_points": cluster.contact_points, "port": cluster.native_port,
                                 "tls": {"ca_file": str(ca)}, "local_dc": "dc-elsewhere"}}})
    with pytest.raises(ConfigError) as raised:
        TableRegistry(config)
    assert str(raised.value) == ("schema.cassandra.local_dc: no node of datacenter dc-elsewhere among "
                                 "127.0.0.1: give the datacenter of the contact points")
