"""Memory of one episode in flight at the rollout controller, per token, as its context grows to 131k tokens.

Figures in docs/benchmarks.md ("Scale"). Usage, from the repo root (any checkout: run it in an older worktree
for the before figure):

    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_episode_memory.py --context 131072 --episodes 4

What is measured is what the controller keeps of an episode while it runs: the TokenLedger (messages, token
ids, action mask, logprobs, turn spans) and the engine client's per-session prompt JSON (engine/vllm.py
PromptJson), built turn by turn as Episode does it, with the real Qwen2.5 tokenizer and chat template: each
turn 300 sampled ids (with logprobs, as the engine returns them) and an observation of source-like text of
~3,000 tokens, until the context is reached. tracemalloc counts the bytes still allocated once the tokenizer's
shared caches (bounded, not per episode) are cleared. The figure for 1024 episodes in flight is that times
1024 (all at the full context: the worst case).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tracemalloc
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

LINE_WORDS = [
    "def",
    "return",
    "self",
    "value",
    "import",
    "print",
    "class",
    "test",
    "error",
    "file",
    "line",
    "path",
    "name",
    "args",
    "kwargs",
]


def episode(chat, engine_prompts, rng: random.Random, context: int, session: str):
    """A ledger grown to `context` tokens (and the session's prompt JSON), as Episode builds it."""
    from swe_megatron.agent.tokens import TokenLedger

    ledger = TokenLedger.start(chat, "You are a software engineer. " * 10, "Fix the issue below.\n" * 40)
    while len(ledger.token_ids) < context:
        engine_prompts.text(session, ledger.token_ids)  # what the engine client keeps of the prompt
        ids = [rng.randrange(1000, 150000) for _ in range(300)] + [chat.eos_id]
        ledger.add_assistant(ids, [-rng.random() for _ in ids])
        lines = (
            f"{n:5d}    " + " ".join(rng.choices(LINE_WORDS, k=8)) for n in range(rng.randrange(200, 400))
        )
        ledger.add_observation("\n".join(lines))
    return ledger


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--context", type=int, default=131072, help="tokens each episode grows to")
    p.add_argument(
        "--episodes", type=int, default=4, help="episodes held at once (the figure is per episode)"
    )
    args = p.parse_args(argv)

    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.engine.vllm import PromptJson
    from swe_megatron.model.tokenizer import load_tokenizer

    chat, prompts, rng = ChatFormat(load_tokenizer("qwen2.5")), PromptJson(), random.Random(0)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    held = [episode(chat, prompts, rng, args.context, f"ep{k}") for k in range(args.episodes)]
    for cache in (chat._encode_cached, chat._decode_cached):
        cache.cache_clear()  # shared by all episodes and bounded (CACHE_ENTRIES): not per episode
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tokens = sum(len(ledger.token_ids) for ledger in held)
    per_episode = used / len(held)
    print(
        f"episodes {len(held)}, tokens each {tokens // len(held)}: {used / tokens:.1f} bytes/token, "
        f"{per_episode / 2**20:.2f} MiB/episode, x1024 = {1024 * per_episode / 2**30:.2f} GiB"
    )


if __name__ == "__main__":
    main()
