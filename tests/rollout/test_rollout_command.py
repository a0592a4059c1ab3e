"""The rollout command's ends (issue 42 item 7): a failed start says why in a line that does not stop at a colon,
leaves --out as it found it (so the same command can be rerun), and a finished rollout ends in a line naming its
files, not a JSON blob."""

from __future__ import annotations

import json

import pytest
from rows import MINIMAL_ROW

from swe_megatron.cli import main
from swe_megatron.engine import vllm_server

ROW = {**MINIMAL_ROW, "test_cmd": "pytest"}


@pytest.mark.parametrize("log_line", ["", "OSError: [Errno 98] Address already in use"])
def test_a_failed_engine_start_says_why_and_leaves_out_as_it_was(tmp_path, capsys, monkeypatch, log_line):
    """The vLLM server (the outside boundary, faked by a process that exits at once, with or without a log line)
    fails to start: one error line that does not end at a colon, --out not left behind, a rerun not refused."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({**ROW, "repo_dir": str(tmp_path)}) + "\n")
    monkeypatch.setattr(
        vllm_server, "server_command", lambda *a, **k: ["sh", "-c", f"echo '{log_line}' | grep . ; exit 1"]
    )
    out = tmp_path / "out"
    argv = ["rollout", "embedded", "engine.backend=vllm", "--tasks", str(tasks), "--out", str(out)]
    for _ in range(2):  # the second is the same command again: the same error, not "already holds files"
        assert main(argv) == 1
        err = capsys.readouterr().err
        line = [ln for ln in err.splitlines() if ln.startswith("swe-megatron rollout: error: ")]
        assert len(line) == 1, err
        assert "vLLM server on port" in line[0] and "exited (1)" in line[0], err
        assert not err.rstrip().endswith(":"), err
        if log_line:
            assert err.rstrip().endswith(log_line), err
        assert not out.exists(), sorted(p.name for p in out.iterdir())


def test_an_interrupted_start_leaves_an_empty_out_it_was_given_empty(tmp_path, capsys, monkeypatch):
    """--out given empty (made by the user) stays, emptied; the interrupt's line says nothing was kept."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({**ROW, "repo_dir": str(tmp_path)}) + "\n")
    from swe_megatron.errors import Interrupted

    def interrupted(*a, **k):
        raise Interrupted(2)

    monkeypatch.setattr(vllm_server, "start_servers", interrupted)
    out = tmp_path / "out"
    out.mkdir()
    argv = ["rollout", "embedded", "engine.backend=vllm", "--tasks", str(tasks), "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted; no trajectory was written" in err, err
    assert out.is_dir() and not any(out.iterdir()), sorted(p.name for p in out.iterdir())
