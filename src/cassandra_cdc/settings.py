"""Shared by the components' entry points: YAML configuration with command-line overrides, logging."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the field."""


def load_settings(model: type[Model], path: Path | None, overrides: dict[str, Any] | None = None) -> Model:
    """Read and validate the YAML file (if any) with overrides (dotted keys, None = not given) on top."""
    data: dict[str, Any] = {}
    source = str(path) if path else "command line"
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"{path}: {error}") from error
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
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in error.errors())
        raise ConfigError(f"{source}: {problems}") from None


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
