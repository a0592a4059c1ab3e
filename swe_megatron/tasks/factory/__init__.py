"""The offline task factory behind `swe-megatron make-tasks` (see build.py)."""
