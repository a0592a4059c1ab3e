"""`swe-megatron build-sifs`: one Apptainer SIF per task environment image, built in parallel into a shared folder.

    swe-megatron build-sifs data/swe-rebench/train.parquet --sif-dir /shared/sifs --jobs 8
    swe-megatron build-sifs tasks.jsonl --sif-dir /shared/sifs --tmp-dir /local/scratch --force

Each task's image is `tasks.plan.task_image`: the row's `image` (SWE-bench 5.x), else its `docker_image`
(SWE-rebench), else SWE-bench's published name `swebench/sweb.eval.x86_64.<instance_id>:latest` (lower-cased,
"__" written "_1776_"), with ":latest" added where a reference names no tag; tasks of this project in a local
repository have none. The SIF is `tasks.plan.sif_name(image)` in the folder: the grading plan of each task names
the same file, and the apptainer sandbox backend opens `sandbox.sif_dir/<that name>`.

A build runs `apptainer build OUT.partial docker://IMAGE` and renames the result into place, so a SIF
that exists is complete; existing SIFs are skipped (unless --force). SIF_DIR/manifest.json records every
image (image, sif, status built|present|failed, digest when the reference pins one, size, build time,
error tail) and is rewritten atomically after each build. Failures are reported and the rest go on; the
exit status is 1 when any build failed. Run one build-sifs per folder at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from swe_megatron.atomic_write import write_atomic
from swe_megatron.launch.slurm_env import LaunchError
from swe_megatron.tasks.plan import normal_image, sif_name, task_image

__all__ = ["SifBuilder", "SifRecord", "build_command", "sif_name", "task_image"]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


@dataclass
class SifRecord:
    """One image's line in the manifest."""

    image: str
    """Docker reference it was built from."""
    sif: str
    """File name in the SIF folder."""
    status: str
    """built, present (found, not rebuilt) or failed."""
    digest: str | None = None
    """sha256 digest when the reference pins one (image@sha256:...), else null."""
    size_bytes: int | None = None
    """Size of the SIF."""
    build_s: float | None = None
    """Wall-clock build time."""
    built_at: str | None = None
    """When the build finished (UTC, ISO 8601)."""
    error: str | None = None
    """Last lines of apptainer's output when it failed."""


def build_command(apptainer: str, image: str, out: Path) -> list[str]:
    """The apptainer command that builds image into out."""
    return [apptainer, "build", "--force", str(out), f"docker://{normal_image(image)}"]


class SifBuilder:
    """Builds SIFs for many images in parallel and keeps the manifest (see the module docstring)."""

    def __init__(self, sif_dir: str | Path, jobs: int = 4, tmp_dir: str | None = None, force: bool = False):
        self.sif_dir = Path(sif_dir)
        self.jobs = max(1, jobs)
        self.tmp_dir = tmp_dir
        self.force = force
        self.apptainer = shutil.which("apptainer")
        if self.apptainer is None:
            raise LaunchError(
                "apptainer is not on PATH: build SIFs on a node with Apptainer (module load apptainer?)"
            )
        self.sif_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.records: dict[str, dict] = self._read_manifest()

    def _read_manifest(self) -> dict[str, dict]:
        path = self.sif_dir / MANIFEST
        if not path.exists():
            return {}
        try:
            return json.loads(path.read_text())["images"]
        except (OSError, ValueError, KeyError) as e:
            raise LaunchError(
                f"{path} is not a SIF manifest ({e}); move it away to start a new one"
            ) from None

    def _record(self, rec: SifRecord) -> None:
        with self._lock:
            self.records[rec.image] = asdict(rec)
            doc = {"format": MANIFEST_FORMAT, "images": dict(sorted(self.records.items()))}
            write_atomic(self.sif_dir / MANIFEST, json.dumps(doc, indent=1) + "\n", mode=0o644)

    def build_one(self, image: str) -> SifRecord:
        """Build (or skip) one image; never raises for a failed build (it is recorded)."""
        name = sif_name(image)
        out = self.sif_dir / name
        digest = image.split("@", 1)[1] if "@sha256:" in image else None
        if out.exists() and not self.force:
            prev = self.records.get(image, {})
            rec = SifRecord(image, name, "present", digest or prev.get("digest"), out.stat().st_size,
                            prev.get("build_s"), prev.get("built_at"))  # fmt: skip
            self._record(rec)
            return rec
        partial = out.with_name(name + ".partial")
        env = dict(os.environ)
        if self.tmp_dir:
            env.update(APPTAINER_TMPDIR=self.tmp_dir, APPTAINER_CACHEDIR=str(Path(self.tmp_dir) / "cache"))
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                build_command(self.apptainer, image, partial),
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            ok, output = proc.returncode == 0 and partial.exists(), proc.stdout + proc.stderr
        except OSError as e:
            ok, output = False, str(e)
        took = round(time.monotonic() - t0, 2)
        if not ok:
            partial.unlink(missing_ok=True)
            tail = "\n".join(output.strip().splitlines()[-5:]) or "apptainer build failed without output"
            rec = SifRecord(image, name, "failed", digest, None, took, None, tail)
        else:
            os.replace(partial, out)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            rec = SifRecord(image, name, "built", digest, out.stat().st_size, took, stamp)
        self._record(rec)
        return rec

    def build_all(self, images: list[str], progress=print) -> list[SifRecord]:
        """Build every distinct image with `jobs` builds at once; returns their records in input order."""
        unique = list(dict.fromkeys(map(normal_image, images)))  # "r/i" and "r/i:latest": one image, one SIF
        with ThreadPoolExecutor(self.jobs) as pool:
            results = []
            for rec in pool.map(self.build_one, unique):
                progress(
                    f"{rec.status:8s} {rec.image}" + (f": {rec.error.splitlines()[-1]}" if rec.error else "")
                )
                results.append(rec)
        return results
