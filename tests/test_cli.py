"""The command line as a user types it (issue 27 items 1-3): overrides anywhere, --version, `python -m`."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swe_megatron import __version__
from swe_megatron.cli import parse_args

# Each command that takes key=value overrides, with its required arguments, and an override after its flags.
WITH_OVERRIDES = [
    ["show-config", "embedded"],
    ["run", "embedded"],
    ["eval", "embedded", "--checkpoint", "c", "--tasks", "t", "--runs", "1"],
    ["rollout", "embedded", "--tasks", "t", "--out", "o", "--policy", "gold"],
    ["grade", "--tasks", "t", "--predictions", "p", "--workers", "2"],
    ["launch", "embedded", "--cluster", "slurm"],
    ["build-sifs", "t", "--sif-dir", "d", "--config", "embedded"],
    ["sandbox-server", "--port", "0", "--config", "embedded"],
    ["job-step", "init", "embedded", "--job-dir", "j"],
]


@pytest.mark.parametrize("argv", WITH_OVERRIDES, ids=[a[0] for a in WITH_OVERRIDES])
def test_overrides_after_options(argv):
    """`launch embedded --cluster slurm cluster=cpu-3x` (README) was 'unrecognized arguments'."""
    args = parse_args([*argv, "cluster=cpu-3x", "sampling.max_tokens_per_turn=256"])
    assert args.overrides == ["cluster=cpu-3x", "sampling.max_tokens_per_turn=256"]
    if argv[1] == "embedded":  # CONFIG first: overrides before and after the options
        args = parse_args([argv[0], argv[1], "a.b=1", *argv[2:], "c.d=2"])
        assert args.config == "embedded" and args.overrides == ["a.b=1", "c.d=2"]  # order kept


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "embedded", "--bogus"],
        ["plan", "paper-72b", "a=1"],  # plan takes a preset but no overrides
        ["make-tasks", "--out", "d", "seed=1"],
        # a prefix of another option is not that option: `eval --run DIR` said "argument --runs: invalid int value"
        ["eval", "embedded", "--checkpoint", "c", "--tasks", "t", "--run"],
        ["grade", "--tasks", "t", "--predictions", "p", "--work"],  # not --workers
    ],
)
def test_unknown_arguments_are_still_refused(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"swe-megatron {argv[0]}: error: unrecognized arguments: {argv[-1]}" in err


def test_version_and_python_m():
    for cmd in (["-m", "swe_megatron", "--version"], ["-m", "swe_megatron.cli", "--version"]):
        res = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and res.stdout.strip() == f"swe-megatron {__version__}", res


def test_parsing_a_command_line_does_not_import_torch():
    """`--help`, `--version` and every command's usage errors answer in under a second, not after torch's ~4 s
    import (a test suite that runs the CLI a few hundred times pays it each time)."""
    heavy = "('torch', 'vllm', 'megatron', 'transformers')"
    code = (
        "import sys; from swe_megatron.cli import build_parser; build_parser(); "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy}))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", (res.stdout[:500], res.stderr[-2000:])


LINES = """
import sys, time
from swe_megatron import cli

def register(sub):
    sub.add_parser("tick").set_defaults(func=tick)

def tick(args):
    print("unit 1 committed")
    open(sys.argv[0] + ".printed", "w").close()  # the parent reads the pipe only now
    time.sleep(60)
    return 0

cli.COMMANDS.append("__main__")
sys.argv = [__file__, "tick"]
cli.run()
"""


def test_output_is_line_buffered_into_a_pipe(tmp_path):
    """Under Slurm stdout is a file: a line must show when printed, not when a block buffer fills."""
    script = tmp_path / "tick.py"
    script.write_text(LINES)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a plain job environment
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:  # block-buffered, the line would only come at exit
        deadline = time.monotonic() + 240  # the interpreter's start, on a loaded machine
        while not Path(f"{script}.printed").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert select.select([proc.stdout], [], [], 5)[0], (
            "the line is not in the pipe: stdout is not line-buffered"
        )
        assert proc.stdout.readline() == "unit 1 committed\n"
    finally:
        proc.kill()
        proc.wait()


def test_machine_speed_prints_one_line_of_per_core_figures():
    """tools/machine_speed.py, which .ci/run prints so that CI times from different machines compare."""
    import re

    tool = Path(__file__).resolve().parents[1] / "tools" / "machine_speed.py"
    res = subprocess.run([sys.executable, str(tool)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.fullmatch(
        r"machine: .+, \d+ cores; one core: 1024\^2 fp32 matmul [\d.]+ ms, Python loop 10\^6 adds \d+ ms "
        r"\(medians of 5\)\n",
        res.stdout,
    ), res.stdout
