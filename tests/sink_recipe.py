"""docs/events.md's recipe for Debezium's JDBC sink, read from the file itself: the tests run what the docs
say, so that neither can drift from the other."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

EVENTS_DOC = Path(__file__).resolve().parents[1] / "docs" / "events.md"
SECTION = "## Into a database"
# The names the recipe gives what a deployment names: replaced by the test's.
DOCS_SERVER, DOCS_KEYSPACE = "prod", "shop"


@dataclass(frozen=True)
class SinkRecipe:
    output: dict[str, Any]  # the pipeline's output settings
    worker: dict[str, str]  # worker.properties
    sink: dict[str, str]  # postgres-sink.properties
    unwrap: dict[str, str]  # what ExtractNewRecordState adds to the sink's settings
    avro_converters: dict[str, str]  # the Avro connector's converters (key. and value.)

    def pipeline_settings(self) -> dict[str, Any]:
        """The output settings as dotted overrides of a pipeline's configuration."""
        return {f"output.{key}": value for key, value in self.output.items()}

    def topics_regex(self, server: str, keyspace: str = DOCS_KEYSPACE) -> str:
        """The sink's ``topics.regex`` for another server (and keyspace)."""
        regex = self.sink["topics.regex"]
        docs = rf"{DOCS_SERVER}\.{DOCS_KEYSPACE}\."
        assert regex.startswith(docs), regex
        return re.escape(server) + r"\." + re.escape(keyspace) + r"\." + regex[len(docs):]


def java_properties(text: str) -> dict[str, str]:
    """``key=value`` lines as Java reads a properties file: comments and blank lines skipped, a backslash
    escaping the next character."""
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, _, value = line.partition("=")
        settings[key.strip()] = re.sub(r"\\(.)", r"\1", value.strip())
    return settings


def sink_recipe() -> SinkRecipe:
    """The blocks of docs/events.md's "Into a database" section, each known by its first line."""
    text = EVENTS_DOC.read_text()
    start = text.index(SECTION)
    section = text[start:text.index("\n## ", start + 1)]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    output = next(yaml.safe_load(body)["output"] for kind, body in blocks if kind == "yaml")
    properties = [(body.splitlines()[0], java_properties(body)) for kind, body in blocks
                  if kind == "properties"]

    def block(first_line: str | None = None, having: str | None = None) -> dict[str, str]:
        """The one properties block with that first line, or with that key."""
        [found] = [settings for first, settings in properties if first == first_line or having in settings]
        return found

    key_converter = block(having="key.converter.apicurio.registry.url")
    # The docs give the key converter's settings, and say the value's are the same.
    avro = {**key_converter, **{k.replace("key.", "value.", 1): v for k, v in key_converter.items()}}
    return SinkRecipe(output, block("# worker.properties"), block("# postgres-sink.properties"),
                      block(having="transforms"), avro)
