"""tools/convert_smollm2.py publishes its folder safely when two conversions race (two pytest-xdist workers
converted at once in CI: the second rename failed on the first's folder)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import convert_smollm2  # noqa: E402


def _folder(path: Path, complete: bool) -> Path:
    path.mkdir()
    (path / "model.safetensors").write_text("w")
    if complete:
        (path / convert_smollm2.MARKER).write_text("done\n")
    return path


def test_a_conversion_that_finishes_second_keeps_the_first_and_removes_its_own(tmp_path):
    out = _folder(tmp_path / "model", complete=True)
    tmp = _folder(tmp_path / "model.tmp-b", complete=True)
    convert_smollm2.publish(tmp, out)
    assert not tmp.exists() and convert_smollm2.is_complete(out)
    fresh = _folder(tmp_path / "model.tmp-c", complete=True)
    convert_smollm2.publish(fresh, tmp_path / "other")
    assert convert_smollm2.is_complete(tmp_path / "other") and not fresh.exists()


def test_an_unfinished_folder_in_the_way_is_an_error_not_kept(tmp_path):
    out = _folder(tmp_path / "model", complete=False)
    tmp = _folder(tmp_path / "model.tmp-b", complete=True)
    with pytest.raises(OSError):
        convert_smollm2.publish(tmp, out)


def test_the_finished_folder_is_readable_by_all_and_says_its_weights_are_a_dequantised_q4_1_gguf(tmp_path):
    """safetensors writes its files 0600; the published folder's files are 0644 as the hub's (engines and
    other users read them), and a README says the weights are the Q4_1 GGUF dequantised, not the original."""
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "model.tmp-a"
    folder.mkdir()
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))  # as save_pretrained writes it
    (folder / "config.json").write_text("{}")
    convert_smollm2.seal(folder, Path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {
        p.name: "0o644" for p in folder.iterdir()
    }
    note = (folder / "README.md").read_text()
    assert "Q4_1" in note and "dequantised" in note and convert_smollm2.is_complete(folder)
