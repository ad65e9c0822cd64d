"""The per-node agent: tails cdc_raw and publishes every change of a CDC table to Kafka."""

from .tailer import Agent
from .agent_config import AgentConfig, ConfigError, load_config

__all__ = ["Agent", "AgentConfig", "ConfigError", "load_config"]
