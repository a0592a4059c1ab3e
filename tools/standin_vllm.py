"""STAND-IN vLLM server for tools/sim_scale.py: a labelled fake at the engine boundary, in its own process.

It speaks the part of vLLM's OpenAI-compatible API the rollout uses (`/health`, `/v1/completions` with a prompt of
token ids, `return_tokens_as_token_ids`, `logprobs`, `token_ids`) and answers each turn with token ids of the
real tokenizer's vocabulary: "reasoning" of words drawn from the vocabulary (each a single token), then one
fenced command of realistic cost (reading source files, grep, git, python, a test run; now and then the
fix of tests/grading/tiny_task.py's bug; `submit` to end). Nothing is a model: the point is the controller's
load, not the agent's skill.

Distributions (`TurnModel`, every field a flag of sim_scale.py), fitted to the shape of the paper's episodes
(stage 1: up to 40 turns toward 65k tokens, stage 2: up to 80 toward 131k, so ~1,600 tokens per turn):
- tokens generated per turn: lognormal, median `gen_median`, log-sd `gen_sigma`, at most max_tokens;
- turns: geometric, each turn ends the episode (`submit`) with probability 1 / `turns_mean` (t_max and the
  context limit end the rest);
- observation size: the command's real output (source read with `sed -n`, ~40 tokens a line, up to the
  sandbox's output cap), `obs_lines_median` lines on average;
- latency of a turn: `time_scale` x (ttft_s + prompt tokens / ctx_tps + generated / decode_tps): prefill and
  attention grow with the context, decoding with the turn. `latency()` is a pure function of (prompt length,
  tokens generated), so the controller side can subtract exactly the stand-in's own time.

Run alone: `python tools/standin_vllm.py --port 0` prints `listening on URL`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIX = "sed -i '19s/return lo/return hi/' calc/ops.py"
"""The one-line fix of tests/grading/tiny_task.py's clamp bug (line 19 returns lo above the range)."""
SOURCES = ["json/decoder.py", "json/encoder.py", "argparse.py", "textwrap.py", "difflib.py", "shlex.py"]
"""Standard-library files the commands read (the sandbox sees /usr read-only)."""


@dataclass
class TurnModel:
    """The stand-in's distributions (see the module docstring)."""

    gen_median: float = 300.0
    """Median tokens one turn generates."""
    gen_sigma: float = 0.6
    """Log-sd of the tokens per turn."""
    turns_mean: float = 30.0
    """Mean turns of an episode (geometric: 1 / turns_mean chance to submit each turn)."""
    obs_lines_median: float = 150.0
    """Median source lines a reading command prints (~40 tokens a line)."""
    fix_rate: float = 0.05
    """Chance a turn applies the task's fix (graded 1 when the episode then submits)."""
    ttft_s: float = 0.3
    """Seconds before the first token at an empty context."""
    ctx_tps: float = 100000.0
    """Prompt tokens per second of prefill/attention cost (with a warm prefix cache: the context's cost)."""
    decode_tps: float = 40.0
    """Tokens per second one sequence decodes at full batch."""
    time_scale: float = 1.0
    """Every latency times this (0.1: ten times faster than a real engine)."""

    def latency(self, prompt_len: int, generated: int) -> float:
        """The stand-in's own seconds for a turn (what it sleeps; a pure function)."""
        return self.time_scale * (self.ttft_s + prompt_len / self.ctx_tps + generated / self.decode_tps)


def vocabulary_words(tokenizer) -> list[str]:
    """Vocabulary entries that are one lower-case word with a leading space (each one token of the real
    tokenizer, so a turn's ids are its text's own tokenisation)."""
    words = []
    for tok, i in tokenizer.get_vocab().items():
        if i < 151643 and re.fullmatch(r"Ġ[a-z]{3,9}", tok):
            words.append(tok[1:])
    return sorted(words)


class TurnWriter:
    """One assistant turn as token ids (see the module docstring)."""

    def __init__(self, chat, model: TurnModel, seed: int):
        self.chat, self.model = chat, model
        self.words = vocabulary_words(chat.tokenizer)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def command(self, rng: random.Random) -> str:
        m = self.model
        if rng.random() < 1 / m.turns_mean:
            return "submit"
        if rng.random() < m.fix_rate:
            return FIX
        lines = max(1, int(rng.lognormvariate(math.log(m.obs_lines_median), 0.8)))
        src = "/usr/lib/python3.11/" + rng.choice(SOURCES)
        start = rng.randrange(1, 400)
        return rng.choice([
            f"sed -n '{start},{start + lines}p' {src}",
            f"grep -n 'def ' {src} | head -n {lines}",
            "cat -n calc/ops.py && git status --short && git log --oneline | head -n 3",
            "python3 -c 'import calc; print(calc.clamp(5, 0, 3), calc.mean([1, 2, 3]))'",
            f"find /usr/lib/python3.11/json -name '*.py' | xargs wc -l | sort -n | head -n {lines}",
            "git diff",
        ])  # fmt: skip

    def turn(self, max_tokens: int) -> list[int]:
        with self.lock:
            rng = random.Random(self.rng.random())
        n = max(8, int(rng.lognormvariate(math.log(self.model.gen_median), self.model.gen_sigma)))
        text = " ".join(rng.choice(self.words) for _ in range(n)).strip() + f"\n```\n{self.command(rng)}\n```"
        ids = self.chat.encode(text) + [self.chat.eos_id]
        return ids[:max_tokens]


def serve(writer: TurnWriter, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Start the stand-in HTTP server (daemon threads); returns it (url from server_address)."""
    model = writer.model

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves vLLM

        def _send(self, code: int, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, b"{}" if self.path in ("/health", "/v1/models") else b"")

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/completions":
                self._send(200, b'{"success": true}')
                return
            body = json.loads(raw)
            prompt_len = len(body["prompt"])
            ids = writer.turn(int(body["max_tokens"]))
            time.sleep(model.latency(prompt_len, len(ids)))
            choice = {
                "finish_reason": "stop" if ids[-1] == writer.chat.eos_id else "length",
                "token_ids": ids,
                "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)},
            }
            self._send(
                200, json.dumps({"choices": [choice], "usage": {"prompt_tokens": prompt_len}}).encode()
            )

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer((host, port), H)
    httpd.daemon_threads = True
    httpd.request_queue_size = 1024
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="{}", help="TurnModel fields as JSON")
    args = p.parse_args()
    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.model.tokenizer import load_tokenizer

    model = TurnModel(**json.loads(args.model))
    httpd = serve(TurnWriter(ChatFormat(load_tokenizer("qwen2.5")), model, args.seed), args.port, args.host)
    host, port = httpd.server_address[:2]
    print(f"stand-in vLLM listening on http://{host}:{port}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
