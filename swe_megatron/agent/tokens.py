"""Token provenance (design.md invariant 1): the tokens trained on are the tokens the engine sampled.

`TokenLedger` builds an episode's token sequence incrementally. The initial prompt is the chat template's
rendering of (system, problem statement) with the generation prompt. Assistant tokens are the engine's
sampled ids, kept as they are with their logprobs (action mask 1). Each observation is appended by rendering
the chat's head, its last assistant turn and the new observation, and tokenising only the text after that
assistant turn (TokenLedger.observation_ids): earlier tokens are never re-tokenised. An assistant turn cut by
the token limit gets the end-of-turn token appended as template glue (mask 0), as the template would render
it.

`check_provenance` re-renders the whole chat from the stored messages and walks it against the stored
tokens: every non-assistant stretch must be exactly the tokenisation of its rendered text, every assistant
stretch must decode to that turn's text and end with the end-of-turn token. Assistant stretches whose ids
differ from a fresh encoding of their text ("retokenised" turns, normal when sampling) are counted but are
not drift: those are the ids the engine produced and trains on.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import signal
import unicodedata
from array import array
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from swe_megatron.trajectory import logprob_array, mask_array, token_array

log = logging.getLogger(__name__)

CACHE_ENTRIES = 32
"""Texts (and id sequences) ChatFormat remembers the tokenisation of: an episode's initial prompt is the same
for every sample of a task and is encoded again by the provenance check."""
CACHE_MAX_CHARS = 32768
"""Longer texts (and id sequences longer than a quarter of this) are not cached (bounded memory)."""


class DriftError(RuntimeError):
    """The chat template does not extend the rendered conversation as a prefix (cannot append tokens)."""


class ChatFormat:
    """A Hugging Face tokenizer with a chat template: render chats, encode text (no special tokens added)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token
        self.eos_id = tokenizer.convert_tokens_to_ids(self.eos)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._nfc = backend is not None and "NFC" in repr(backend.normalizer)
        batch = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)
        self._encode_batch, self._decode_batch = batch, getattr(backend, "decode_batch", None)
        """The Rust tokenizer's batch encode and decode, which run without the GIL (an episode thread's
        tokenising does not stop the others; its single-text encode and decode hold it), called directly,
        without transformers' wrapper, whose Python per-token work (offsets, masks, BatchEncoding) held the
        GIL for ~3 ms of a 4k-token observation. None: a tokenizer without a Rust backend
        (tokenizer.encode/decode)."""
        # tokenisation is a pure function of the text: caching changes no result, only repeated work
        self._encode_cached = functools.lru_cache(maxsize=CACHE_ENTRIES)(self._encode_tuple)
        self._decode_cached = functools.lru_cache(maxsize=CACHE_ENTRIES)(self._decode_tuple)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The chat as template text."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of text; special-token strings become their ids, nothing is added around them."""
        if len(text) > CACHE_MAX_CHARS:
            return list(self._encode_tuple(text))
        return list(self._encode_cached(text))

    def decode(self, ids: list[int]) -> str:
        """Text of ids, special tokens kept."""
        if len(ids) > CACHE_MAX_CHARS // 4:
            return self._decode_tuple(ids)
        return self._decode_cached(tuple(ids))

    def _encode_tuple(self, text: str) -> tuple[int, ...]:
        if self._encode_batch is not None:
            return tuple(self._encode_batch([text], add_special_tokens=False)[0].ids)
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode_tuple(self, ids) -> str:
        if self._decode_batch is not None:
            return self._decode_batch([list(ids)], skip_special_tokens=False)[0]
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def normalize(self, text: str) -> str:
        """Text as the tokenizer sees it (NFC for Qwen), so a stored message decodes back to itself."""
        return unicodedata.normalize("NFC", text) if self._nfc else text


def _after_last_turn(text: str, content: str, eos: str) -> int:
    """Index in a rendered chat just past the last assistant turn's content and end-of-turn token."""
    idx = text.rfind(content + eos)
    if idx < 0:
        raise DriftError(
            "the rendered chat does not contain the last assistant turn followed by its end token"
        )
    return idx + len(content) + len(eos)


@dataclass
class TokenLedger:
    """The messages, token ids, action mask, logprobs and turn spans of one episode so far (the length-L ones as
    the typed arrays a Trajectory keeps: ~13 bytes a token, not ~60 as lists; trajectory.py)."""

    chat: ChatFormat
    messages: list[dict[str, str]] = field(default_factory=list)
    token_ids: array = field(default_factory=token_array)
    action_mask: array = field(default_factory=mask_array)
    logprobs: array = field(default_factory=logprob_array)
    turn_spans: list[list[int]] = field(default_factory=list)
    prompt_len: int = 0

    @classmethod
    def start(cls, chat: ChatFormat, system: str, first_user: str) -> TokenLedger:
        """A ledger holding the initial prompt (system + problem statement + generation prompt)."""
        msgs = [
            {"role": "system", "content": chat.normalize(system)},
            {"role": "user", "content": chat.normalize(first_user)},
        ]
        ids = token_array(chat.encode(chat.render(msgs, add_generation_prompt=True)))
        ledger = cls(chat, msgs, ids, prompt_len=len(ids))
        ledger._zeros(len(ids))
        return ledger

    def add_assistant(self, sampled_ids: list[int], sampled_logprobs: list[float]) -> str:
        """Append one turn of engine samples; returns its text. A turn without the end token gets it as glue."""
        if len(sampled_ids) != len(sampled_logprobs):
            raise ValueError(f"{len(sampled_ids)} sampled ids but {len(sampled_logprobs)} logprobs")
        ids, lps, mask = list(sampled_ids), [float(x) for x in sampled_logprobs], [1] * len(sampled_ids)
        if not ids or ids[-1] != self.chat.eos_id:
            ids.append(
                self.chat.eos_id
            )  # cut by max_tokens: the template closes the turn, the engine did not
            lps.append(0.0)
            mask.append(0)
        content = self.chat.decode(ids[:-1])
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.logprobs.extend(lp if m else 0.0 for lp, m in zip(lps, mask))
        self.action_mask.extend(mask)
        self.turn_spans.append([start, len(self.token_ids)])
        self.messages.append({"role": "assistant", "content": content})
        return content

    def observation_ids(self, text: str) -> list[int]:
        """The tokens that appending observation `text` (plus the next generation prompt) would add: the
        template's text after the last assistant turn, rendered over a short chat (the first two messages, the
        last assistant turn, the observation), so that a turn costs the same at 131k tokens as at 1k
        (rendering the whole chat twice a turn took ~8 ms at 56k tokens, on the controller's GIL). For a
        template that renders each message by itself (Qwen2.5's, Llama's) that is the whole chat's text; one
        that renders earlier turns by what follows them is caught where the whole chat is rendered, by
        check_provenance at the episode's end."""
        if len(self.messages) < 3 or self.messages[-1]["role"] != "assistant":
            raise DriftError("an observation must follow an assistant turn")
        obs = {"role": "user", "content": self.chat.normalize(text)}
        short = [*self.messages[:2], self.messages[-1]]
        prefix = self.chat.render(short, add_generation_prompt=False)
        cut = _after_last_turn(prefix, self.messages[-1]["content"], self.chat.eos)
        full = self.chat.render([*short, obs], add_generation_prompt=True)
        if not full.startswith(prefix[:cut]):
            raise DriftError("the chat template re-renders earlier turns differently once a message is added")
        return self.chat.encode(full[cut:])

    def add_observation(self, text: str, ids: list[int] | None = None) -> None:
        """Append an observation (as a user message); `ids` from observation_ids saves a second render."""
        ids = self.observation_ids(text) if ids is None else ids
        self.messages.append({"role": "user", "content": self.chat.normalize(text)})
        self.token_ids.extend(ids)
        self._zeros(len(ids))

    def _zeros(self, n: int) -> None:
        """Mask 0 and logprob 0.0 for n tokens not sampled (both all-zero bytes)."""
        self.action_mask.frombytes(bytes(n * self.action_mask.itemsize))
        self.logprobs.frombytes(bytes(n * self.logprobs.itemsize))


@dataclass
class ProvenanceReport:
    """What re-rendering the chat found."""

    drifted: bool
    """Some non-assistant tokens are not the template's tokens, or a turn's tokens are not its text."""
    retokenized_turns: int = 0
    """Assistant turns whose sampled ids differ from a fresh encoding of their text (expected, kept)."""
    detail: str = ""
    """Where the first drift is."""


def check_provenance(
    chat: ChatFormat, messages: list[dict[str, str]], token_ids: list[int], turn_spans: list[list[int]]
) -> ProvenanceReport:
    """Re-render the whole chat and check the stored tokens against it (see the module docstring)."""
    contents = [m["content"] for m in messages if m["role"] == "assistant"]
    if len(contents) != len(turn_spans):
        return ProvenanceReport(
            True, 0, f"{len(contents)} assistant messages but {len(turn_spans)} turn spans"
        )
    ends_with_user = bool(messages) and messages[-1]["role"] != "assistant"
    text = chat.render(messages, add_generation_prompt=ends_with_user)
    pos, prev, retok = 0, 0, 0
    bounds = [*turn_spans, [len(token_ids), len(token_ids)]]
    for j, (start, end) in enumerate(bounds):
        seg = list(token_ids[prev:start])  # a list, as encode's: an array never equals a list
        seg_text = chat.decode(seg)
        if not text.startswith(seg_text, pos):
            return ProvenanceReport(
                True, retok, f"tokens [{prev}, {start}) do not decode to the rendered chat"
            )
        if chat.encode(seg_text) != seg:
            return ProvenanceReport(
                True, retok, f"tokens [{prev}, {start}) are not the template's tokenisation"
            )
        pos += len(seg_text)
        if j == len(turn_spans):
            break
        span, content = list(token_ids[start:end]), contents[j]
        if not span or span[-1] != chat.eos_id or chat.decode(span[:-1]) != content:
            return ProvenanceReport(True, retok, f"assistant turn {j} tokens do not decode to its message")
        if not text.startswith(content + chat.eos, pos):
            return ProvenanceReport(True, retok, f"assistant turn {j} is not where the rendered chat has it")
        pos += len(content) + len(chat.eos)
        retok += chat.encode(content) + [chat.eos_id] != span
        prev = end
    rest = text[pos:]
    if rest and (ends_with_user or rest.strip()):
        return ProvenanceReport(True, retok, f"the rendered chat goes on past the tokens: {rest[:80]!r}")
    return ProvenanceReport(False, retok)


class ProvenancePool:
    """check_provenance in worker processes (agent.provenance_workers), so that re-rendering and re-tokenising
    whole episodes (~8 ms a turn at a 25k-token context, growing with it) does not hold the rollout controller's
    GIL while a thousand episodes' turns wait on it (docs/benchmarks.md, "Scale"). Each worker rebuilds the
    ChatFormat from a pickled copy of the tokenizer: the same function of the same inputs, so the same report.
    A worker that dies (killed, out of memory) breaks the pool; that check and every later one then run on the
    calling thread (logged once): the same result, only on the controller's time again."""

    def __init__(self, chat: ChatFormat, workers: int):
        self.chat = chat
        self._pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),  # the controller runs threads: no fork
            initializer=_worker_init,
            initargs=(chat.tokenizer,),
        )
        self._broken = False

    def __call__(
        self, messages: list[dict[str, str]], token_ids: list[int], turn_spans: list[list[int]]
    ) -> ProvenanceReport:
        if not self._broken:
            try:
                return self._pool.submit(_worker_check, messages, token_ids, turn_spans).result()
            except BrokenProcessPool as e:
                self._broken = True
                log.warning("provenance workers lost (%s): checking on the episode threads from now on", e)
        return check_provenance(self.chat, messages, token_ids, turn_spans)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


_worker_chat: ChatFormat | None = None


def _worker_init(tokenizer) -> None:
    global _worker_chat
    # Ctrl-C reaches the whole process group: the controller handles it (one line) and shuts the pool down;
    # a worker's own KeyboardInterrupt would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_chat = ChatFormat(tokenizer)


def _worker_check(messages, token_ids, turn_spans) -> ProvenanceReport:
    return check_provenance(_worker_chat, messages, token_ids, turn_spans)
