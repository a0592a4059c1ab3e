"""sandbox/cgroups.py's reading of the host: which cgroup hierarchy it makes groups in (from /proc/self/mountinfo
and /proc/self/cgroup, faked as files: the kernel at the outer boundary), how it kills and removes a group, and
which stale groups it sweeps. The limits and events themselves: tests/test_cgroups.py.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from swe_megatron.sandbox import cgroups
from swe_megatron.sandbox.cgroups import SandboxCgroup

MB = 1 << 20
REAL_PATH = Path


def _proc(monkeypatch, tmp_path: Path, mountinfo: str, cgroup: str) -> None:
    """/proc/self/mountinfo and /proc/self/cgroup as these texts; every other path as it is."""
    files = {"/proc/self/mountinfo": mountinfo, "/proc/self/cgroup": cgroup}
    redirect = {}
    for name, text in files.items():
        redirect[name] = tmp_path / Path(name).name
        redirect[name].write_text(text)
    monkeypatch.setattr(cgroups, "Path", lambda p, *rest: REAL_PATH(redirect.get(str(p), p), *rest))


def _writable(monkeypatch, *folders: Path) -> None:
    """os.access(W_OK) true for these folders only (this test may run as root, who may write anywhere)."""
    real = os.access
    allowed = {str(f) for f in folders}
    monkeypatch.setattr(
        cgroups.os,
        "access",
        lambda p, mode, **kw: str(p) in allowed if mode == os.W_OK else real(p, mode, **kw),
    )


def _line(mount_id: int, root: str, mount: str, fstype: str, opts: str) -> str:
    return f"{mount_id} 23 0:{mount_id} {root} {mount} rw,relatime shared:1 - {fstype} none {opts}"


def test_mounts_are_read_from_mountinfo(monkeypatch, tmp_path):
    mountinfo = "\n".join(
        [
            "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755",  # not a cgroup
            _line(35, "/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
            _line(36, "/job", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu,cpuacct"),
            _line(41, "/", "/sys/fs/cgroup/unified", "cgroup2", "rw,nsdelegate"),
            "1 2 3 /r /m - cgroup cgroup rw,pids",  # five fields before the separator: still a mount
            "1 2 3 /r - cgroup cgroup rw,pids",  # four: no mount point, left out
            "1 2 3 /r /x - cgroup cgroup",  # no super options, left out
        ]
    )
    _proc(monkeypatch, tmp_path, mountinfo, "")
    assert cgroups._mounts() == [
        ("/sys/fs/cgroup/memory", "/", "cgroup", {"rw", "memory"}),
        ("/sys/fs/cgroup/cpu", "/job", "cgroup", {"rw", "cpu", "cpuacct"}),
        ("/sys/fs/cgroup/unified", "/", "cgroup2", {"rw", "nsdelegate"}),
        ("/m", "/r", "cgroup", {"rw", "pids"}),
    ]


def test_own_paths_per_controller_and_v2_under_the_empty_name(monkeypatch, tmp_path):
    cgroup = "4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n1:name=systemd:/odd:name\n0::/slice/job\n"
    _proc(monkeypatch, tmp_path, "", cgroup)
    assert cgroups._own_paths() == {
        "memory": "/process_api/abc",
        "cpu": "/x",
        "cpuacct": "/x",
        "name=systemd": "/odd:name",  # a path may hold ':'
        "": "/slice/job",
    }


def test_no_proc_files_means_no_mounts_and_no_paths(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "Path", lambda p, *rest: REAL_PATH(tmp_path / "absent", *rest))
    assert cgroups._mounts() == [] and cgroups._own_paths() == {} and cgroups.parents() is None


def test_a_path_is_placed_below_the_mount_relative_to_the_hierarchy_root():
    assert cgroups._under("/sys/fs/cgroup/memory", "/", "/a/b") == Path("/sys/fs/cgroup/memory/a/b")
    # A container's mount shows its own subtree: its root is cut from the path.
    assert cgroups._under("/cg", "/job/1", "/job/1/step") == Path("/cg/step")
    assert cgroups._under("/cg", "/job/1", "/job/1") == Path("/cg")
    # A path outside the root is taken as it is.
    assert cgroups._under("/cg", "/job/1", "/other/x") == Path("/cg/other/x")
    assert cgroups._under("/cg", "/", "/Xjob/X") == Path("/cg/Xjob/X")  # only the slashes are cut


def _hierarchies(tmp_path: Path) -> tuple[str, dict[str, Path]]:
    """mountinfo of a host with v1 memory and pids below /sys and a v2 tree; the folders of this process."""
    dirs = {k: tmp_path / "cg" / k for k in ("memory", "pids", "cpu", "unified")}
    for d in dirs.values():
        d.mkdir(parents=True)
    mountinfo = "\n".join(
        [
            _line(32, "/", str(dirs["cpu"]), "cgroup", "rw,cpu"),
            _line(35, "/", str(dirs["memory"]), "cgroup", "rw,memory"),
            _line(39, "/", str(dirs["pids"]), "cgroup", "rw,pids"),
            _line(41, "/", str(dirs["unified"]), "cgroup2", "rw"),
        ]
    )
    own = {k: d / "job" for k, d in dirs.items()}
    for d in own.values():
        d.mkdir()
    return mountinfo, own


CGROUP = "8:pids:/job\n4:memory:/job\n1:cpu:/job\n0::/job\n"


@pytest.mark.parametrize("enabled", ["cpu memory pids\n", "pids memory"])
def test_v2_is_used_where_memory_and_pids_are_delegated(monkeypatch, tmp_path, enabled):
    mountinfo, own = _hierarchies(tmp_path)
    _proc(monkeypatch, tmp_path, mountinfo, CGROUP)
    (own["unified"] / "cgroup.subtree_control").write_text(enabled)
    _writable(monkeypatch, *own.values())
    assert cgroups.parents() == ("v2", [own["unified"]])


@pytest.mark.parametrize("enabled", ["memory", "pids", ""])
def test_v1_memory_then_pids_where_v2_lacks_a_controller(monkeypatch, tmp_path, enabled):
    mountinfo, own = _hierarchies(tmp_path)
    _proc(monkeypatch, tmp_path, mountinfo, CGROUP)
    (own["unified"] / "cgroup.subtree_control").write_text(enabled)
    _writable(monkeypatch, *own.values())
    assert cgroups.parents() == ("v1", [own["memory"], own["pids"]])


def test_v2_is_not_used_where_its_folder_is_not_writable(monkeypatch, tmp_path):
    mountinfo, own = _hierarchies(tmp_path)
    _proc(monkeypatch, tmp_path, mountinfo, CGROUP)
    (own["unified"] / "cgroup.subtree_control").write_text("memory pids")
    _writable(monkeypatch, own["memory"], own["pids"])
    assert cgroups.parents() == ("v1", [own["memory"], own["pids"]])


def test_v2_is_not_used_without_a_v2_path_of_this_process(monkeypatch, tmp_path):
    mountinfo, own = _hierarchies(tmp_path)
    _proc(monkeypatch, tmp_path, mountinfo, "8:pids:/job\n4:memory:/job\n")
    (own["unified"] / "cgroup.subtree_control").write_text("memory pids")
    _writable(monkeypatch, *own.values())
    assert cgroups.parents() == ("v1", [own["memory"], own["pids"]])


def test_v1_needs_both_memory_and_pids_writable(monkeypatch, tmp_path):
    mountinfo, own = _hierarchies(tmp_path)
    _proc(monkeypatch, tmp_path, mountinfo, CGROUP)
    _writable(monkeypatch, own["memory"], own["cpu"])  # pids not writable; no v2 subtree_control file
    assert cgroups.parents() is None
    _writable(monkeypatch, own["pids"])
    assert cgroups.parents() is None
    # pids mounted but this process has no pids path: not usable either.
    _proc(monkeypatch, tmp_path, mountinfo, "4:memory:/job\n0::/job\n")
    _writable(monkeypatch, *own.values())
    assert cgroups.parents() is None


def test_no_hierarchy_means_no_group_and_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(cgroups, "parents", lambda: None)
    monkeypatch.setattr(cgroups, "_warned", set())
    assert SandboxCgroup.create("sbx-none", 256 * MB, 8) is None
    assert caplog.messages == [
        "no cgroup for sandboxes (needs root with cgroup v1 memory+pids, or a cgroup v2 subtree with memory and "
        "pids delegated to this process): sandbox.memory_mb holds per process only"
    ]
    cgroups.sweep_stale_groups()  # nothing to sweep, no error


def test_v1_limits_swap_too_where_swap_is_accounted(monkeypatch, tmp_path):
    bases = [tmp_path / "memory", tmp_path / "pids"]
    for b in bases:
        b.mkdir()
    monkeypatch.setattr(cgroups, "parents", lambda: ("v1", bases))
    g = SandboxCgroup.create("sbx-s", 300 * MB, 9)
    assert (bases[0] / "swe-sbx-s" / "memory.memsw.limit_in_bytes").read_text() == str(300 * MB)
    g.remove()


def test_events_are_read_through_descriptors_kept_open_and_closed_on_remove(monkeypatch, tmp_path):
    (base,) = [tmp_path / "unified"]
    base.mkdir()
    monkeypatch.setattr(cgroups, "parents", lambda: ("v2", [base]))
    g = SandboxCgroup.create("sbx-e", 256 * MB, 8)
    folder = g.folders[0]
    (folder / "memory.events").write_text("oom 1\noom_kill 1\n")
    (folder / "pids.events").write_text("max 2\n")
    assert g.events() == {"memory": 1, "processes": 2}
    fds = list(g._fds.values())
    assert len(fds) == 2
    assert all(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC for fd in fds)  # not inherited by sandboxes
    # The same files, new values (the kernel rewrites them in place): the open descriptors see them.
    with open(folder / "pids.events", "r+") as f:
        f.write("max 4\n")
    assert g.events() == {"memory": 1, "processes": 4} and list(g._fds.values()) == fds
    (folder / "pids.events").write_text("junk\nmax notanumber\n")
    assert g.events()["processes"] == 0  # a value that is not a number reads as 0
    for name in ("memory.events", "pids.events", "memory.max", "memory.swap.max", "pids.max"):
        (folder / name).unlink()
    g.remove()
    assert g._fds == {} and g.folders == [] and not folder.exists()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def test_kill_ends_every_process_listed_in_every_folder(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    p1, p2 = _sleeper(), _sleeper()
    gone = _sleeper()
    gone.kill(), gone.wait()
    (a / "cgroup.procs").write_text(f"{gone.pid}\n{p1.pid}\n")  # a process already gone is skipped
    (b / "cgroup.procs").write_text(f"{p2.pid}\n")
    g = SandboxCgroup("v1", [tmp_path / "missing", a, b])  # a folder without cgroup.procs is skipped
    try:
        g.kill()
        assert p1.wait(timeout=10) == -9 and p2.wait(timeout=10) == -9
    finally:
        for p in (p1, p2):
            p.kill()


class _Folder:
    """A group folder whose rmdir fails with these errors, one per call, then succeeds."""

    def __init__(self, tmp_path: Path, errors: list[int]):
        self.errors, self.calls, self.tmp = list(errors), 0, tmp_path

    def rmdir(self) -> None:
        self.calls += 1
        if self.errors:
            code = self.errors.pop(0)
            raise (FileNotFoundError if code == errno.ENOENT else OSError)(code, os.strerror(code))

    def __truediv__(self, name: str) -> Path:
        return self.tmp / name

    def __str__(self) -> str:
        return "fake-group"


def _remove(monkeypatch, tmp_path, errors):
    folder = _Folder(tmp_path, errors)
    g = SandboxCgroup("v2", [folder])
    kills, sleeps = [], []
    monkeypatch.setattr(g, "kill", lambda: kills.append(1))
    monkeypatch.setattr(cgroups.time, "sleep", sleeps.append)
    g.remove()
    assert g.folders == []
    return folder.calls, len(kills), sleeps


def test_a_busy_group_is_killed_and_retried_until_it_goes(monkeypatch, tmp_path, caplog):
    calls, kills, sleeps = _remove(monkeypatch, tmp_path, [errno.EBUSY, errno.EBUSY])
    assert (calls, kills, sleeps) == (3, 2, [0.02, 0.02]) and "cannot remove" not in caplog.text


def test_a_group_busy_50_times_is_left_and_logged(monkeypatch, tmp_path, caplog):
    calls, kills, _ = _remove(monkeypatch, tmp_path, [errno.EBUSY] * 60)
    assert (calls, kills) == (50, 49)
    assert caplog.messages == [
        f"cannot remove the sandbox cgroup fake-group: [Errno 16] {os.strerror(errno.EBUSY)}"
    ]


def test_a_group_already_gone_is_not_retried_and_other_errors_are_logged(monkeypatch, tmp_path, caplog):
    assert _remove(monkeypatch, tmp_path, [errno.ENOENT])[:2] == (1, 0)
    assert "cannot remove" not in caplog.text
    assert _remove(monkeypatch, tmp_path, [errno.ENOTEMPTY])[:2] == (1, 0)
    assert "cannot remove the sandbox cgroup" in caplog.text


def test_the_stale_age_is_60_seconds(monkeypatch, tmp_path):
    base = tmp_path / "pids"
    base.mkdir()
    now = 1_000_000.0
    ages = {"swe-old": 60.5, "swe-exactly": 60.0, "swe-young": 59.5}
    for name, age in ages.items():
        (base / name).mkdir()
        os.utime(base / name, (now - age, now - age))
    monkeypatch.setattr(cgroups, "parents", lambda: ("v1", [tmp_path / "missing", base]))
    with monkeypatch.context() as m:
        m.setattr(cgroups.time, "time", lambda: now)
        cgroups.sweep_stale_groups()
    assert sorted(p.name for p in base.iterdir()) == ["swe-exactly", "swe-young"]


def test_a_process_this_one_may_not_signal_is_skipped(monkeypatch, tmp_path):
    p = _sleeper()
    (tmp_path / "cgroup.procs").write_text(f"1\n{p.pid}\n")
    real_kill = os.kill

    def kill(pid, sig):
        if pid == 1:  # e.g. a process of another user that joined by mistake
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_kill(pid, sig)

    monkeypatch.setattr(cgroups.os, "kill", kill)
    try:
        SandboxCgroup("v2", [tmp_path]).kill()
        assert p.wait(timeout=10) == -9
    finally:
        p.kill()


def test_a_descriptor_that_fails_reads_0_and_closes_quietly(monkeypatch, tmp_path):
    base = tmp_path / "unified"
    base.mkdir()
    monkeypatch.setattr(cgroups, "parents", lambda: ("v2", [base]))
    g = SandboxCgroup.create("sbx-f", 256 * MB, 8)
    (g.folders[0] / "pids.events").write_text("max 2\n")
    assert g.events()["processes"] == 2
    os.close(g._fds[g.folders[0] / "pids.events"])  # the descriptor fails (EBADF) from now on
    assert g.events()["processes"] == 0
    g.remove()  # closing it again fails too: not raised
    assert g._fds == {}


class _RefusingPath(type(Path())):
    """A folder whose swap limit files the kernel refuses (no swap accounting); everything else as it is."""

    def write_text(self, data, *args, **kwargs):
        if self.name in ("memory.swap.max", "memory.memsw.limit_in_bytes"):
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().write_text(data, *args, **kwargs)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_without_swap_accounting_the_group_is_made_all_the_same(monkeypatch, tmp_path, version):
    bases = [_RefusingPath(tmp_path / n) for n in (("memory", "pids") if version == "v1" else ("unified",))]
    for b in bases:
        b.mkdir()
    monkeypatch.setattr(cgroups, "parents", lambda: (version, bases))
    g = SandboxCgroup.create("sbx-w", 256 * MB, 8)
    assert g is not None and (g.folders[-1] / "pids.max").read_text() == "8"


def test_a_failed_v1_group_names_the_memory_hierarchy(monkeypatch, tmp_path, caplog):
    bases = [tmp_path / "memory", tmp_path / "pids"]
    bases[0].mkdir()  # the pids hierarchy is missing
    monkeypatch.setattr(cgroups, "parents", lambda: ("v1", bases))
    monkeypatch.setattr(cgroups, "_warned", set())
    assert SandboxCgroup.create("sbx-n", 256 * MB, 8) is None
    assert f"cannot make a cgroup under {bases[0]} (" in caplog.text
