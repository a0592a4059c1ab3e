"""Typed run configs (OmegaConf structured dataclasses) and the YAML presets that fill them."""

from swe_megatron.config.load import CONFIGS_DIR, ConfigError, find_preset, load_config, to_yaml
from swe_megatron.config.schema import RunConfig, StageConfig

__all__ = [
    "CONFIGS_DIR",
    "ConfigError",
    "RunConfig",
    "StageConfig",
    "find_preset",
    "load_config",
    "to_yaml",
]
