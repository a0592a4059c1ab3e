#!/usr/bin/env python3
"""Check that the GPU install resolves: the `gpu` extra of pyproject.toml and containers/trainer.def
against the pinned packages' published metadata.

Checks, for Python 3.12 on linux x86_64 (the cluster image):
- every requirement a pinned package declares on another pinned package is met by that pin
  (a `>=` pin must admit only versions the dependent accepts);
- each pin supports Python 3.12;
- torch's CUDA major (from its cuda-toolkit / nvidia-*-cuXX requirements) equals the CUDA major of the
  image's `From:` line and the Transformer Engine core variant named in the pin's extras (core-cuXX);
  the TE torch extension (an sdist) builds against torch's CUDA and needs that same core wheel;
- the versions pip-installed in trainer.def equal the extra's.

Metadata comes from each wheel's METADATA, never from PyPI's JSON `info.requires_dist`: for vllm 0.33.0
that field shows torch==2.13.0 while the x86_64 wheel declares torch==2.14.0. Online it reads the wheel
through PyPI's simple JSON API (the `.metadata` file when offered, else HTTP range reads of the zip);
offline `--wheels DIR` reads wheels from DIR (`pip download --no-deps PKG==VER -d DIR` for each pin).

Usage: tools/check_gpu_pins.py [--wheels DIR]   exit 0 (prints a table) when consistent, 1 (one line per
conflict) when not, 2 when metadata cannot be read.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tomllib
import urllib.request
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
SIMPLE = "https://pypi.org/simple/{}/"
CUDA_IMAGE = re.compile(r"^From:\s*\S*nvidia/cuda:(\d+)\.(\d+)[.\w-]*", re.M)
CUDA_REQ = re.compile(r"-cu(\d+)$")


class MetadataError(RuntimeError):
    """A pinned package's metadata could not be read."""


def wheel_fits(filename: str) -> bool:
    """Whether a wheel installs on CPython 3.12, linux x86_64."""
    _, _, _, tags = parse_wheel_filename(filename)
    for t in tags:
        py_ok = t.interpreter in ("py3", "cp312") or (t.abi == "abi3" and t.interpreter.startswith("cp3"))
        plat_ok = t.platform == "any" or (t.platform.endswith("x86_64") and "linux" in t.platform)
        if py_ok and plat_ok and t.abi in ("none", "abi3", "cp312"):
            return True
    return False


def parse_metadata(text: str) -> dict:
    """METADATA text -> {'requires_python': str, 'requires_dist': [str]}."""
    msg = HeaderParser().parsestr(text)
    return {
        "requires_python": msg.get("Requires-Python") or "",
        "requires_dist": msg.get_all("Requires-Dist") or [],
        "provides_extra": msg.get_all("Provides-Extra") or [],
    }


class _RangeFile(io.RawIOBase):
    """A remote file read with HTTP range requests (enough of a wheel's zip to reach METADATA)."""

    def __init__(self, url: str):
        self.url, self.pos = url, 0
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as r:
            self.size = int(r.headers["Content-Length"])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (offset, self.pos + offset, self.size + offset)[whence]
        return self.pos

    def readinto(self, buf) -> int:
        if self.pos >= self.size:
            return 0
        end = min(self.size, self.pos + len(buf)) - 1
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _zip_metadata(fileobj) -> str:
    """The METADATA text inside a wheel."""
    with zipfile.ZipFile(fileobj) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode()


class PyPI:
    """Published versions and wheel metadata from pypi.org's simple JSON API (PEP 691)."""

    def _index(self, name: str) -> dict:
        req = urllib.request.Request(
            SIMPLE.format(name), headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.load(r)
        except OSError as e:
            raise MetadataError(
                f"{name}: cannot read {SIMPLE.format(name)} ({e}); use --wheels DIR offline"
            ) from e

    def versions(self, name: str) -> list[str]:
        """All published versions of `name`."""
        return self._index(name).get("versions", [])

    def metadata(self, name: str, version: str) -> dict:
        """Parsed METADATA of a 3.12/x86_64 wheel of name==version."""
        files = [f for f in self._index(name)["files"] if f["filename"].endswith(".whl")]
        for f in files:
            if parse_wheel_filename(f["filename"])[1] == Version(version) and wheel_fits(f["filename"]):
                if f.get("core-metadata") or f.get("dist-info-metadata"):
                    with urllib.request.urlopen(f["url"] + ".metadata", timeout=60) as r:
                        return parse_metadata(r.read().decode())
                return parse_metadata(_zip_metadata(io.BufferedReader(_RangeFile(f["url"]), 1 << 16)))
        raise MetadataError(f"{name}=={version}: no wheel for Python 3.12 linux x86_64 on PyPI")


class WheelDir:
    """Published versions and wheel metadata from a folder of downloaded wheels (offline)."""

    def __init__(self, folder: Path):
        self.wheels = [p for p in Path(folder).glob("*.whl") if wheel_fits(p.name)]

    def versions(self, name: str) -> list[str]:
        """Versions of `name` present in the folder."""
        key = canonicalize_name(name)
        return [
            str(parse_wheel_filename(p.name)[1])
            for p in self.wheels
            if parse_wheel_filename(p.name)[0] == key
        ]

    def metadata(self, name: str, version: str) -> dict:
        """Parsed METADATA of the folder's wheel of name==version."""
        key = (canonicalize_name(name), Version(version))
        for p in self.wheels:
            if parse_wheel_filename(p.name)[:2] == key:
                return parse_metadata(_zip_metadata(p))
        raise MetadataError(
            f"{name}=={version}: no wheel in the folder (pip download --no-deps {name}=={version})"
        )


def extra_pins(pyproject: Path) -> list[Requirement]:
    """The requirements of pyproject.toml's `gpu` extra."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    return [Requirement(r) for r in extras["gpu"]]


def image_pins(definition: Path) -> tuple[tuple[int, int] | None, dict[str, str]]:
    """(CUDA (major, minor) of the `From:` image or None, {package: version} pip-installed with ==)."""
    text = definition.read_text()
    m = CUDA_IMAGE.search(text)
    cuda = (int(m.group(1)), int(m.group(2))) if m else None
    pins = {}
    for line in text.replace("\\\n", " ").splitlines():
        if "pip install" in line:
            for tok in re.findall(r"""["']?([A-Za-z0-9_.\-]+(?:\[[^\]]*\])?==[^\s"']+)""", line):
                r = Requirement(tok)
                pins[canonicalize_name(r.name)] = str(next(iter(r.specifier)).version)
    return cuda, pins


def cuda_of(requires: list[Requirement]) -> tuple[int, int | None] | None:
    """CUDA (major, minor or None) a torch wheel is built for, from its cuda-toolkit / nvidia-*-cuXX deps."""
    for r in requires:
        if canonicalize_name(r.name) == "cuda-toolkit":
            v = Version(next(iter(r.specifier)).version)
            return v.major, v.minor
    for r in requires:
        m = CUDA_REQ.search(canonicalize_name(r.name))
        if m and canonicalize_name(r.name).startswith("nvidia-"):
            return int(m.group(1)), None
    return None


def active(req: Requirement, extras: set[str]) -> bool:
    """Whether a Requires-Dist line applies on the target with the given extras requested."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**TARGET, "extra": e}) for e in extras | {""})


def check(
    pins: list[Requirement], image_cuda, image_versions: dict[str, str], meta: dict, versions: dict
) -> tuple:
    """Conflicts between the pins, the image and the metadata.

    pins: the extra's requirements; image_cuda: (major, minor) or None; image_versions: {name: version}
    from trainer.def; meta: {name: parsed METADATA of the pin's chosen version}; versions: {name: [versions
    the pin admits]} (one for ==, the published ones for ranges, newest last).
    Returns (conflicts: [str], rows: [(name, version, note)]).
    """
    conflicts, rows = [], []
    by_name = {canonicalize_name(p.name): p for p in pins}
    for name, pin in by_name.items():
        if not versions[name]:
            conflicts.append(f"{pin}: no published version matches")
    for name, pin in by_name.items():
        if not versions[name]:
            continue
        chosen = versions[name][-1]
        offered = {canonicalize_name(e) for e in meta[name].get("provides_extra", [])}
        for extra in sorted(pin.extras):
            if offered and canonicalize_name(extra) not in offered:
                conflicts.append(
                    f"{pin}: {name}=={chosen} has no extra [{extra}] (it offers {sorted(offered)})"
                )
        rp = meta[name]["requires_python"]
        if rp and not SpecifierSet(rp).contains(TARGET["python_full_version"]):
            conflicts.append(f"{name}=={chosen} requires Python {rp}, the image has 3.12")
        for line in meta[name]["requires_dist"]:
            req = Requirement(line)
            dep = canonicalize_name(req.name)
            if dep not in by_name or dep == name or not active(req, set(pin.extras)):
                continue
            bad = [v for v in versions[dep] if not req.specifier.contains(v, prereleases=True)]
            if bad:
                conflicts.append(
                    f"{name}=={chosen} requires {req.name}{req.specifier}, pinned {by_name[dep]}"
                )
        rows.append((name, chosen, str(pin)))
    torch = by_name.get("torch")
    torch_cuda = None
    if torch is not None and versions["torch"]:
        torch_cuda = cuda_of(
            [Requirement(r) for r in meta["torch"]["requires_dist"] if active(Requirement(r), set())]
        )
        if torch_cuda is None:
            conflicts.append(
                f"torch=={versions['torch'][-1]}: no CUDA requirement (cuda-toolkit / nvidia-*-cuXX)"
            )
    if torch_cuda is not None:
        if image_cuda is None:
            conflicts.append("containers/trainer.def: `From:` is not an nvidia/cuda:MAJOR.MINOR image")
        elif image_cuda[0] != torch_cuda[0] or (torch_cuda[1] is not None and image_cuda[1] < torch_cuda[1]):
            conflicts.append(
                f"trainer.def image is CUDA {image_cuda[0]}.{image_cuda[1]}, torch is built for CUDA "
                f"{'.'.join(str(x) for x in torch_cuda if x is not None)}: use an nvidia/cuda:{torch_cuda[0]}.x image"
            )
        te = by_name.get("transformer-engine")
        if te is not None:
            cores = sorted(e for e in te.extras if re.fullmatch(r"core[-_]cu\d+", e))
            if cores != [f"core-cu{torch_cuda[0]}"] and cores != [f"core_cu{torch_cuda[0]}"]:
                conflicts.append(
                    f"{te}: name the core wheel for torch's CUDA {torch_cuda[0]} in the extras "
                    f"(transformer-engine[pytorch,core-cu{torch_cuda[0]}]); found {cores or 'none'}"
                )
        te_core = f"TE core-cu{torch_cuda[0]}" if te is not None else "no TE"
        rows.append(
            (
                "CUDA",
                ".".join(str(x) for x in torch_cuda if x is not None),
                f"torch; image {image_cuda}; {te_core}",
            )
        )
    for name, version in image_versions.items():
        pin = by_name.get(name)
        if pin is None or not versions[name] or versions[name][-1] != version:
            conflicts.append(f"trainer.def installs {name}=={version}, the gpu extra pins {pin or 'nothing'}")
    return conflicts, rows


def gather(pins: list[Requirement], source) -> tuple[dict, dict]:
    """(meta, versions) for `check`, from a PyPI or WheelDir source."""
    meta, versions = {}, {}
    for pin in pins:
        name = canonicalize_name(pin.name)
        exact = [s.version for s in pin.specifier if s.operator == "=="]
        if exact:
            admitted = exact
        else:
            admitted = sorted((v for v in source.versions(name) if pin.specifier.contains(v)), key=Version)
        versions[name] = admitted
        if admitted:
            meta[name] = source.metadata(name, admitted[-1])
    return meta, versions


def main(argv: list[str] | None = None) -> int:
    """Command line: exit 0 when consistent, 1 with one line per conflict, 2 when metadata is unreadable."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", type=Path, help="read metadata from the wheels in this folder (offline)")
    ap.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    ap.add_argument("--definition", type=Path, default=ROOT / "containers" / "trainer.def")
    args = ap.parse_args(argv)
    pins = extra_pins(args.pyproject)
    image_cuda, image_versions = image_pins(args.definition)
    try:
        meta, versions = gather(pins, WheelDir(args.wheels) if args.wheels else PyPI())
    except MetadataError as e:
        print(f"check_gpu_pins: {e}", file=sys.stderr)
        return 2
    conflicts, rows = check(pins, image_cuda, image_versions, meta, versions)
    for c in conflicts:
        print(f"CONFLICT {c}")
    if conflicts:
        return 1
    for name, version, note in rows:
        print(f"{name:<22} {version:<22} {note}")
    print("gpu pins consistent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
