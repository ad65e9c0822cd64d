"""Shared by the components' entry points: YAML configuration with command-line overrides, logging."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterator, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)

# Settings whose values must never reach a log: passwords, secrets, tokens, JAAS configs, private keys.
SECRET_SETTING = re.compile(r"password|secret|token|sasl\.jaas\.config|ssl\.key", re.IGNORECASE)
REDACTED = "[redacted]"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the field."""


def load_settings(model: type[Model], path: Path | None, overrides: dict[str, Any] | None = None) -> Model:
    """Read and validate the YAML file (if any) with overrides (dotted keys, None = not given) on top."""
    data: dict[str, Any] = {}
    source = str(path) if path else "command line"
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as error:
            raise ConfigError(f"{path}: {error}") from error
        except yaml.YAMLError as error:
            raise ConfigError(_yaml_problem(path, error)) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the configuration must be a YAML mapping")
        data = loaded or {}
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    hide_secrets(data)
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in error.errors())
        raise ConfigError(f"{source}: {problems}") from None


class _SecretRedactor(logging.Filter):
    """Replaces the secrets of the settings in every record a handler writes, from any logger (Kafka, Spark
    and py4j's DEBUG records carry option values), whatever the format they appear in."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(secret in message for secret in self.secrets):
            for secret in sorted(self.secrets, key=len, reverse=True):  # a secret inside a longer one
                message = message.replace(secret, REDACTED)
            record.msg, record.args = message, None
        return True


_redactor = _SecretRedactor()


def hide_secrets(settings: Any) -> None:
    """Keep the values of secret settings (nested dicts and lists of them) out of every log."""
    for value in _secret_values(settings, False):
        # as written, as repr() writes it (in a logged dict), as py4j sends it to the JVM
        _redactor.secrets.update({value, repr(value)[1:-1],
                                  value.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")})


def _secret_values(node: Any, secret: bool) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _secret_values(value, secret or bool(SECRET_SETTING.search(str(key))))
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _secret_values(value, secret)
    elif secret and node is not None and str(node):
        yield str(node)


def _yaml_problem(path: Path, error: yaml.YAMLError) -> str:
    """Where the YAML is wrong and why, on one line: without the excerpt of the file PyYAML quotes, which
    may hold a secret."""
    def place(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    problem_mark, context_mark = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
    message = f"{path}: " + (f"{place(problem_mark)}: " if problem_mark is not None else "")
    message += getattr(error, "problem", None) or "not valid YAML"
    if getattr(error, "context", None) and context_mark is not None:
        message += f" ({error.context} from {place(context_mark)})"  # type: ignore[attr-defined]
    return message


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_redactor)
