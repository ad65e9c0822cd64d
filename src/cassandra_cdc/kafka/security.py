"""How every component logs in to Kafka: one ``kafka.security`` section, mapped here, and only here, to the
settings of both Kafka clients the project runs.

- librdkafka (confluent-kafka): the agent, the bootstrap, ``tail``, the schema catalog, the pipeline's
  Python source and its sink;
- the Java client: Spark's built-in ``kafka`` source, whose options are the Java client's settings with a
  ``kafka.`` prefix. Its SASL login is one ``sasl.jaas.config`` string, its TLS files PEM stores.

Each component's raw ``kafka.consumer`` / ``kafka.producer`` dicts are applied after these settings, as
overrides for what this section does not cover.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..settings import ConfigError, readable_file

librdkafka_log = logging.getLogger("cassandra_cdc.librdkafka")

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

_SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
_TLS_PROTOCOLS = ("SSL", "SASL_SSL")
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


class KafkaSecurity(BaseModel):
    """SASL and TLS of the Kafka connection; every problem is reported on the key it concerns."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: Protocol = Field("PLAINTEXT", description="Kafka security protocol.")
    sasl_mechanism: Mechanism | None = Field(None, validate_default=True,
                                             description="SASL mechanism (SASL_* protocols).")
    username: str | None = Field(None, validate_default=True, description="SASL user (SASL_* protocols).")
    password: str | None = Field(None, validate_default=True,
                                 description="SASL password (SASL_* protocols); see password_file.")
    ca_file: Path | None = Field(None, validate_default=True,
                                 description="PEM file of the CA certificates that signed the brokers' "
                                             "(SSL protocols); default: the system's.")
    cert_file: Path | None = Field(None, validate_default=True,
                                   description="PEM client certificate, for brokers that authenticate "
                                               "clients by TLS (with key_file).")
    key_file: Path | None = Field(None, validate_default=True,
                                  description="PEM private key (PKCS#8) of cert_file.")
    key_password: str | None = Field(None, validate_default=True,
                                     description="Password of an encrypted key_file.")
    verify_hostname: bool = Field(True, description="Check that a broker's certificate names the host "
                                                    "connected to.")

    @field_validator("sasl_mechanism", "username", "password")
    @classmethod
    def _sasl_only_with_sasl(cls, value: Any, info: ValidationInfo) -> Any:
        protocol = info.data.get("protocol")
        if protocol is None:
            return value  # the protocol is wrong: said on its own key
        if protocol in _SASL_PROTOCOLS and value is None:
            raise ValueError(f"required with protocol {protocol}")
        if protocol not in _SASL_PROTOCOLS and value is not None:
            raise ValueError(f"only with protocol SASL_PLAINTEXT or SASL_SSL (protocol is {protocol})")
        return value

    @field_validator("ca_file", "cert_file", "key_file", "key_password")
    @classmethod
    def _tls_only_with_tls(cls, value: Any, info: ValidationInfo) -> Any:
        protocol = info.data.get("protocol")
        if value is None:
            if info.field_name == "key_file" and info.data.get("cert_file") is not None:
                raise ValueError("required with cert_file")
            return value
        if protocol is not None and protocol not in _TLS_PROTOCOLS:
            raise ValueError(f"only with protocol SSL or SASL_SSL (protocol is {protocol})")
        if info.field_name == "key_password":
            if info.data.get("key_file") is None:
                raise ValueError("only with key_file")
            return value
        if info.field_name == "key_file" and "cert_file" in info.data and info.data["cert_file"] is None:
            raise ValueError("only with cert_file")
        return readable_file(value)

    @property
    def sasl(self) -> bool:
        return self.protocol in _SASL_PROTOCOLS

    @property
    def tls(self) -> bool:
        return self.protocol in _TLS_PROTOCOLS

    def librdkafka(self) -> dict[str, str]:
        """The settings of a confluent-kafka client."""
        settings = {"security.protocol": self.protocol}
        if self.sasl:
            settings |= {"sasl.mechanism": str(self.sasl_mechanism), "sasl.username": str(self.username),
                         "sasl.password": str(self.password)}
        if self.tls:
            settings["ssl.endpoint.identification.algorithm"] = "https" if self.verify_hostname else "none"
            if self.ca_file is not None:
                settings["ssl.ca.location"] = str(self.ca_file)
            if self.cert_file is not None and self.key_file is not None:
                settings |= {"ssl.certificate.location": str(self.cert_file),
                             "ssl.key.location": str(self.key_file)}
            if self.key_password is not None:
                settings["ssl.key.password"] = self.key_password
        return settings

    def java_client(self) -> dict[str, str]:
        """The settings of Kafka's Java client (Spark's ``kafka`` source takes them prefixed ``kafka.``)."""
        settings = {"security.protocol": self.protocol}
        if self.sasl:
            settings |= {"sasl.mechanism": str(self.sasl_mechanism),
                         "sasl.jaas.config": f"{_LOGIN_MODULES[str(self.sasl_mechanism)]} required "
                                             f"username={jaas_quoted(str(self.username))} "
                                             f"password={jaas_quoted(str(self.password))};"}
        if self.tls:
            settings["ssl.endpoint.identification.algorithm"] = "https" if self.verify_hostname else ""
            if self.ca_file is not None:
                settings |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca_file)}
            if self.cert_file is not None and self.key_file is not None:
                # The Java client reads a PEM key store from one file or from the PEM texts themselves.
                settings |= {"ssl.keystore.type": "PEM",
                             "ssl.keystore.certificate.chain": self.cert_file.read_text(),
                             "ssl.keystore.key": self.key_file.read_text()}
            if self.key_password is not None:
                settings["ssl.key.password"] = self.key_password
        return settings


def jaas_quoted(value: str) -> str:
    """A JAAS option value: double-quoted, with backslashes and quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class KafkaConnection(BaseModel):
    """The keys of every component's ``kafka`` section that say how to reach and log in to the brokers."""

    bootstrap_servers: str = Field(..., description="Kafka bootstrap servers, host:port[,host:port].")
    security: KafkaSecurity = Field(default_factory=KafkaSecurity, description="SASL and TLS of every Kafka "
                                    "client of the component (see docs/security.md).")

    def librdkafka(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """A confluent-kafka client's settings: the brokers, the security section, then ``overrides``."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.security.librdkafka(),
                **(overrides or {})}

    def java_client(self, overrides: dict[str, Any] | None = None) -> dict[str, str]:
        """The Java client's settings: the brokers, the security section, then ``overrides``."""
        settings = {"bootstrap.servers": self.bootstrap_servers, **self.security.java_client()}
        return settings | {name: str(value) for name, value in (overrides or {}).items()}


# What librdkafka reports, through error callbacks only, when the brokers refuse a client's login or TLS.
_LOGIN_ERRORS = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                           KafkaError._SSL})


class LibrdkafkaLog:
    """The ``logger`` of librdkafka clients: their lines, whatever their level, at DEBUG (not on stderr)."""

    @staticmethod
    def log(_level: int, message: str, *args: object) -> None:
        librdkafka_log.debug(message, *args)


class LoginCheck:
    """A client's ``error_cb`` and ``logger`` that keeps the first login or TLS failure: a metadata request
    of a client the brokers refuse only times out, and the failure kept says why."""

    def __init__(self) -> None:
        self.failure: str | None = None

    def settings(self) -> dict[str, Any]:
        return {"error_cb": self.on_error, "logger": LibrdkafkaLog()}

    def on_error(self, error: KafkaError) -> None:
        if self.failure is None and error.code() in _LOGIN_ERRORS:
            self.failure = error.str()

    def refusal(self, client: Any, bootstrap_servers: str) -> str | None:
        """One line on the brokers' refusal of ``client`` (its callbacks served first), if they refused it."""
        client.poll(0)
        if self.failure is None:
            return None
        return f"Kafka at {bootstrap_servers} refused the connection: {self.failure}; check kafka.security"

    def explain(self, client: Any, bootstrap_servers: str, error: Exception) -> str:
        """One line on why ``client`` could not reach the brokers."""
        refused = self.refusal(client, bootstrap_servers)
        if refused is not None:
            return refused
        problem = error.args[0] if isinstance(error, KafkaException) and error.args else error
        detail = problem.str() if isinstance(problem, KafkaError) else problem
        return f"cannot reach Kafka at {bootstrap_servers}: {detail}"


def broker_metadata(client_settings: dict[str, Any], bootstrap_servers: str, timeout: float,
                    topic: str | None = None) -> Any:
    """The brokers' metadata (of ``topic`` alone if given), asked by an admin client that reaches them as a
    client with ``client_settings`` does. A ``ConfigError`` with one line when they refuse its login or TLS,
    ``KafkaUnreachable`` (a ``ConfigError`` too) when they do not answer."""
    from confluent_kafka.admin import AdminClient

    from .admin import admin_settings

    login = LoginCheck()
    admin = AdminClient({**admin_settings(client_settings), **login.settings()})
    try:
        return admin.list_topics(topic, timeout=timeout)
    except KafkaException as error:
        explained = login.explain(admin, bootstrap_servers, error)
        if login.failure is not None:
            raise ConfigError(explained) from None
        raise KafkaUnreachable(explained) from None


class KafkaUnreachable(ConfigError):
    """The brokers did not answer (not a refusal): a component that can wait for them waits."""


__all__ = ["KafkaConnection", "KafkaSecurity", "KafkaUnreachable", "LibrdkafkaLog", "LoginCheck",
           "broker_metadata"]
