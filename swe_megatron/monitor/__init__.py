"""Monitoring: TensorBoard event files and terminal progress."""

from swe_megatron.monitor.tensorboard import (
    KEY_CURVES,
    Monitor,
    NullMonitor,
    key_curves,
    key_layout,
    read_scalars,
)

__all__ = ["KEY_CURVES", "Monitor", "NullMonitor", "key_curves", "key_layout", "read_scalars"]
