"""`python -m swe_megatron ...`: the same as the `swe-megatron` console script."""

from swe_megatron import cli

cli.run()
