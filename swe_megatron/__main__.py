"""`python -m swe_megatron ...`: the same as the `swe-megatron` console script."""

from swe_megatron.cli import run

run()
