"""Memory of one episode in flight at the rollout controller, per token, as its context grows to 131k tokens;
with --cpu, the controller's CPU per turn for that episode by context band instead.

Figures in docs/benchmarks.md ("Scale"). Usage, from the repo root (any checkout: run it in an older worktree
for the before figure):

    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_episode_memory.py --context 131072 --episodes 4
    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_episode_memory.py --context 131072 --episodes 4 --cpu

What is measured is what the controller keeps of an episode while it runs: the TokenLedger (messages, token
ids, action mask, logprobs, turn spans) and the engine client's per-session prompt JSON (engine/vllm.py
PromptJson), built turn by turn as Episode does it, with the real Qwen2.5 tokenizer and chat template: each
turn 300 sampled ids (with logprobs, as the engine returns them) and an observation of source-like text of
~3,000 tokens, until the context is reached. tracemalloc counts the bytes still allocated once the tokenizer's
shared caches (bounded, not per episode) are cleared. The figure for 1024 episodes in flight is that times
1024 (all at the full context: the worst case).

--cpu: the same episodes, each step timed by this thread's CPU clock (time.thread_time): the prompt JSON the
engine client sends, appending the sampled turn (decode), and the observation (the chat template's render and
the tokenisation); medians per turn over the turns whose context starts in each band. The Rust tokenizer's
batch encode and decode run without the GIL; their time is the "no_gil" column, taken out of the steps, so
that "GIL held" is what one turn costs every other episode thread of the controller.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import statistics
import sys
import time
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


BANDS = ((0, 16384), (16384, 65536), (65536, 1 << 30))
"""Context bands (tokens at a turn's start) of the --cpu medians."""


def episode(chat, engine_prompts, rng: random.Random, context: int, session: str, cpu: dict | None = None):
    """A ledger grown to `context` tokens (and the session's prompt JSON), as Episode builds it; with `cpu`,
    each step's CPU seconds appended to cpu[(step, band)]."""
    from swe_megatron.agent.tokens import TokenLedger

    ledger = TokenLedger.start(chat, "You are a software engineer. " * 10, "Fix the issue below.\n" * 40)

    no_gil = getattr(chat.tokenizer.backend_tokenizer, "_spent", [0.0])
    turn_released = [0.0]

    @contextlib.contextmanager
    def timed(step: str):
        t0, r0 = time.thread_time(), no_gil[0]
        yield
        if cpu is not None:
            band = next(b for b in BANDS if b[0] <= start < b[1])
            released = no_gil[0] - r0
            cpu.setdefault((step, band), []).append(time.thread_time() - t0 - released)
            turn_released[0] += released
            if step == "observation":  # the turn's last step
                cpu.setdefault(("no_gil", band), []).append(turn_released[0])
                turn_released[0] = 0.0

    while (start := len(ledger.token_ids)) < context:
        with timed("prompt_json"):
            engine_prompts.text(session, ledger.token_ids)  # what the engine client keeps of the prompt
        ids = [rng.randrange(1000, 150000) for _ in range(300)] + [chat.eos_id]
        logprobs = [-rng.random() for _ in ids]
        with timed("assistant"):
            ledger.add_assistant(ids, logprobs)
        lines = (
            f"{n:5d}    " + " ".join(rng.choices(LINE_WORDS, k=8)) for n in range(rng.randrange(200, 400))
        )
        text = "\n".join(lines)
        with timed("observation"):
            ledger.add_observation(text)
    return ledger


STEPS = ("prompt_json", "assistant", "observation", "no_gil")


class TimedBackend:
    """The Rust tokenizer with its batch encodes and decodes timed (they release the GIL): seconds into
    `spent`."""

    def __init__(self, backend, spent: list[float]):
        self._backend, self._spent = backend, spent

    def __getattr__(self, name):
        attr = getattr(self._backend, name)
        if name not in ("encode_batch", "encode_batch_fast", "decode_batch"):
            return attr

        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return attr(*args, **kwargs)
            finally:
                self._spent[0] += time.thread_time() - t0

        return timed


def cpu_report(cpu: dict) -> None:
    """Median ms per turn of each step, and of the turn's GIL-held and whole CPU, per context band."""
    head = "  ".join(f"{s:>12}" for s in STEPS)
    print(f"context band     turns  {head}    GIL held         all  (ms/turn)")
    for lo, hi in BANDS:
        rows = [cpu.get((s, (lo, hi)), []) for s in STEPS]
        if not rows[0]:
            continue
        held = [sum(r[i] for r in rows[:3]) for i in range(len(rows[0]))]
        whole = [h + r for h, r in zip(held, rows[3])]
        cells = "  ".join(f"{1e3 * statistics.median(r):12.2f}" for r in rows)
        label = f"{lo // 1024}k-{hi // 1024}k" if hi < 1 << 30 else f"{lo // 1024}k+"
        print(
            f"{label:<15} {len(rows[0]):6d}  {cells}  {1e3 * statistics.median(held):10.2f}  "
            f"{1e3 * statistics.median(whole):10.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--context", type=int, default=131072, help="tokens each episode grows to")
    p.add_argument(
        "--episodes", type=int, default=4, help="episodes held at once (the figure is per episode)"
    )
    p.add_argument("--cpu", action="store_true", help="CPU per turn by context band instead of memory")
    args = p.parse_args(argv)

    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.engine.vllm import PromptJson
    from swe_megatron.model.tokenizer import load_tokenizer

    tokenizer, prompts, rng = load_tokenizer("qwen2.5"), PromptJson(), random.Random(0)
    if args.cpu:
        tokenizer._tokenizer = TimedBackend(tokenizer._tokenizer, [0.0])
    chat = ChatFormat(tokenizer)
    if args.cpu:
        cpu: dict = {}
        for k in range(args.episodes):
            episode(chat, prompts, rng, args.context, f"ep{k}", cpu)
            prompts.end(f"ep{k}")
        cpu_report(cpu)
        return
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
