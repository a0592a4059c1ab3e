"""Monitoring: TensorBoard event files and terminal progress."""

from swe_megatron.monitor.tensorboard import Monitor, NullMonitor, read_scalars

__all__ = ["Monitor", "NullMonitor", "read_scalars"]
