"""Shared by the components' entry points: YAML configuration with command-line overrides, logging."""

from __future__ import annotations

import json
import logging
import os
import re
import types
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)

# Settings whose values must never reach a log: passwords, secrets, tokens, JAAS configs, private keys.
SECRET_SETTING = re.compile(r"password|secret|token|salt|sasl\.jaas\.config|ssl\.key", re.IGNORECASE)
REDACTED = "[redacted]"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the field."""


# ``${NAME}``, ``${NAME:-default}`` or ``${file:/path}`` inside a string value.
REFERENCE = re.compile(r"\$\{(?:file:(?P<file>[^}]+)|(?P<env>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?)\}")
# A secret's key ``<name>_file`` stands for ``<name>``, read from that file (as orchestrators mount secrets).
FILE_SUFFIX = "_file"


def readable_file(value: Path | None) -> Path | None:
    """A settings validator: the file must be there to be read (checked before anything starts)."""
    if value is not None and not (value.is_file() and os.access(value, os.R_OK)):
        raise ValueError(f"{value} is not a readable file")
    return value


def load_settings(model: type[Model], path: Path | None, overrides: dict[str, Any] | None = None) -> Model:
    """Read and validate the YAML file (if any) with overrides (dotted keys, None = not given) on top.

    String values may refer to environment variables and files (``${KAFKA_PASSWORD}``, ``${file:/run/secret}``),
    and a key ``password_file: /run/secret`` gives ``password`` the file's content, so that no secret needs to
    sit in the YAML file itself.
    """
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
        data = _resolve_references(loaded or {}, model, source, ())
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
        raise ConfigError("\n".join(f"{source}: {_location(e['loc'])}: {_problem(e)}" for e in error.errors())
                          ) from None


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _problem(error: Any) -> str:
    """Pydantic's message, with the value given when it helps (never for a secret)."""
    message = str(error["msg"]).removeprefix("Value error, ")
    given = error.get("input")
    secret = any(SECRET_SETTING.search(str(part)) for part in error["loc"])
    if error["type"] not in ("missing", "extra_forbidden") and not secret and isinstance(given, (str, int, float)):
        message += f" (given: {given!r})"
    if error["type"] == "extra_forbidden":
        message = "not a setting here (misspelt, or in the wrong section?)"
    return message


def _resolve_references(node: Any, model: Any, source: str, where: tuple[str, ...]) -> Any:
    if isinstance(node, dict):
        resolved: dict[Any, Any] = {}
        fields = getattr(model, "model_fields", {}) if isinstance(model, type) else {}
        for key, value in node.items():
            field = fields.get(key) or next((f for f in fields.values() if f.alias == key), None)
            inner = _inner_model(field.annotation) if field is not None else None
            name = str(key)
            if name.endswith(FILE_SUFFIX) and field is None and SECRET_SETTING.search(name[:-len(FILE_SUFFIX)]):
                name = name[:-len(FILE_SUFFIX)]
                value = _read_secret_file(str(value), source, where + (str(key),))
                if name in node:
                    raise ConfigError(f"{source}: {'.'.join(where + (name,))}: given twice (also as {key})")
            resolved[name] = _resolve_references(value, inner, source, where + (name,))
        return resolved
    if isinstance(node, list):
        return [_resolve_references(value, model, source, where) for value in node]
    if isinstance(node, str) and "${" in node:
        return REFERENCE.sub(lambda match: _reference(match, source, where), node)
    return node


def _reference(match: re.Match[str], source: str, where: tuple[str, ...]) -> str:
    if match["file"] is not None:
        return _read_secret_file(match["file"], source, where)
    value = os.environ.get(match["env"], match["default"])
    if value is None:
        raise ConfigError(f"{source}: {'.'.join(where)}: the environment variable {match['env']} is not set "
                          f"(write ${{{match['env']}:-default}} for a default)")
    return value


def _read_secret_file(path: str, source: str, where: tuple[str, ...]) -> str:
    try:
        return Path(path).read_text().rstrip("\r\n")
    except OSError as error:
        raise ConfigError(f"{source}: {'.'.join(where)}: cannot read {path}: {error.strerror}") from None


def _inner_model(annotation: Any) -> Any:
    """The settings model a field holds (``Section`` or ``Section | None``), or None for a plain value."""
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


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


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        written = datetime.fromtimestamp(record.created, timezone.utc)
        entry = {"time": written.isoformat(timespec="milliseconds"), "level": record.levelname,
                 "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """Log to stderr at ``level``, as text lines or (``json``) JSON lines; secrets redacted either way."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_redactor)
        if log_format == "json":
            handler.setFormatter(JsonLogFormatter())


def reference_table(model: type[BaseModel]) -> str:
    """A Markdown table of every key of a settings model (nested sections as dotted keys): the reference
    docs/configuration.md is generated from, so that it cannot drift from what is validated."""
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {kind} | {default} | {text} |" for key, kind, default, text in _keys(model, "")]
    return "\n".join(lines)


def _keys(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, str, str]]:
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        inner = _inner_model(field.annotation)
        if inner is not None:
            if field.description:
                yield key, "section", "" if field.is_required() else "(optional)", field.description
            yield from _keys(inner, key + ".")
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if field.is_required():
            default = "**required**"
        elif "default_text" in extra:  # a default computed where the program runs
            default = str(extra["default_text"])
        elif field.default_factory is not None:
            produced = field.default_factory()  # type: ignore[call-arg]
            default = f"`{produced!r}`" if produced not in ({}, []) else "empty"
        elif field.default == ():
            default = "empty"
        else:
            default = "none" if field.default is None else f"`{setting_text(field.default)}`"
        yield key, _type_text(field.annotation), default, (field.description or "").replace("|", "\\|")


def setting_text(value: Any) -> str:
    """A setting's value as Java and librdkafka spell it: booleans ``true``/``false``, not ``True``."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _type_text(annotation: Any) -> str:
    """A field's type as the reference shows it: ``str \\| None``, ``dict[str, Any]``, a tuple of any
    length as a list, the choices of a ``Literal`` quoted, validators left out."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _type_text(args[0])
    if annotation is type(None):
        return "None"
    if origin is Literal:
        return " \\| ".join(f"`{choice}`" for choice in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_text(choice) for choice in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"list[{_type_text(args[0])}]"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_text(arg) for arg in args)}]"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))
