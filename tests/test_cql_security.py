"""The agent's CQL connection (table schemas read from the cluster) on a real Cassandra 5.0 node whose native
port speaks TLS (certificates made here), requires a client certificate from its CA on TLS connections, and
checks logins (PasswordAuthenticator): the node's certificate checked, the agent's client certificate (its
key encrypted) presented, a missing or unknown one refused in one line, the password (from a file or the
environment) checked and never shown, ``local_dc`` used and checked."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import pytest
import yaml

from cassandra_cdc.agent.agent_config import AgentConfig, CassandraSchemaSource, ConfigError, load_config
from cassandra_cdc.agent.tables import TableRegistry, cql_cluster
from cassandra_cdc.localcluster.certificates import CertificateAuthority, IssuedCertificate
from cassandra_cdc.schema.system_schema import fetch_schema
from cassandra_cdc.simulator.broker import free_port
from conftest import require_jvm_artifacts

CLI = str(Path(sys.executable).with_name("cassandra-cdc"))
AGENT_USER, AGENT_PASSWORD = "cdc_agent", "agent-cql-secret-3"
CLIENT_KEY_PASSWORD = "client-key-secret-5"


class TlsNode(NamedTuple):
    cluster: Any
    ca: Path  # the CA of the node's certificate and of the client certificates it accepts
    client: IssuedCertificate  # the agent's, its key encrypted with CLIENT_KEY_PASSWORD

    def tls(self, **overrides: Any) -> dict[str, Any]:
        """``schema.cassandra.tls`` presenting the agent's client certificate, with ``overrides`` on top."""
        return {"ca_file": str(self.ca), "cert_file": str(self.client.certificate),
                "key_file": str(self.client.key), "key_password": CLIENT_KEY_PASSWORD, **overrides}


@pytest.fixture(scope="module")
def tls_cassandra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    """One node that checks logins and, on TLS connections, client certificates; TLS is optional on its
    native port, so that the cluster's own checks connect without it. The agent logs in as a role of its own,
    made here."""
    require_jvm_artifacts()
    from cassandra_cdc.localcluster import CassandraCluster

    root = tmp_path_factory.mktemp("tls-cassandra")
    authority = CertificateAuthority.create(root / "tls")
    node = authority.issue(root / "tls", "node", hosts=["127.0.0.1", "localhost"])
    client = authority.issue(root / "tls", "cdc-agent", key_password=CLIENT_KEY_PASSWORD)
    key_store = root / "tls" / "node-keystore.pem"
    key_store.write_text(node.key.read_text() + node.certificate.read_text())
    pem = {"class_name": "org.apache.cassandra.security.PEMBasedSslContextFactory"}
    encryption = {"enabled": True, "optional": True, "require_client_auth": True, "ssl_context_factory": pem,
                  "keystore": str(key_store), "truststore": str(authority.certificate)}
    config = {"client_encryption_options": encryption}
    with CassandraCluster(root / "cluster", nodes=1, config=config, password_authentication=True) as cluster:
        with cluster.driver() as driver:
            driver.connect().execute(f"CREATE ROLE {AGENT_USER} WITH PASSWORD = '{AGENT_PASSWORD}' "
                                     "AND LOGIN = true")
        yield TlsNode(cluster, authority.certificate, client)


def source(node: TlsNode, tls: dict[str, Any], **settings: Any) -> CassandraSchemaSource:
    return CassandraSchemaSource(contact_points=node.cluster.contact_points, port=node.cluster.native_port,
                                 username=AGENT_USER, password=AGENT_PASSWORD, tls=tls, **settings)


def agent_settings(node: TlsNode, tmp_path: Path, **cassandra: Any) -> dict[str, Any]:
    """An agent configuration whose ``schema.cassandra`` is this node's address with ``cassandra`` on top."""
    (tmp_path / "cdc_raw").mkdir(exist_ok=True)
    return {"server": "s", "cdc_raw": str(tmp_path / "cdc_raw"), "state_dir": str(tmp_path / "state"),
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "schema": {"cassandra": {"contact_points": node.cluster.contact_points,
                                     "port": node.cluster.native_port, **cassandra}}}


def agent_file(node: TlsNode, tmp_path: Path, tls: dict[str, Any] | None = None, **login: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(agent_settings(node, tmp_path, tls=tls or node.tls(), username=AGENT_USER,
                                                  **login)))
    return path


def run_agent(config_file: Path) -> tuple[int, str]:
    """``cassandra-cdc agent``: its exit status and what it printed."""
    result = subprocess.run([CLI, "agent", "--config", str(config_file)], capture_output=True, text=True,
                            timeout=120, check=False)
    return result.returncode, (result.stdout + result.stderr).strip()


def test_the_schema_is_read_over_tls_with_a_client_certificate_from_the_local_datacenter(
        tls_cassandra: TlsNode) -> None:
    driver = cql_cluster(source(tls_cassandra, tls_cassandra.tls(), local_dc="datacenter1"))
    try:
        schema = fetch_schema(driver.connect())
        assert schema.table("system_schema", "tables") is not None
        assert driver.control_connection._connection.ssl_context is not None  # TLS, not the plain fallback
    finally:
        driver.shutdown()


def assert_one_line(output: str, status: int, start: str, end: str) -> None:
    """What the agent's CLI printed when it cannot read the schema: exit status 2 and one line."""
    assert status == 2, output
    assert output.count("\n") == 0 and "Traceback" not in output, output
    assert output.startswith(start) and output.endswith(end), output


def test_a_node_certificate_from_another_ca_is_one_clear_line(tls_cassandra: TlsNode, tmp_path: Path) -> None:
    other = CertificateAuthority.create(tmp_path)
    tls = tls_cassandra.tls(ca_file=str(other.certificate))
    status, output = run_agent(agent_file(tls_cassandra, tmp_path, tls, password=AGENT_PASSWORD))
    assert_one_line(output, status, "error: schema.cassandra: the agent does not trust the certificate of "
                    "127.0.0.1:", "check schema.cassandra.tls.ca_file (the CA that signed the nodes' "
                    "certificates) and verify_hostname")
    assert "CERTIFICATE_VERIFY_FAILED" in output


def test_no_client_certificate_is_one_clear_line(tls_cassandra: TlsNode, tmp_path: Path) -> None:
    status, output = run_agent(agent_file(tls_cassandra, tmp_path, {"ca_file": str(tls_cassandra.ca)},
                                          password=AGENT_PASSWORD))
    assert_one_line(output, status, "error: schema.cassandra: the nodes refused the agent's TLS connection: "
                    "127.0.0.1:", "the nodes may require a client certificate: give schema.cassandra.tls."
                    "cert_file and key_file, signed by a CA of their client_encryption_options.truststore")


def test_a_client_certificate_of_another_ca_is_one_clear_line(tls_cassandra: TlsNode, tmp_path: Path) -> None:
    stranger = CertificateAuthority.create(tmp_path / "other").issue(tmp_path / "other", "stranger")
    tls = tls_cassandra.tls(cert_file=str(stranger.certificate), key_file=str(stranger.key),
                            key_password=None)
    status, output = run_agent(agent_file(tls_cassandra, tmp_path, tls, password=AGENT_PASSWORD))
    assert_one_line(output, status, "error: schema.cassandra: the nodes refused the agent's TLS connection: "
                    "127.0.0.1:", "check schema.cassandra.tls.cert_file and key_file: the nodes accept "
                    "client certificates signed by a CA of their client_encryption_options.truststore")


def test_a_local_dc_no_node_has_is_one_clear_error(tls_cassandra: TlsNode, tmp_path: Path) -> None:
    config = AgentConfig.model_validate(agent_settings(
        tls_cassandra, tmp_path, tls=tls_cassandra.tls(), username=AGENT_USER, password=AGENT_PASSWORD,
        local_dc="dc-elsewhere"))
    with pytest.raises(ConfigError) as raised:
        TableRegistry(config)
    assert str(raised.value) == ("schema.cassandra.local_dc: no node of datacenter dc-elsewhere among "
                                 "127.0.0.1: give the datacenter of the contact points")


def test_the_agent_logs_in_with_a_password_from_a_file_or_the_environment(
        tls_cassandra: TlsNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "cql-password"
    secret.write_text(AGENT_PASSWORD + "\n")
    monkeypatch.setenv("CDC_CQL_PASSWORD", AGENT_PASSWORD)
    for login in ({"password_file": str(secret)}, {"password": "${CDC_CQL_PASSWORD}"}):
        config = load_config(agent_file(tls_cassandra, tmp_path, **login))
        assert config.schema_.cassandra is not None and config.schema_.cassandra.password == AGENT_PASSWORD
        assert TableRegistry(config).schema.table("system_schema", "tables") is not None


def test_a_wrong_cql_password_is_one_clear_line(tls_cassandra: TlsNode, tmp_path: Path) -> None:
    """The agent's CLI: exit status 2 and one line naming the setting and the refusal, no traceback, and
    never the password given."""
    wrong = "not-the-cql-password"
    secret = tmp_path / "cql-password"
    secret.write_text(wrong)
    status, output = run_agent(agent_file(tls_cassandra, tmp_path, password_file=str(secret)))
    assert_one_line(output, status, "error: schema.cassandra: the nodes refused the login of user cdc_agent",
                    "check schema.cassandra.username and schema.cassandra.password (or password_file)")
    assert "Bad credentials" in output and wrong not in output, output


class PortForward:
    """A loopback port that forwards each connection to ``target_port`` once started: a node's native port
    coming up where the agent looks for it."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port("127.0.0.1")
        self._target_port = target_port
        self._server: socket.socket | None = None

    def start(self) -> None:
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self._target_port))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()


def test_the_agent_started_while_its_node_is_unreachable_waits_for_it(tls_cassandra: TlsNode,
                                                                       tmp_path: Path) -> None:
    """Connections refused: one line saying the agent waits, no exit; once the node answers, it goes on."""
    forward = PortForward(tls_cassandra.cluster.native_port)
    settings = agent_settings(tls_cassandra, tmp_path, tls=tls_cassandra.tls(), username=AGENT_USER,
                              password=AGENT_PASSWORD)
    settings["schema"]["cassandra"]["port"] = forward.port
    settings["metrics"] = {"port": 0}
    config_file = tmp_path / "agent.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    log_file = tmp_path / "agent.log"
    with log_file.open("wb") as output:
        agent = subprocess.Popen([CLI, "agent", "--config", str(config_file)], stdout=output,
                                 stderr=subprocess.STDOUT)

    def lines(text: str) -> list[str]:
        return [line for line in log_file.read_text().splitlines() if text in line]

    try:
        assert wait_until(lambda: lines("the agent waits for a node to answer"), 60), log_file.read_text()
        time.sleep(5)  # more attempts, refused too
        assert agent.poll() is None, log_file.read_text()
        forward.start()
        assert wait_until(lambda: lines("schema read"), 60), log_file.read_text()
        assert wait_until(lambda: lines("publishing"), 10), log_file.read_text()
        assert agent.poll() is None, log_file.read_text()
        waiting = lines("the agent waits for a node to answer")
        assert len(waiting) == 1, waiting
        assert f"cannot read the schema from 127.0.0.1 port {forward.port}" in waiting[0]
        assert "Connection refused" in waiting[0] and "Traceback" not in log_file.read_text()
    finally:
        agent.terminate()
        agent.wait(60)
        forward.stop()


def wait_until(predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := predicate()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return result
