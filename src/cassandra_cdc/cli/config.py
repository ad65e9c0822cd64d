"""``cassandra-cdc config``: check a configuration file, and the reference of every key."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from ..agent.agent_config import AgentConfig
from ..pipeline.pipeline_config import PipelineConfig
from ..settings import ConfigError, load_settings, reference_table

app = typer.Typer(no_args_is_help=True, help="Check configuration files; print the configuration reference.")

Component = Literal["agent", "pipeline"]
MODELS: dict[str, type[AgentConfig] | type[PipelineConfig]] = {"agent": AgentConfig, "pipeline": PipelineConfig}

INTRO = """\
# Configuration reference

Each long-running component reads one YAML file (`--config FILE`); its command-line flags override the
keys they name. The bootstrap reads the pipeline's file. Check a file before deploying it:

```sh
cassandra-cdc config check agent /etc/cassandra-cdc/agent.yaml
cassandra-cdc config check pipeline pipeline.yaml
```

Every problem is reported on its own line, as `FILE: key: what is wrong (given: value)`, and the command
exits with status 2; the components themselves refuse to start the same way.

## Secrets and environment variables

No secret needs to sit in the file:

- `${NAME}` inside any string value is replaced by the environment variable `NAME`; `${NAME:-default}`
  gives a default. An unset variable without a default is an error naming the key.
- `${file:/path}` is replaced by the content of that file (one trailing newline removed).
- A secret key (one whose name contains `password`, `secret`, `token`, `salt`, `sasl.jaas.config` or
  `ssl.key`) can be given as `<key>_file: /path` instead: `keystore_password_file: /run/secrets/keystore`,
  or `kafka.security.password_file: /run/secrets/kafka`.

The values of secret keys never appear in logs or error messages, at any log level.

```yaml
kafka:
  bootstrap_servers: ${KAFKA_BOOTSTRAP}
  security:
    protocol: SASL_SSL
    sasl_mechanism: SCRAM-SHA-512
    username: cdc-agent
    password_file: /run/secrets/kafka-password
    ca_file: /etc/cassandra-cdc/kafka-ca.pem
```

Kafka's and Cassandra's logins and TLS, for every component, are described in [security.md](security.md).

This page is generated from the settings the components validate (`cassandra-cdc config reference`), and
a test keeps it equal to them.
"""

SECTIONS = {
    "agent": ("`cassandra-cdc agent`", """\
```yaml
server: prod1
cdc_raw: /var/lib/cassandra/cdc_raw
state_dir: /var/lib/cassandra-cdc
schema:
  cassandra:
    contact_points: [127.0.0.1]
kafka:
  bootstrap_servers: kafka1:9092,kafka2:9092
```"""),
    "pipeline": ("`cassandra-cdc pipeline` and `cassandra-cdc bootstrap`", """\
```yaml
server: prod1
checkpoint: hdfs:///cassandra-cdc/prod1/checkpoint
kafka:
  bootstrap_servers: kafka1:9092,kafka2:9092
output:
  format: avro
  schema_registry_url: http://registry:8081
```"""),
}


def reference() -> str:
    """docs/configuration.md: the introduction, then each component's example and table of keys."""
    parts = [INTRO]
    for component, (title, example) in SECTIONS.items():
        parts.append(f"## {title}\n\n{example}\n\n{reference_table(MODELS[component])}\n")
    return "\n".join(parts)


@app.command("reference")
def print_reference() -> None:
    """Print the reference of every configuration key (Markdown, as in docs/configuration.md)."""
    typer.echo(reference(), nl=False)


@app.command()
def check(
    component: Annotated[Component, typer.Argument(help="Whose configuration: agent or pipeline.")],
    file: Annotated[Path, typer.Argument(help="The YAML configuration file.")],
) -> None:
    """Validate a configuration file as the component would at start, without starting anything."""
    try:
        load_settings(MODELS[component], file)
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{file}: a valid {component} configuration")
