"""write_atomic: the whole new content or the old one, the asked mode, no temporary file left behind."""

import json
import os
import stat

import pytest

from swe_megatron import atomic_write
from swe_megatron.atomic_write import write_atomic, write_json_atomic


def test_replaces_whole_creates_folders_and_sets_the_mode(tmp_path):
    target = tmp_path / "a" / "b" / "state.json"
    write_json_atomic(target, {"done": [1]}, indent=1)
    assert json.loads(target.read_text()) == {"done": [1]}
    write_atomic(target, b"\x00raw")
    assert target.read_bytes() == b"\x00raw"
    old_umask = os.umask(0o077)
    try:
        write_atomic(tmp_path / "secret", "t\n", mode=0o640)  # exactly the mode asked, whatever the umask
        write_atomic(tmp_path / "plain", "t\n")  # as open() would: 0o666 less the umask
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]


def test_a_crash_mid_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "pool.json"
    write_atomic(target, "old")

    def crash(fd):
        raise OSError("disk gone")

    monkeypatch.setattr(atomic_write.os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["pool.json"]
