"""Sandbox latency figures (prints them; not a test). Run as root on a machine set up by tools/sandbox_setup.sh:

    .venv/bin/python tools/bench_sandbox.py [--commands 1000] [--fresh 200] [--starts 30] [--no-server]

Measures, on a small git repository:
  - a no-op command (`true`) through a sandbox's persistent shell (BwrapSandbox.exec), p50/p95;
  - the same no-op as a fresh sandbox per command: the identical setpriv + prlimit + bwrap launch running
    /bin/true (what a harness without a persistent shell pays), p50/p95, and the ratio of the two;
  - sandbox start (copy the repository, start bwrap and the shell) and stop (kill, remove), p50/p95;
  - the no-op through a local `swe-megatron sandbox-server` (HTTP + JSON), p50/p95, unless --no-server.
The figures go into docs/benchmarks.md ("Sandbox") by hand, with the command line that produced them.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swe_megatron.config.schema import SandboxConfig  # noqa: E402
from swe_megatron.sandbox import SandboxSpec, make_sandbox  # noqa: E402


def pct(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of samples, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def row(name: str, samples_s: list[float]) -> tuple[str, float, float]:
    p50, p95 = pct(samples_s, 0.5) * 1e3, pct(samples_s, 0.95) * 1e3
    print(f"| {name} | {len(samples_s)} | {p50:.3f} | {p95:.3f} |")
    return name, p50, p95


def make_repo(parent: Path) -> Path:
    repo = parent / "repo"
    (repo / "pkg").mkdir(parents=True)
    for i in range(50):
        (repo / "pkg" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    return repo


def bench_server(repo: Path, n: int) -> list[float]:
    from swe_megatron.sandbox.client import SandboxClient

    tmp = Path(tempfile.mkdtemp(prefix="bench-sandbox-server-"))
    token = tmp / "token"
    token.write_text("bench-token-0123456789abcdef")
    token.chmod(0o600)
    cmd = [
        sys.executable,
        "-m",
        "swe_megatron.cli",
        "sandbox-server",
        "--port",
        "0",
        "--token-file",
        str(token),
    ]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=root)
    try:
        url = proc.stdout.readline().split()[3]
        with (
            SandboxClient(url, token.read_text()) as client,
            client.sandbox(SandboxSpec(repo_dir=str(repo))) as sb,
        ):
            for _ in range(20):
                sb.exec("true")
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                sb.exec("true")
                samples.append(time.perf_counter() - t0)
            return samples
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commands", type=int, default=1000, help="no-op commands through the persistent shell")
    ap.add_argument("--fresh", type=int, default=200, help="fresh-sandbox no-op executions")
    ap.add_argument("--starts", type=int, default=30, help="sandbox start/stop cycles")
    ap.add_argument("--no-server", action="store_true", help="skip the sandbox-server measurement")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (the sandbox drops to the swe-sandbox user)", file=sys.stderr)
        return 2

    cfg = SandboxConfig()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    try:
        repo = make_repo(tmp)
        spec = SandboxSpec(repo_dir=str(repo))
        print(
            f"# {platform.node()}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, {platform.platform()}"
        )
        print("| measurement | n | p50 ms | p95 ms |\n|---|---|---|---|")

        sb = make_sandbox(spec, cfg)
        sb.start()
        for _ in range(50):  # warm up
            sb.exec("true")
        persistent = []
        for _ in range(args.commands):
            t0 = time.perf_counter()
            res = sb.exec("true")
            persistent.append(time.perf_counter() - t0)
            assert res.exit_code == 0
        launcher = sb._shell.launcher  # the exact isolation of this sandbox
        fresh = []
        for _ in range(args.fresh):
            t0 = time.perf_counter()
            subprocess.run([*launcher, "/bin/true"], check=True, env=sb._shell.popen_env)
            fresh.append(time.perf_counter() - t0)
        sb.stop()
        _, p_p50, p_p95 = row("no-op via the persistent shell", persistent)
        _, f_p50, f_p95 = row("no-op via a fresh bwrap sandbox", fresh)

        starts, stops = [], []
        for _ in range(args.starts):
            sb = make_sandbox(spec, cfg)
            t0 = time.perf_counter()
            sb.start()
            t1 = time.perf_counter()
            sb.stop()
            starts.append(t1 - t0)
            stops.append(time.perf_counter() - t1)
        row("sandbox start (copy 50-file repo, bwrap, shell)", starts)
        row("sandbox stop (kill, remove workspace)", stops)
        if not args.no_server:
            row("no-op via sandbox-server (HTTP, localhost)", bench_server(repo, args.commands // 2))
        print(f"\nfresh / persistent: p50 {f_p50 / p_p50:.0f}x, p95 {f_p95 / p_p95:.0f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
