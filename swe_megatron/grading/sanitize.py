"""Strip the parts of a model patch that could change how it is graded (grading cannot be gamed from the patch).

The patch is parsed with unidiff and rebuilt from what was parsed, file by file, keeping only edits to
ordinary source files. Dropped, whatever the hunk says (the rule is by path, so deleting or renaming
a protected file is dropped too):

- test files: ``test_*.py``, ``*_test.py``, anything under a ``tests/``, ``test/`` or ``testing/``
  folder (as the task factory classifies them), and the task's own test files (those the test patch
  touches and those its test ids name), their folders and any path below them (a file created where a
  test folder or file belongs would stop the test patch from applying);
- ``conftest.py`` anywhere;
- test-runner configuration, whole files: ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``, ``tox.ini``,
  ``setup.cfg``, ``pyproject.toml``, ``noxfile.py``. Reading a ``pyproject.toml`` hunk to decide whether
  it touches ``[tool.pytest.*]`` is not safe (a hunk shows a few lines of context, not the section it
  is in), so any edit of these files is dropped; a task whose gold patch needs one is visible in the
  grade report (its gold patch has dropped files) and can be filtered out of the pool;
- interpreter start-up hooks: ``*.pth``, ``sitecustomize.py``, ``usercustomize.py``;
- package metadata a runner may load plugins from: ``*.egg-info/``, ``*.dist-info/``,
  ``entry_points.txt``, ``*.egg-link`` (pytest auto-loads ``pytest11`` entry points found on sys.path);
- git internals and caches: ``.git/``, ``.gitattributes``, ``.gitmodules``, ``__pycache__/``, ``*.pyc``,
  ``.pytest_cache/``;
- modules at the repository root that would shadow the test runner (``pytest.py``, ``_pytest/``,
  ``pluggy/``, ...) or a standard-library module (``python -m pytest`` puts the root first on sys.path);
- anything outside the repository (absolute paths, ``..``), binary patches, symlinks, submodules,
  edits that make a file executable, and file modes that are not six octal digits.

A patch that does not parse is graded as an empty patch with the reason recorded: a model outcome,
never an infrastructure error. Extended git header lines other than the known ones are not copied
into the rebuilt patch, so what ``git apply``/``patch`` see is exactly what was checked here.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from unidiff import PatchedFile, PatchSet
from unidiff.errors import UnidiffParseError

DEV_NULL = "/dev/null"

TEST_DIRS = frozenset({"tests", "test", "testing"})
CONFIG_FILES = frozenset(
    {
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
    }
)
STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})
INTERNAL_DIRS = frozenset({".git", "__pycache__", ".pytest_cache"})
GIT_FILES = frozenset({".gitattributes", ".gitmodules"})
RUNNER_MODULES = frozenset(
    {"pytest", "_pytest", "pluggy", "py", "iniconfig", "xdist", "_swe_megatron_grade_record"}
)

# Extended git header lines that may be copied into the rebuilt patch; anything else in a file's
# header block (e.g. an "Index:" line GNU patch would read a file name from) is left out.
_GIT_HEADER_LINE = re.compile(
    r"^(diff --git |index [0-9a-f]+\.\.[0-9a-f]+|(old|new|deleted file|new file) mode \d+$"
    r"|(dis)?similarity index \d+%$|(rename|copy) (from|to) )"
)
_MODE = re.compile(r"[0-7]{6}")
_HEADER_PATH = re.compile(r"^(rename|copy) (from|to) (.*)$")
# Added lines that reach into the test runner or end the process; reported for monitoring, not acted on.
_SUSPICIOUS = re.compile(r"\b_?pytest\b|\bPYTEST_|os\._exit\b|\bpluggy\b")


@dataclass(frozen=True)
class DroppedFile:
    """One file edit the sanitiser removed from a patch."""

    path: str
    """Path in the repository, as the patch names it."""
    reason: str
    """Why it was dropped (a short fixed phrase, usable as a metric label)."""


@dataclass
class SanitizedPatch:
    """A model patch with the edits that could game grading removed."""

    patch: str
    """The patch to apply; "" when nothing is left."""
    kept: list[str] = field(default_factory=list)
    """Paths whose edits were kept."""
    dropped: list[DroppedFile] = field(default_factory=list)
    """Edits removed, with the reason."""
    parse_error: str | None = None
    """Why the patch could not be parsed (it is then graded as empty); None when it parsed."""
    suspicious: list[str] = field(default_factory=list)
    """Kept added lines that mention the test runner or os._exit ("path: line"), for review only."""

    @property
    def is_empty(self) -> bool:
        """Nothing is left to apply."""
        return not self.patch.strip()


def sanitize_patch(patch: str | None, protected: Iterable[str] = ()) -> SanitizedPatch:
    """Parse `patch` and return it without edits to tests, runner config, start-up hooks and the like.

    `protected` lists further repository paths (the task's test files) whose edits are dropped.
    """
    if patch is None or not patch.strip():
        return SanitizedPatch(patch="")
    try:
        files = PatchSet(patch if patch.endswith("\n") else patch + "\n")
    except UnidiffParseError as e:
        return SanitizedPatch(patch="", parse_error=f"unparseable patch: {e}")
    except Exception as e:  # whatever else a malformed patch trips in the parser is still the model's
        return SanitizedPatch(patch="", parse_error=f"unparseable patch: {type(e).__name__}: {e}")
    if not files:
        return SanitizedPatch(patch="", parse_error="no file diffs found in the patch")
    protected_set = {_normalise(p) for p in protected}
    result = SanitizedPatch(patch="")
    pieces = []
    for pf in files:
        reason = _drop_reason(pf, protected_set)
        if reason:
            result.dropped.append(DroppedFile(path=pf.path, reason=reason))
            continue
        result.kept.append(pf.path)
        pieces.append(_rebuild(pf))
        for hunk in pf:
            for line in hunk:
                if line.is_added and _SUSPICIOUS.search(line.value):
                    result.suspicious.append(f"{pf.path}: {line.value.strip()[:160]}")
    result.patch = "".join(pieces)
    return result


def task_test_paths(
    test_patch: str, test_ids: Iterable[str] = (), test_files: Iterable[str] = ()
) -> set[str]:
    """The repository paths a task's grading depends on: files the test patch touches, files its test
    ids live in ("path::name"), and explicitly listed test files."""
    paths = {_normalise(p) for p in test_files}
    paths |= {_normalise(t.split("::", 1)[0]) for t in test_ids if "::" in t}
    if test_patch and test_patch.strip():
        for pf in PatchSet(test_patch if test_patch.endswith("\n") else test_patch + "\n"):
            paths |= {p for p in _candidate_paths(pf) if p}
    return {p for p in paths if p}


def _rebuild(pf: PatchedFile) -> str:
    """The file's diff as unidiff parsed it, with only known git header lines kept."""
    if pf.patch_info is not None:
        pf.patch_info[:] = [line for line in pf.patch_info if _GIT_HEADER_LINE.match(line)]
    return str(pf)


def _normalise(path: str) -> str:
    return str(PurePosixPath(path.strip())) if path.strip() else ""


def _strip_prefix(name: str) -> tuple[str, ...]:
    """Ways `git apply`/`patch -p1` may read a diff file name: as written and with the first component
    stripped (a rule must hold for both, so an unusual prefix cannot hide a path)."""
    if name.startswith('"') and name.endswith('"') and len(name) >= 2:
        name = name[1:-1]
    if name == DEV_NULL or not name:
        return ()
    parts = name.split("/", 1)
    return (name, parts[1]) if len(parts) == 2 and parts[1] else (name,)


def _candidate_paths(pf: PatchedFile) -> list[str]:
    """Every path the file entry could write: both header names (raw and -p1) and rename/copy lines."""
    names = []
    for name in (pf.source_file, pf.target_file):
        if name:
            names.extend(_strip_prefix(name))
    for line in pf.patch_info or []:
        m = _HEADER_PATH.match(line.rstrip("\n"))
        if m:
            names.append(m.group(3).strip().strip('"'))
    return names


def _drop_reason(pf: PatchedFile, protected: set[str]) -> str | None:
    """Why this file's edit must be dropped, or None to keep it."""
    if pf.is_binary_file:
        return "binary patch"
    if pf.is_symlink or pf.source_mode == "120000":
        return "symlink"
    if pf.is_submodule:
        return "submodule"
    # git writes a mode as six octal digits; unidiff takes any digits ("100999"), which int(_, 8) refuses.
    if any(mode and not _MODE.fullmatch(mode) for mode in (pf.source_mode, pf.target_mode)):
        return "invalid file mode"
    if pf.target_mode and pf.target_mode != pf.source_mode and int(pf.target_mode, 8) & 0o111:
        return "makes a file executable"
    paths = _candidate_paths(pf)
    if not paths:
        return "no file name"
    reasons = [_path_reason(p, protected) for p in paths]
    return next((r for r in reasons if r), None)


def _path_reason(path: str, protected: set[str]) -> str | None:
    """Why an edit of `path` must be dropped, or None."""
    if "\\" in path or "\t" in path or path.startswith("/") or path.startswith("~"):
        return "outside the repository"
    parts = PurePosixPath(path).parts
    if not parts or any(p in ("..", "") for p in parts):
        return "outside the repository"
    name = parts[-1]
    norm = _normalise(path)
    # The task's test files, the folders above them (a file there would stop the test patch) and anything
    # below them (a file "test_x.py/keep.txt" turns the test file into a folder the restore cannot write).
    if norm in protected or any(p.startswith(norm + "/") or norm.startswith(p + "/") for p in protected):
        return "task test file"
    if name == "conftest.py":
        return "conftest.py"
    if any(p in TEST_DIRS for p in parts) or (
        name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
    ):
        return "test file"
    if name in CONFIG_FILES:
        return "test runner config"
    if name in STARTUP_HOOKS or name.endswith(".pth"):
        return "interpreter start-up hook"
    if (
        any(p.endswith((".egg-info", ".dist-info")) for p in parts)
        or name in ("entry_points.txt",)
        or name.endswith(".egg-link")
    ):
        return "package metadata"
    if any(p in INTERNAL_DIRS for p in parts) or name in GIT_FILES or name.endswith((".pyc", ".pyo")):
        return "git or cache internals"
    top = parts[0]
    top_module = top[:-3] if top.endswith(".py") else top
    if top_module in RUNNER_MODULES or (len(parts) == 1 and top_module in sys.stdlib_module_names):
        return "shadows the test runner or standard library"
    return None
