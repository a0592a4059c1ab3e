"""tools/check_gpu_pins.py: the GPU extra / trainer.def pins against the packages' metadata.

The fixtures copy the requirement lines that matter from the real wheels' METADATA (vllm 0.33.0 x86_64,
torch 2.13.0 / 2.14.0 cp312 x86_64, transformer-engine 2.20.2, megatron-core 0.19.2 cp312). The live
check against PyPI skips when pypi.org is unreachable.
"""

from __future__ import annotations

import importlib.util
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_gpu_pins", ROOT / "tools" / "check_gpu_pins.py")
pins_mod = importlib.util.module_from_spec(_spec)
sys.modules["check_gpu_pins"] = pins_mod
_spec.loader.exec_module(pins_mod)

TORCH_CU13 = [
    'cuda-toolkit[cublas,cudart,nvrtc]==13.0.3; platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
    "filelock",
]
META = {
    "torch": {"requires_python": ">=3.10", "requires_dist": TORCH_CU13},
    "vllm": {
        "requires_python": "<3.15,>=3.11",
        "requires_dist": [
            "torch==2.14.0",
            "torchvision==0.29.0",
            "transformers<5.21.0,>=5.16.1",
            "certifi>=2026.10.19",
            'zentorch==2.14.0.1; extra == "zen"',
        ],
    },
    "megatron-core": {
        "requires_python": ">=3.12",
        "requires_dist": ["torch>=2.6.0", 'transformer-engine[core_cu13,pytorch]; extra == "te"'],
    },
    "transformer-engine": {
        "requires_python": ">=3.10.0",
        "requires_dist": [
            'transformer_engine_cu12==2.20.2; extra == "core"',
            'transformer_engine_cu13==2.20.2; extra == "core-cu13"',
            'transformer_engine_torch==2.20.2; extra == "pytorch"',
        ],
        "provides_extra": ["core", "core-cu12", "core-cu13", "pytorch", "jax"],
    },
    "transformers": {"requires_python": ">=3.10.0", "requires_dist": ["tokenizers<0.24.0,>=0.23.1"]},
    "certifi": {"requires_python": ">=3.7", "requires_dist": []},
}
VERSIONS = {"certifi": ["2026.7.22", "2026.10.19.post1"]}
GOOD = [
    "torch==2.14.0",
    "vllm==0.33.0",
    "megatron-core==0.19.2",
    "transformer-engine[pytorch,core-cu13]==2.20.2",
    "transformers==5.19.0",
    "certifi>=2026.10.19",
]
TODAY = ["torch==2.13.0", "vllm==0.33.0", "megatron-core==0.19.2", "transformer-engine[pytorch]==2.20.2"]


def run_check(pins: list[str], image=(13, 0), image_versions=None, meta=META):
    """check() on fixture metadata; ranges admit the fixture's published versions."""
    reqs = [Requirement(p) for p in pins]
    versions = {}
    for r in reqs:
        exact = [s.version for s in r.specifier if s.operator == "=="]
        versions[r.name] = exact or [v for v in VERSIONS[r.name] if r.specifier.contains(v)]
    return pins_mod.check(reqs, image, image_versions or {}, meta, versions)


def test_todays_pins_report_the_torch_conflict():
    conflicts, _ = run_check(TODAY, image=(12, 8), image_versions={"torch": "2.13.0"})
    assert "vllm==0.33.0 requires torch==2.14.0, pinned torch==2.13.0" in conflicts
    assert any("image is CUDA 12.8, torch is built for CUDA 13.0" in c for c in conflicts)
    assert any("core-cu13" in c and "found none" in c for c in conflicts)


def test_consistent_pins_pass_and_report_cuda():
    conflicts, rows = run_check(GOOD, image_versions={"torch": "2.14.0"})
    assert conflicts == []
    assert ("CUDA", "13.0", "torch; image (13, 0); TE core-cu13") in rows
    assert ("certifi", "2026.10.19.post1", "certifi>=2026.10.19") in rows


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"transformers==5.19.0": "transformers==5.22.0"}, "requires transformers<5.21.0,>=5.16.1"),
        ({"certifi>=2026.10.19": "certifi>=2026.1"}, "requires certifi>=2026.10.19, pinned certifi>=2026.1"),
        (
            {
                "transformer-engine[pytorch,core-cu13]==2.20.2": "transformer-engine[pytorch,core-cu12]==2.20.2"
            },
            "found ['core-cu12']",
        ),
        (
            {"transformer-engine[pytorch,core-cu13]==2.20.2": "transformer-engine[pytorch,cu13]==2.20.2"},
            "no extra",
        ),
    ],
)
def test_each_kind_of_conflict_is_reported(change, expected):
    conflicts, _ = run_check([change.get(p, p) for p in GOOD])
    assert any(expected in c for c in conflicts), conflicts


def test_python_marker_and_image_checks():
    meta = {**META, "megatron-core": {**META["megatron-core"], "requires_python": ">=3.13"}}
    images = {"torch": "2.13.0", "flash-attn": "2.8.0"}
    conflicts, _ = run_check(GOOD, meta=meta, image=(13, 0), image_versions=images)
    assert "megatron-core==0.19.2 requires Python >=3.13, the image has 3.12" in conflicts
    assert "trainer.def installs torch==2.13.0, the gpu extra pins torch==2.14.0" in conflicts
    assert "trainer.def installs flash-attn==2.8.0, the gpu extra pins nothing" in conflicts
    # zentorch is behind vllm's `zen` extra and torchvision is not pinned: neither is a conflict.
    assert not any("zentorch" in c or "torchvision" in c for c in conflicts)


def test_cuda_from_nvidia_wheel_names_when_no_toolkit():
    reqs = [Requirement("nvidia-cuda-runtime-cu12==12.8.90"), Requirement("filelock")]
    assert pins_mod.cuda_of(reqs) == (12, None)
    assert pins_mod.cuda_of([Requirement(r) for r in TORCH_CU13]) == (13, 0)


def test_repo_files_parse_and_agree():
    reqs = pins_mod.extra_pins(ROOT / "pyproject.toml")
    cuda, installed = pins_mod.image_pins(ROOT / "containers" / "trainer.def")
    assert cuda == (13, 0)
    by_name = {r.name: str(r.specifier) for r in reqs}
    assert by_name["torch"] == f"=={installed['torch']}"


def _wheel(folder: Path, name: str, version: str, meta_lines: list[str]) -> None:
    """A minimal py3-none-any wheel with the given METADATA lines."""
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        body = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *meta_lines])
        z.writestr(f"{dist}.dist-info/METADATA", body + "\n")


def test_offline_wheel_dir_cli(tmp_path, capsys):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project.optional-dependencies]\ngpu = ["torch==2.13.0", "vllm==0.33.0"]\n')
    definition = tmp_path / "trainer.def"
    definition.write_text("Bootstrap: docker\nFrom: nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04\n%post\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "torch", "2.13.0", [f"Requires-Dist: {r}" for r in TORCH_CU13])
    _wheel(wheels, "vllm", "0.33.0", ["Requires-Python: >=3.11", "Requires-Dist: torch==2.14.0"])
    args = ["--wheels", str(wheels), "--pyproject", str(pyproject), "--definition", str(definition)]
    assert pins_mod.main(args) == 1
    assert "CONFLICT vllm==0.33.0 requires torch==2.14.0, pinned torch==2.13.0" in capsys.readouterr().out
    _wheel(wheels, "torch", "2.14.0", [f"Requires-Dist: {r}" for r in TORCH_CU13])
    pyproject.write_text('[project.optional-dependencies]\ngpu = ["torch==2.14.0", "vllm==0.33.0"]\n')
    assert pins_mod.main(args) == 0
    assert "gpu pins consistent" in capsys.readouterr().out
    (wheels / "vllm-0.33.0-py3-none-any.whl").unlink()
    assert pins_mod.main(args) == 2


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
        return True
    except OSError:
        return False


def test_repo_pins_against_live_pypi(capsys):
    if not _pypi_reachable():
        pytest.skip("pypi.org unreachable: the live metadata check needs it (the fixtures above run offline)")
    assert pins_mod.main([]) == 0, capsys.readouterr().out
