"""Synchronous vs bounded-staleness async RL, side by side on this machine (issue 17, item 5).

For each seed, for each mode, one after the other (never two at once), it runs the README's main job without
its eval (eval is not what is measured):

    swe-megatron run embedded run_dir=RUN_ROOT/<mode>-s<seed> seed=<seed> schedule=[rft,stage1,stage2]
    (+ algo=async for the async mode: algo.max_staleness=1, configs/algo/async.yaml;
     + algo.max_staleness=1 alone for the k1 mode: the same staleness without the off-policy correction)

in a fresh run dir, with OMP_NUM_THREADS=1. With pinning (the default), the engine and the sandboxes run on
core 0 and the trainer on core 1: the job starts under `taskset -c 0` (the sandbox server and the vLLM server
it spawns inherit core 0), and as soon as a vLLM process exists among its descendants (the engine is the last
server the driver starts) every thread of the driver (the trainer and the rollout clients) moves to core 1
(`taskset -a -p -c 1`). From then on, every half second, any thread of the driver off core 1 and any thread of
another descendant off core 0 is moved back (a process the driver starts later inherits core 1); the cores of
every process are read once, ~30 s after the move, to show the pinning held.

After each run it reads every RL unit's RUN_DIR/units/<stage>-<it>/metrics.json and saves the runs to --out
(atomically, after every run; --resume skips the runs already there with exit status 0). Per run it prints
the resolved rate per RL iteration; the rise = mean resolved rate of the last two RL iterations minus that of
the first two, in points (issue 17 asks >= 15); and, over the "steady" iterations (every RL iteration but each
stage's first, which has no rollouts started ahead of it), the median cycle_s (wall seconds from the previous
unit's commit to this one's: the iteration period) and the median trainer and engine idle fractions. Then a
summary over seeds: per mode the rises and the median steady cycle, and the async/sync ratio of the median
steady cycle, per seed and over all seeds.

Reproduce (the machine otherwise idle; ~7 min per run):
    .venv/bin/python tools/bench_async.py --seeds 0 1 2 --modes sync async --out docs/bench_async.json
To try it (~2 min per run; the tiny policy solves nothing, so nothing is trained): append overrides,
    -- rft.warm_start_epochs=2 stage1.iterations=2 stage2.iterations=2 stage1.samples_per_task=2
       stage2.samples_per_task=2 tasks.max_train_tasks=2 sampling.max_tokens_per_turn=64 monitor.progress=false
       stage2.refresh_drop_never_solved=false
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swe_megatron.atomic_write import write_json_atomic  # noqa: E402

MODES = {"sync": [], "async": ["algo=async"], "k1": ["algo.max_staleness=1"]}
"""k1: one update of staleness with nothing else of the async preset (no off-policy correction)."""
STAGES = ("stage1", "stage2")
RESERVED = ("seed", "run_dir", "schedule", "algo", "algo.max_staleness")
"""Override keys the benchmark sets itself (per run or per mode)."""
ENGINE_CORE, TRAINER_CORE = 0, 1
SNAPSHOT_AFTER_S = 30.0
FIELDS = {
    "reward": ("resolved_rate",),
    "time": ("cycle_s", "rollout_s", "train_s", "weight_sync_s", "checkpoint_s", "trainer_wait_s",
             "trainer_idle_frac", "engine_idle_frac"),
    "async": ("staleness_mean", "staleness_max", "mixed_version_trajectories", "dropped_stale"),
}  # fmt: skip
"""The metrics.json values kept per RL unit, by group."""


# --- processes and their cores ----------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> dict[int, int]:
    """{pid: parent pid} of root's live descendants (from every /proc/PID/stat), parents first."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _read(f"/proc/{name}/stat")
            if stat:
                ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(name))
    out, todo = {}, [(c, root) for c in children.get(root, [])]
    while todo:
        pid, ppid = todo.pop(0)
        out[pid] = ppid
        todo += [(c, pid) for c in children.get(pid, [])]
    return out


def cmdline(pid: int) -> str:
    """The process's command line, space-separated ("" once it has exited)."""
    return _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _cpus_allowed(pid: int) -> str:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


def _role(cmd: str, parent_role: str) -> str:
    """What a descendant of the driver is, from its command line or its parent's role."""
    if "vllm" in cmd:
        return "engine (vllm)"
    if "sandbox-server" in cmd:
        return "sandbox server"
    return parent_role if parent_role in ("engine (vllm)", "sandbox server") else "other"


class Pinner(threading.Thread):
    """Engine and sandboxes on ENGINE_CORE, the driver's threads on TRAINER_CORE, while the job runs."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__(daemon=True)
        self.proc, self.t0 = proc, time.monotonic()
        self.moved_at: float | None = None
        """Seconds after the start at which the driver moved to TRAINER_CORE."""
        self.snapshot: list[dict] | None = None
        self.corrections: list[dict] = []
        """Threads found on the wrong core after the move (and moved back)."""
        self.denied: set[int] = set()
        """Threads whose affinity could not be set (another user's: the sandboxes' bwrap processes)."""
        self.error: str | None = None

    def run(self) -> None:
        while self.proc.poll() is None:
            try:
                self._tick()
            except Exception as e:  # keep pinning through a transient /proc race; record the last error
                self.error = f"{type(e).__name__}: {e}"
            time.sleep(0.2 if self.moved_at is None else 0.5)

    def _tick(self) -> None:
        driver = self.proc.pid
        others = descendants(driver)
        if self.moved_at is None:
            if any("vllm" in cmdline(p) for p in others):
                subprocess.run(["taskset", "-a", "-p", "-c", str(TRAINER_CORE), str(driver)],
                               check=True, capture_output=True)  # fmt: skip
                self.moved_at = time.monotonic() - self.t0
            return
        self._enforce(driver, TRAINER_CORE)
        for p in others:
            self._enforce(p, ENGINE_CORE)
        if self.snapshot is None and time.monotonic() - self.t0 >= self.moved_at + SNAPSHOT_AFTER_S:
            roles = {driver: "driver (trainer, rollout clients)"}
            for p, parent in others.items():
                roles[p] = _role(cmdline(p), roles.get(parent, ""))
            self.snapshot = [self._describe(p, role) for p, role in roles.items()]

    def _enforce(self, pid: int, core: int) -> None:
        for tid in _threads(pid):
            try:
                if os.sched_getaffinity(tid) != {core}:
                    os.sched_setaffinity(tid, {core})
                    self.corrections.append({"pid": pid, "tid": tid, "to": core, "cmd": cmdline(pid)[:100]})
            except ProcessLookupError:
                pass
            except PermissionError:
                self.denied.add(tid)

    def _describe(self, pid: int, role: str) -> dict:
        cores = set()
        for tid in _threads(pid):
            with contextlib.suppress(OSError):  # exited meanwhile
                cores.add(",".join(map(str, sorted(os.sched_getaffinity(tid)))))
        return {
            "pid": pid,
            "role": role,
            "cmd": cmdline(pid)[:120],
            "cpus_allowed_list": _cpus_allowed(pid),
            "thread_cpus": sorted(cores),
        }

    def report(self) -> dict:
        """What ended on which core, and whether every process was where it belongs."""
        snap = self.snapshot or []
        want = {p["pid"]: str(TRAINER_CORE if i == 0 else ENGINE_CORE) for i, p in enumerate(snap)}
        held = bool(snap) and all(p["thread_cpus"] in ([], [want[p["pid"]]]) for p in snap)
        return {
            "driver_moved_after_s": self.moved_at,
            "snapshot_after_move_s": SNAPSHOT_AFTER_S if self.snapshot else None,
            "held": held,
            "processes": snap,
            "corrections": self.corrections,
            "unpinnable_threads": len(self.denied),
            "error": self.error,
        }


# --- one run ----------------------------------------------------------------------------------------------
def job_command(run_dir: Path, seed: int, mode: str, overrides: list[str]) -> list[str]:
    """The README's main job without eval, in run_dir, for one seed and mode."""
    return [str(ROOT / ".venv/bin/swe-megatron"), "run", "embedded", f"run_dir={run_dir}", f"seed={seed}",
            "schedule=[rft,stage1,stage2]", *MODES[mode], *overrides]  # fmt: skip


def _env() -> dict[str, str]:
    return os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def rl_units(run_dir: Path) -> list[dict]:
    """The FIELDS of every committed RL unit's metrics.json, in schedule order, with `steady` marked."""
    units = []
    for stage in STAGES:
        dirs = sorted((run_dir / "units").glob(f"{stage}-*"), key=lambda d: int(d.name.rsplit("-", 1)[1]))
        for d in dirs:
            if not (d / "metrics.json").exists():
                continue  # not committed (the job failed in it)
            metrics = json.loads((d / "metrics.json").read_text())
            row = {"unit": d.name, "steady": not d.name.endswith("-0")}
            for group, keys in FIELDS.items():
                for k in keys:
                    if k not in metrics.get(group, {}):
                        raise KeyError(f"{d}/metrics.json has no {group}.{k}: update FIELDS in {__file__}")
                    row[k] = metrics[group][k]
            units.append(row)
    return units


def run_one(run_root: Path, seed: int, mode: str, overrides: list[str], pin: bool) -> dict:
    """One job, start to end: its command, exit status, wall time, RL units and pinning report."""
    name = f"{mode}-s{seed}"
    run_dir, log = run_root / name, run_root / f"{name}.log"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = job_command(run_dir, seed, mode, overrides)
    full = ["taskset", "-c", str(ENGINE_CORE), *cmd] if pin else cmd
    print(f"\n=== {name}: {' '.join(full)}\n    log: {log}", flush=True)
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(full, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT)
    pinner = Pinner(proc) if pin else None
    try:
        if pinner:
            pinner.start()
        rc = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the driver stops its servers on SIGTERM
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    wall = time.monotonic() - t0
    if pinner:
        pinner.join(5)
    if rc:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        print(f"{name}: exit status {rc}; last lines of {log}:\n" + "\n".join(tail), flush=True)
    return {
        "mode": mode,
        "seed": seed,
        "command": full,
        "exit_status": rc,
        "wall_s": wall,
        "log": str(log),
        "units": rl_units(run_dir),
        "pinning": pinner.report() if pinner else None,
    }


# --- figures ----------------------------------------------------------------------------------------------
def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def figures(run: dict) -> dict:
    """The run's rise (points) and its steady iterations' median cycle and idle fractions."""
    rates = [u["resolved_rate"] for u in run["units"]]
    steady = [u for u in run["units"] if u["steady"]]
    rise = 100 * (sum(rates[-2:]) / 2 - sum(rates[:2]) / 2) if len(rates) >= 2 else None
    return {
        "resolved_rates": rates,
        "rise_points": rise,
        "steady_iterations": len(steady),
        **{f"median_{k}": _median([u[k] for u in steady]) for k in ("cycle_s", "trainer_idle_frac",
                                                                      "engine_idle_frac")},
    }  # fmt: skip


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_run(name: str, run: dict) -> None:
    """The run's RL iterations, its rise and steady medians, and where its processes ran."""
    print(f"\n--- {name}: exit status {run['exit_status']}, wall {run['wall_s']:.0f} s")
    print(f"{'unit':10} {'resolved':>8} {'cycle_s':>8} {'rollout_s':>9} {'train_s':>8} {'tr_idle':>7} "
          f"{'eng_idle':>8} {'stale':>9} {'mixed':>5} {'dropped':>7}")  # fmt: skip
    for u in run["units"]:
        print(f"{u['unit'] + ('' if u['steady'] else '*'):10} {u['resolved_rate']:8.3f} {u['cycle_s']:8.1f} "
              f"{u['rollout_s']:9.1f} {u['train_s']:8.1f} {u['trainer_idle_frac']:7.2f} "
              f"{u['engine_idle_frac']:8.2f} {u['staleness_mean']:5.2f}/{u['staleness_max']:<3.0f} "
              f"{u['mixed_version_trajectories']:5.0f} {u['dropped_stale']:7.0f}")  # fmt: skip
    f = figures(run)
    print(f"rise (last two RL iterations - first two): {_fmt(f['rise_points'])} points (issue 17 asks >= 15)")
    print(f"steady iterations (* = a stage's first, excluded: no rollouts ahead of it): {f['steady_iterations']}; "
          f"median cycle {_fmt(f['median_cycle_s'])} s, trainer idle {_fmt(f['median_trainer_idle_frac'], '.2f')}"
          f", engine idle {_fmt(f['median_engine_idle_frac'], '.2f')}")  # fmt: skip
    pin = run["pinning"]
    if pin is None:
        print("pinning: off")
        return
    print(
        f"pinning: driver moved to core {TRAINER_CORE} {_fmt(pin['driver_moved_after_s'])} s after the start; "
        f"held: {'yes' if pin['held'] else 'NO'}; threads moved back later: {len(pin['corrections'])}; "
        f"unpinnable threads: {pin['unpinnable_threads']}"
        + (f"; error: {pin['error']}" if pin["error"] else "")
    )
    for p in pin["processes"]:
        print(f"  pid {p['pid']:>7} cpus {p['cpus_allowed_list']:>4} threads {'|'.join(p['thread_cpus']):>4} "
              f"{p['role']:34} {p['cmd'][:70]}")  # fmt: skip


def summary(runs: dict[str, dict]) -> dict:
    """Per mode: rises and median steady cycle per seed; the async/sync cycle ratio per seed and overall."""
    out: dict = {"modes": {}, "cycle_ratio_async_over_sync": {}}
    steady: dict[str, list[float]] = {}
    for run in runs.values():
        f, mode = figures(run), run["mode"]
        m = out["modes"].setdefault(
            mode, {"seeds": [], "exit_status": [], "rise_points": [], "median_steady_cycle_s": []}
        )
        m["seeds"].append(run["seed"])
        m["exit_status"].append(run["exit_status"])
        m["rise_points"].append(f["rise_points"])
        m["median_steady_cycle_s"].append(f["median_cycle_s"])
        steady.setdefault(mode, []).extend(u["cycle_s"] for u in run["units"] if u["steady"])
    for seed in sorted({r["seed"] for r in runs.values()}):
        s, a = (runs.get(f"{m}-s{seed}") for m in ("sync", "async"))
        if s and a:
            cs, ca = figures(s)["median_cycle_s"], figures(a)["median_cycle_s"]
            out["cycle_ratio_async_over_sync"][str(seed)] = ca / cs if cs and ca is not None else None
    for mode, xs in steady.items():
        out["modes"][mode]["median_steady_cycle_s_all_seeds"] = _median(xs)
    s, a = (out["modes"].get(m, {}).get("median_steady_cycle_s_all_seeds") for m in ("sync", "async"))
    out["cycle_ratio_async_over_sync"]["all"] = a / s if s and a is not None else None
    return out


def print_summary(summ: dict) -> None:
    """The table over seeds."""
    print("\n=== summary (steady = RL iterations but each stage's first; cycle = iteration period)")
    print(f"{'mode':6} {'seeds':>10} {'exit status':>12} {'rise (points)':>20} {'median steady cycle_s per seed':>31} "
          f"{'all':>6}")  # fmt: skip
    for mode, m in summ["modes"].items():
        rises = " ".join(_fmt(x, ".0f") for x in m["rise_points"])
        cycles = " ".join(_fmt(x) for x in m["median_steady_cycle_s"])
        codes = " ".join(map(str, m["exit_status"]))
        print(f"{mode:6} {' '.join(map(str, m['seeds'])):>10} {codes:>12} {rises:>20} {cycles:>31} "
              f"{_fmt(m['median_steady_cycle_s_all_seeds']):>6}")  # fmt: skip
    ratio = summ["cycle_ratio_async_over_sync"]
    per_seed = ", ".join(f"seed {k}: {_fmt(v, '.2f')}" for k, v in ratio.items() if k != "all")
    print(f"async/sync median steady cycle: {per_seed or '-'}; all seeds: {_fmt(ratio.get('all'), '.2f')}")


# --- main -------------------------------------------------------------------------------------------------
def _check_overrides(parser: argparse.ArgumentParser, overrides: list[str], modes: list[str]) -> None:
    for o in overrides:
        key = o.split("=", 1)[0]
        if "=" not in o or key in RESERVED:
            parser.error(
                f"override {o!r}: expected key=value with key not in {RESERVED} (the benchmark sets those)"
            )
    for mode in modes:  # a typo fails now, not after the first runs
        cmd = [str(ROOT / ".venv/bin/swe-megatron"), "show-config", "embedded", *MODES[mode], *overrides]
        r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
        if r.returncode:
            parser.error(f"the overrides do not resolve for mode {mode}: {r.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every run exited 0."""
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--out", type=Path, required=True, help="the JSON of all runs (rewritten after each run)")
    p.add_argument("--run-root", type=Path, default=Path("/tmp/bench_async"))
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help=f"engine and sandboxes on core {ENGINE_CORE}, trainer on core {TRAINER_CORE}")  # fmt: skip
    p.add_argument("--resume", action="store_true", help="skip the runs already in --out with exit status 0")
    args = p.parse_args(own)
    if args.pin and not {ENGINE_CORE, TRAINER_CORE} <= os.sched_getaffinity(0):
        p.error(f"--pin needs cores {ENGINE_CORE} and {TRAINER_CORE}; this process may use "
                f"{sorted(os.sched_getaffinity(0))} (use --no-pin)")  # fmt: skip
    if args.pin and shutil.which("taskset") is None:
        p.error("--pin needs taskset (util-linux); install it or use --no-pin")
    _check_overrides(p, overrides, args.modes)
    settings = {"overrides": overrides, "pin": args.pin, "cpus": os.cpu_count()}
    doc = {"settings": settings, "runs": {}}
    if args.resume and args.out.exists():
        doc = json.loads(args.out.read_text())
        if doc.get("settings") != settings:
            p.error(f"--resume: {args.out} was measured with {doc.get('settings')}, not {settings}")
    args.run_root.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for mode in args.modes:
            name = f"{mode}-s{seed}"
            if args.resume and doc["runs"].get(name, {}).get("exit_status") == 0:
                print(f"\n=== {name}: in {args.out} already (--resume)")
            else:
                doc["runs"][name] = run_one(args.run_root, seed, mode, overrides, args.pin)
            print_run(name, doc["runs"][name])
            doc["summary"] = summary(doc["runs"])
            write_json_atomic(args.out, doc, indent=1)
    print_summary(doc["summary"])
    print(f"\nsaved: {args.out}")
    return int(any(r["exit_status"] for r in doc["runs"].values()))


if __name__ == "__main__":
    sys.exit(main())
