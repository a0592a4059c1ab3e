"""A library's Python environment: a venv of Debian's system Python with pytest and the library's
requirements, but not the library itself (tests import it from the repository, /testbed in a sandbox).

The venv is made from /usr/bin/python3.11 because sandboxes bind the system's /usr read-only and nothing
under /root; bin/python links to the system interpreter, so the folder works wherever it is mounted
(sandboxes mount it at /opt/venv). Run tools as `python -m pytest`: console scripts carry the host path.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from swe_megatron.atomic_write import write_atomic
from swe_megatron.tasks.factory.errors import LibraryUnusable
from swe_megatron.tasks.factory.pypi import PYTEST_REQUIREMENT, normalize

SYSTEM_PYTHON = "/usr/bin/python3.11"
"""The interpreter environments are made from (visible inside sandboxes)."""
MARKER = ".swe-megatron-env.json"
TEST_EXTRAS = ("test", "tests", "testing")
REQUIREMENT_FILES = (
    "requirements-test.txt",
    "requirements_test.txt",
    "requirements-tests.txt",
    "test-requirements.txt",
    "test_requirements.txt",
    "requirements/test.txt",
    "requirements/tests.txt",
    "tests/requirements.txt",
)
# Tools that test configs name but the test run itself does not need (coverage, linters, docs, packaging).
NOT_NEEDED = {
    "pytest", "tox", "nox", "coverage", "pytest-cov", "codecov", "coveralls", "flake8", "pylint", "black",
    "mypy", "ruff", "pre-commit", "sphinx", "twine", "wheel", "build", "setuptools", "pytest-codspeed", "isort",
}  # fmt: skip


def library_requirements(src: Path, name: str, extra: tuple[str, ...] = ()) -> list[str]:
    """What the library's tests need besides pytest: its runtime requirements and test extras, from the
    sdist's metadata (PKG-INFO, *.egg-info/requires.txt, pyproject dependency groups, test requirement
    files), markers evaluated for this Python; sorted, the library itself and tooling left out."""
    found: list[str] = list(extra)
    pkg_info = src / "PKG-INFO"
    if pkg_info.is_file():
        for line in pkg_info.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Requires-Dist:"):
                found.append(line.split(":", 1)[1].strip())
            if not line.strip():
                break  # the headers end at the first blank line
    for requires in sorted(src.glob("*.egg-info/requires.txt")) + sorted(
        src.glob("src/*.egg-info/requires.txt")
    ):
        section = ""
        for line in requires.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
            elif line and (section == "" or section.split(":")[0] in TEST_EXTRAS):
                found.append(line if ":" not in section else f"{line}; {section.split(':', 1)[1]}")
    pyproject = src / "pyproject.toml"
    if pyproject.is_file():
        try:
            groups = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("dependency-groups", {})
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            groups = {}
        for g in TEST_EXTRAS:
            found += [r for r in groups.get(g, []) if isinstance(r, str)]
    for rel in REQUIREMENT_FILES:
        path = src / rel
        if path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                line = line.split(" #", 1)[0].strip()
                if line and not line.startswith(("#", "-")):
                    found.append(line)
    out = set()
    for text in found:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.url or normalize(req.name) in NOT_NEEDED or normalize(req.name) == normalize(name):
            continue
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *TEST_EXTRAS)):
            continue
        req.marker = None
        out.add(str(req))
    return sorted(out)


def build_env(
    env_dir: Path, requirements: list[str], python: str = SYSTEM_PYTHON, timeout_s: float = 600.0
) -> None:
    """Create (or reuse, when made from the same interpreter and requirements) the venv at env_dir with
    pytest and `requirements`; LibraryUnusable when they cannot be installed.

    A pip-less venv with pytest is built once per folder (envs/.base-HASH) and copied; the library's own
    requirements are then installed into the copy by this process's pip (`pip --python`)."""
    if not Path(python).is_file():
        raise LibraryUnusable(
            "env", f"{python} does not exist (environments are made from Debian's python3.11)"
        )
    wanted = {"python": python, "requirements": [PYTEST_REQUIREMENT, *requirements]}
    if _marker_matches(env_dir, wanted):
        return
    base = _base_env(env_dir.parent, python, timeout_s)
    if env_dir.exists():
        shutil.rmtree(env_dir)
    shutil.copytree(base, env_dir, symlinks=True)
    (env_dir / MARKER).unlink()
    if requirements:
        try:
            _pip_install(env_dir, requirements, timeout_s)
        except LibraryUnusable:
            shutil.rmtree(env_dir, ignore_errors=True)
            raise
    write_atomic(env_dir / MARKER, json.dumps(wanted))


_base_lock = threading.Lock()


def _base_env(envs: Path, python: str, timeout_s: float) -> Path:
    wanted = {"python": python, "requirements": [PYTEST_REQUIREMENT]}
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:12]
    base = envs / f".base-{digest}"
    with _base_lock:  # libraries are prepared in parallel; the first one builds the base
        if _marker_matches(base, wanted):
            return base
        if base.exists():
            shutil.rmtree(base)
        envs.mkdir(parents=True, exist_ok=True)
        _run([python, "-m", "venv", "--without-pip", str(base)], timeout_s, base, "create a venv")
        _pip_install(base, [PYTEST_REQUIREMENT], timeout_s)
        write_atomic(base / MARKER, json.dumps(wanted))
    return base


def _pip_install(env_dir: Path, requirements: list[str], timeout_s: float) -> None:
    cmd = [
        sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "--no-input",
        "--disable-pip-version-check", "--quiet", "--no-warn-script-location", *requirements,
    ]  # fmt: skip
    _run(cmd, timeout_s, env_dir, f"install {' '.join(requirements)}")


def _run(cmd: list[str], timeout_s: float, env_dir: Path, what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise LibraryUnusable("env", f"cannot {what}: took longer than {timeout_s:.0f}s") from None
    if proc.returncode != 0:
        shutil.rmtree(env_dir, ignore_errors=True)
        tail = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if "WARNING" not in ln][-3:]
        raise LibraryUnusable("env", f"cannot {what}: {' | '.join(tail)}")


def _marker_matches(env_dir: Path, wanted: dict) -> bool:
    try:
        return json.loads((env_dir / MARKER).read_text()) == wanted
    except (OSError, ValueError):
        return False


def env_python(env_dir: Path) -> str:
    """The environment's interpreter."""
    return str(env_dir / "bin" / "python")
