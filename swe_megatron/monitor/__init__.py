"""Monitoring: TensorBoard event files and terminal progress."""

from swe_megatron.monitor.tensorboard import (
    KEY_CURVES,
    KEY_GROUP,
    Monitor,
    NullMonitor,
    fenced,
    key_curves,
    key_layout,
    read_scalars,
    sample_text,
)

__all__ = [
    "KEY_CURVES",
    "KEY_GROUP",
    "Monitor",
    "NullMonitor",
    "fenced",
    "key_curves",
    "key_layout",
    "read_scalars",
    "sample_text",
]
