"""Model folders named by a local path or a Hugging Face hub id ("Qwen/Qwen2.5-72B-Instruct").

A hub id is resolved offline, through the Hugging Face cache the hub client fills (`HF_HUB_CACHE`, else
`HF_HOME/hub`): `models--ORG--NAME/refs/main` names the snapshot `models--ORG--NAME/snapshots/<commit>/`.
Cluster nodes have no network, so nothing is downloaded: fill the cache beforehand (`hf download ID` on
a machine with network, the same cache path mounted on the nodes). Trainer weights, tokenizer and engines
all resolve `model.hf_path` here.
"""

from __future__ import annotations

import re
from pathlib import Path

from swe_megatron.errors import UsageError

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ModelNotFoundError(UsageError, FileNotFoundError):
    """model.hf_path is neither a folder nor a hub id present in the local Hugging Face cache."""


def resolve_model_path(name: str | Path) -> Path:
    """The folder of a model: `name` itself when it is a folder, else the cached snapshot of hub id `name`."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if not _HUB_ID.fullmatch(str(name)):
        raise ModelNotFoundError(f"model folder {str(name)!r} does not exist (nor is it an ORG/NAME hub id)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(str(name), local_files_only=True))
    except LocalEntryNotFoundError as e:
        raise ModelNotFoundError(
            f"model {str(name)!r} is not a folder and not in the Hugging Face cache {constants.HF_HUB_CACHE} "
            f"(no snapshot under models--{str(name).replace('/', '--')}); download it there on a machine with "
            "network (`hf download ID`), set HF_HUB_CACHE / HF_HOME to the cache that holds it, or give a folder"
        ) from e
