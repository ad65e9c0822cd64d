"""The agent's CQL connection (table schemas read from the cluster) on a real Cassandra 5.0 node whose native
port speaks TLS (a certificate made here) and that checks logins (PasswordAuthenticator): the CA checked,
the password (from a file or the environment) checked and never shown, ``local_dc`` used and checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from cassandra_cdc.agent.agent_config import AgentConfig, CassandraSchemaSource, ConfigError, load_config
from cassandra_cdc.agent.tables import TableRegistry, cql_cluster
from cassandra_cdc.localcluster.certificates import CertificateAuthority
from cassandra_cdc.schema.system_schema import fetch_schema
from conftest import require_jvm_artifacts

CLI = str(Path(sys.executable).with_name("cassandra-cdc"))
AGENT_USER, AGENT_PASSWORD = "cdc_agent", "agent-cql-secret-3"


@pytest.fixture(scope="module")
def tls_cassandra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """One node that checks logins; TLS is optional on its native port, so that the cluster's own checks
    connect without it. The agent logs in as a role of its own, made here."""
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
    with CassandraCluster(root / "cluster", nodes=1, config=config, password_authentication=True) as cluster:
        with cluster.driver() as driver:
            driver.connect().execute(f"CREATE ROLE {AGENT_USER} WITH PASSWORD = '{AGENT_PASSWORD}' "
                                     "AND LOGIN = true")
        yield cluster, authority.certificate


def source(cluster: Any, **settings: Any) -> CassandraSchemaSource:
    return CassandraSchemaSource(contact_points=cluster.contact_points, port=cluster.native_port,
                                 username=AGENT_USER, password=AGENT_PASSWORD, **settings)


def agent_settings(cluster: Any, tmp_path: Path, **cassandra: Any) -> dict[str, Any]:
    """An agent configuration whose ``schema.cassandra`` is this node's address with ``cassandra`` on top."""
    (tmp_path / "cdc_raw").mkdir(exist_ok=True)
    return {"server": "s", "cdc_raw": str(tmp_path / "cdc_raw"), "state_dir": str(tmp_path / "state"),
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "schema": {"cassandra": {"contact_points": cluster.contact_points, "port": cluster.native_port,
                                     **cassandra}}}


def agent_file(cluster: Any, tmp_path: Path, ca: Path, **login: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(agent_settings(cluster, tmp_path, tls={"ca_file": str(ca)},
                                                  username=AGENT_USER, **login)))
    return path


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
    cluster, ca = tls_cassandra
    config = AgentConfig.model_validate(agent_settings(
        cluster, tmp_path, tls={"ca_file": str(ca)}, username=AGENT_USER, password=AGENT_PASSWORD,
        local_dc="dc-elsewhere"))
    with pytest.raises(ConfigError) as raised:
        TableRegistry(config)
    assert str(raised.value) == ("schema.cassandra.local_dc: no node of datacenter dc-elsewhere among "
                                 "127.0.0.1: give the datacenter of the contact points")


def test_the_agent_logs_in_with_a_password_from_a_file_or_the_environment(
        tls_cassandra: tuple[Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, ca = tls_cassandra
    secret = tmp_path / "cql-password"
    secret.write_text(AGENT_PASSWORD + "\n")
    monkeypatch.setenv("CDC_CQL_PASSWORD", AGENT_PASSWORD)
    for login in ({"password_file": str(secret)}, {"password": "${CDC_CQL_PASSWORD}"}):
        config = load_config(agent_file(cluster, tmp_path, ca, **login))
        assert config.schema_.cassandra is not None and config.schema_.cassandra.password == AGENT_PASSWORD
        assert TableRegistry(config).schema.table("system_schema", "tables") is not None


def test_a_wrong_cql_password_is_one_clear_line(tls_cassandra: tuple[Any, Path], tmp_path: Path) -> None:
    """The agent's CLI: exit status 2 and one line naming the setting and the refusal, no traceback, and
    never the password given."""
    cluster, ca = tls_cassandra
    wrong = "not-the-cql-password"
    secret = tmp_path / "cql-password"
    secret.write_text(wrong)
    result = subprocess.run([CLI, "agent", "--config", str(agent_file(cluster, tmp_path, ca,
                                                                      password_file=str(secret)))],
                            capture_output=True, text=True, timeout=120, check=False)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output
    assert output.count("\n") == 0 and output.startswith("error: schema.cassandra"), output
    assert "Bad credentials" in output and "schema.cassandra.username" in output, output
    assert "Traceback" not in output and wrong not in output, output
