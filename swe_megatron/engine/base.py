"""The engine interface every rollout backend implements (vLLM server client, in-process transformers, scripts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class EngineError(RuntimeError):
    """The engine failed or answered something unusable: an infrastructure failure, never a model outcome."""


@dataclass
class Generation:
    """One sampled continuation."""

    token_ids: list[int]
    """Sampled ids, the stop token included when generation ended on it."""
    logprobs: list[float]
    """The engine's logprob of each sampled id under the untruncated temperature-1 distribution."""
    finish_reason: str
    """"stop" (end-of-turn token) or "length" (max_tokens reached)."""
    policy_version: int | None = None
    """The weight version the engine sampled with (set by engine/gate.py's VersionGate; None: not tracked)."""


class Engine(Protocol):
    """Generates from token ids. `session` is a sticky routing key: one episode's turns go to one server."""

    def generate(self, prompt_ids: list[int], max_tokens: int, session: str = "") -> Generation:
        """Sample up to max_tokens ids after prompt_ids at temperature 1 with no truncation."""

    def end_session(self, session: str) -> None:
        """Forget a session's routing (the episode ended)."""

    def reload_weights(self, path: str) -> None:
        """Load new weights (a Hugging Face checkpoint folder) into every server."""
