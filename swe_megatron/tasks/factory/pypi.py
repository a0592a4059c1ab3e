"""Pinned PyPI source archives: which libraries, fetching them with pip, checking hashes, unpacking.

Source archives (sdists) are fetched with `pip download` (the ordinary client, with the machine's pip
configuration), one package per call so one failure names its package and the rest go on. Each lands in
sdists/NAME-VERSION/ and is reused from there; a pinned sha256 is checked on every use.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from swe_megatron.tasks.factory.errors import LibraryUnusable

PYTEST_REQUIREMENT = "pytest==8.4.2"
"""The pytest every library environment gets (pytest 9 dropped hooks that e.g. boltons' conftest uses)."""


@dataclass(frozen=True)
class PackageSpec:
    """One library to make tasks from: an exact PyPI release, optionally pinned by its sdist's sha256."""

    name: str
    """Project name on PyPI."""
    version: str
    """Exact version."""
    sha256: str | None = None
    """Hash of the sdist; checked when set (the default list sets it for every package)."""
    test_deps: tuple[str, ...] = field(default=())
    """Extra requirements its test suite needs beyond what its metadata declares."""

    @property
    def key(self) -> str:
        """NAME-VERSION with the name normalised (PEP 503)."""
        return f"{normalize(self.name)}-{self.version}"

    @property
    def requirement(self) -> str:
        """NAME==VERSION."""
        return f"{self.name}=={self.version}"

    @classmethod
    def parse(cls, text: str) -> PackageSpec:
        """NAME==VERSION (as given to --package); a default-list entry of that release keeps its hash."""
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*", text)
        if not m:
            raise ValueError(
                f"--package {text!r}: expected NAME==VERSION (an exact PyPI release, e.g. toolz==1.1.0)"
            )
        name, version = m.groups()
        for spec in DEFAULT_PACKAGES:
            if normalize(spec.name) == normalize(name) and spec.version == version:
                return spec
        return cls(name=name, version=version)


# Pure-Python libraries whose sdists ship pytest suites that pass on Python 3.11 and run in seconds.
DEFAULT_PACKAGES: tuple[PackageSpec, ...] = (
    PackageSpec("toolz", "1.1.0", "27a5c770d068c110d9ed9323f24f1543e83b2f300a687b7891c1a6d56b697b5b"),
    PackageSpec("boltons", "25.0.0", "e110fbdc30b7b9868cb604e3f71d4722dd8f4dcb4a5ddd06028ba8f1ab0b5ace"),
    PackageSpec("cachetools", "8.0.1", "deb1d376d4d28c2f33f3e3058043b005e0af75c35c094bd54053e27d2906ad95"),
    PackageSpec("semver", "3.1.1", "149b26cabada6f63212f97e94505d21578cb1d280cf714827f328d5e70765fea"),
    PackageSpec("parse", "1.22.4", "706d458feed5a81b02768d3156e8070baf6cee7d150a3a3c0cd43101a875c3b5"),
    PackageSpec("inflection", "0.5.1", "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417"),
    PackageSpec("tabulate", "0.10.0", "e2cfde8f79420f6deeffdeda9aaec3b6bc5abce947655d17ac662b126e48a60d"),
)
DEFAULT_TEST_LIBRARIES = ("inflection", "tabulate")
"""Libraries of the default list whose tasks form the test split (unseen in train)."""


def normalize(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(spec: PackageSpec, sdists_dir: Path, timeout_s: float = 300.0) -> tuple[Path, str]:
    """The sdist of `spec` under sdists_dir/KEY/ (downloaded once) and its sha256; LibraryUnusable if it
    cannot be had or its hash differs from the pin."""
    folder = sdists_dir / spec.key
    archive = _archive_in(folder)
    if archive is None:
        sdists_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=sdists_dir, prefix=".download-") as tmp:
            cmd = [
                sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", spec.name,
                "--disable-pip-version-check", "--no-input", "--quiet", "--dest", tmp,
            ]  # fmt: skip
            if spec.sha256:
                req = Path(tmp) / "requirement.txt"
                req.write_text(f"{spec.requirement} --hash=sha256:{spec.sha256}\n")
                cmd += ["--require-hashes", "-r", str(req)]
            else:
                cmd.append(spec.requirement)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise LibraryUnusable("download", f"pip download took longer than {timeout_s:.0f}s") from None
            got = _archive_in(Path(tmp))
            if proc.returncode != 0 or got is None:
                lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
                why = next((ln for ln in reversed(lines) if ln.startswith("ERROR:")), lines[-1])
                raise LibraryUnusable(
                    "download", f"no sdist of {spec.requirement}: pip: {why.removeprefix('ERROR: ')}"
                )
            staged = Path(tmp) / "done"
            staged.mkdir()
            shutil.move(str(got), staged / got.name)
            if folder.exists():
                shutil.rmtree(folder)
            staged.rename(folder)
        archive = _archive_in(folder)
        assert archive is not None
    digest = sha256_of(archive)
    if spec.sha256 and digest != spec.sha256:
        shutil.rmtree(folder, ignore_errors=True)
        raise LibraryUnusable("hash", f"{archive.name} has sha256 {digest}, pinned {spec.sha256}")
    return archive, digest


def _archive_in(folder: Path) -> Path | None:
    if not folder.is_dir():
        return None
    found = sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".tgz", ".zip", ".tar.bz2")))
    return found[0] if found else None


def unpack(archive: Path, dest: Path) -> Path:
    """Extract an sdist into dest (which must not exist) without its top-level folder; returns dest."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".unpack-"))
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for name in z.namelist():
                    if name.startswith("/") or ".." in Path(name).parts:
                        raise LibraryUnusable("unpack", f"{archive.name} holds an unsafe path {name!r}")
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")
        tops = list(tmp.iterdir())
        root = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
        root.rename(dest)
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
        raise LibraryUnusable("unpack", f"cannot unpack {archive.name}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
