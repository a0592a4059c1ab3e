"""swe_megatron: multi-turn RL for software-engineering agents on Megatron-Core and vLLM."""

__version__ = "0.1.0"
