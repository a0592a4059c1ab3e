"""Scale simulation of one rollout phase: the real controller at 64 .. 1024 episodes in flight (a benchmark, not
a test; tests/rollout/test_sim_scale.py runs a small one in CI). Figures: docs/benchmarks.md, "Scale".

What is real: the rollout entry point training uses (rollout.setup.Rollouts.run: the episode threads, sandbox
prewarm and teardown, routing over many servers with sticky sessions and failover, the ACI, token ledger and
provenance check, grading with the swebench parsers in a fresh sandbox), TensorBoard logging of the rollout as
pipeline/stages.py does it, and `--sandbox-servers` real `swe-megatron sandbox-server` processes (bwrap) running
the commands. What is not: the engines. `--engines` STAND-IN vLLM servers (tools/standin_vllm.py, each its own
process, the vLLM completions API over HTTP) answer with vocabulary token ids of the real tokenizer and a real
command per turn, with turn lengths and latencies drawn from TurnModel's distributions; the task is
tests/grading/tiny_task.py's (its repository, hidden tests and venv), G samples of it.

Measured per level (episodes in flight = agent.concurrency), from this (the controller's) process only:
- controller CPU seconds per turn (process CPU time / turns), and the share of the two cores it uses;
- peak RSS above the idle baseline, per episode in flight; peak threads and open sockets;
- added latency per turn, p50/p99: what a generate() call took at the controller minus the stand-in's own
  time for that turn (TurnModel.latency of its prompt length and tokens: exact), i.e. routing, the HTTP
  request, JSON encode/decode and the queueing of threads for the GIL; and per episode, its wall time less the
  stand-ins' time and the sandbox's raw command time, per turn (all of the controller's work in the episode);
- episodes/minute, turns, errors (infrastructure failures, drifted trajectories), mean and largest context;
- with --trainer-core, async mode's trainer in this process (TrainerBeside): its median step alone and while
  the rollouts run, the rollouts kept off its core. The rollouts run on this process's threads (what async
  training did before pipeline/rollout_process.py: the slowdown is what sharing the GIL costs), or with
  --rollout-process in the rollout process async training now starts (the phase's trajectories come back to
  this process as a unit's do), or with --trainer-separate the trainer runs in a process of its own (the
  control: what the machine costs any process beside the rollouts).

Usage (root, bwrap and the sandbox user as for the sandbox tests; from the repo root):
    OMP_NUM_THREADS=1 .venv/bin/python tools/sim_scale.py --levels 64 256 1024 --json out.json
    OMP_NUM_THREADS=1 .venv/bin/python tools/sim_scale.py --levels 64 --episodes-per-level 64 --stage stage2
    OMP_NUM_THREADS=1 .venv/bin/python tools/sim_scale.py --levels 1024 --trainer-core 0 --rollout-process
Each level runs `--episodes-per-level` episodes (default: 2 x the level) at that concurrency.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(ROOT / "tests"), str(ROOT / "tests" / "grading")]

from standin_vllm import TurnModel  # noqa: E402

from swe_megatron.monitor.tensorboard import Monitor  # noqa: E402  (torch: seconds of imports, before any level)


def start_standins(n: int, model: TurnModel, log_dir: Path) -> list[subprocess.Popen]:
    """n stand-in vLLM processes; each .url set once it listens."""
    procs = []
    for i in range(n):
        log = open(log_dir / f"standin-{i}.log", "w")  # noqa: SIM115 - the process writes it until killed
        p = subprocess.Popen(
            [sys.executable, str(ROOT / "tools" / "standin_vllm.py"), "--seed", str(i), "--model",
             json.dumps(asdict(model))],
            stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
        )  # fmt: skip
        procs.append(p)
    for p in procs:
        line = p.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"stand-in did not start: {line!r} (logs in {log_dir})")
        p.url = line.split()[-1]
    return procs


class Probe:
    """Samples this process's RSS, threads and open sockets every `every_s` (peaks kept)."""

    def __init__(self, every_s: float = 0.25):
        self.every_s = every_s
        self.peak = {"rss_mb": 0.0, "threads": 0, "sockets": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    @staticmethod
    def sample() -> dict:
        """RSS (MiB), threads and sockets of this process now."""
        status = Path("/proc/self/status").read_text()
        rss = int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1]) / 1024
        threads = int(next(x for x in status.splitlines() if x.startswith("Threads:")).split()[1])
        sockets = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        return {"rss_mb": rss, "threads": threads, "sockets": sockets}

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for k, v in self.sample().items():
                self.peak[k] = max(self.peak[k], v)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class TimedEngine:
    """The run's RoutedEngine, with each generate() call's time at the controller and the stand-in's own time
    for it (TurnModel.latency) recorded per session."""

    def __init__(self, inner, model: TurnModel):
        self.inner, self.model = inner, model
        self.rotation = inner.rotation  # check_servers reads it
        self.calls: list[
            tuple[str, float, float]
        ] = []  # (session, seconds at the controller, stand-in's own)
        self._lock = threading.Lock()

    def generate(self, prompt_ids, max_tokens, session=""):
        t = time.perf_counter()
        gen = self.inner.generate(prompt_ids, max_tokens, session)
        took = time.perf_counter() - t
        own = self.model.latency(len(prompt_ids), len(gen.token_ids))
        with self._lock:
            self.calls.append((session, took, own))
        return gen

    def end_session(self, session):
        self.inner.end_session(session)

    def reload_weights(self, path):
        self.inner.reload_weights(path)


def _children_cpu() -> float:
    """CPU seconds of this process's children that have exited and been waited for (the provenance workers:
    the stand-ins and sandbox servers live until the end)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class TrainerBeside:
    """Async mode's trainer beside the rollouts (algo.max_staleness >= 1: rank 0's rollouts run while it
    trains; on threads of its process, sharing its GIL, unless in the rollout process). This runs Megatron-Core
    train steps of the embedded model (SFT loss, random trajectories: tools/bench_train_step.py) back to back
    on a thread pinned to one core, while this process's other threads, the stand-ins and the sandbox servers
    run on the other cores: what the rollouts can take from the trainer is the GIL, not its core (as on a head
    node with cores to spare). figures() compares the steps before and after a phase with those inside it.

    separate=True is the control: the same steps in a process of their own (same core), which shares no GIL
    with the rollouts; what slows it is the machine (shared caches, memory bandwidth, the hypervisor), so the
    in-process slowdown less this one is what the GIL costs."""

    def __init__(self, core: int, trajectories: int = 4, length: int = 256, separate: bool = False):
        self.core, self.shape, self.separate = core, (trajectories, length), separate
        self.steps: list[tuple[float, float, float]] = []
        """(start, end, thread CPU seconds) of each step after the first (a warm-up)."""
        self._done = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trainer-beside", daemon=True)

    def start(self) -> TrainerBeside:
        self._thread.start()
        return self

    def _record(self, step: tuple[float, float, float]) -> None:
        with self._done:
            self.steps.append(step)
            self._done.notify_all()

    def _run(self) -> None:
        try:
            if not self.separate:
                train_steps(self.core, self.shape, self._record, self._stop)
                return
            cmd = [sys.executable, __file__, "--train-steps-on", str(self.core), *map(str, self.shape)]
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
                # "STEP start end cpu" lines (CLOCK_MONOTONIC: one clock for all processes)
                for line in proc.stdout:
                    if line.startswith("STEP "):
                        self._record(tuple(map(float, line.split()[1:])))
                    if self._stop.is_set():
                        proc.kill()
                if proc.wait() and not self._stop.is_set():
                    raise RuntimeError(f"the separate trainer process exited {proc.returncode}")
        except BaseException as e:  # reported by wait_steps, on the main thread
            self._error = e
            with self._done:
                self._done.notify_all()

    def wait_steps(self, n: int) -> None:
        """Block until n more steps are done."""
        with self._done:
            goal = len(self.steps) + n
            while len(self.steps) < goal and self._error is None:
                self._done.wait(5.0)
        if self._error is not None:
            raise RuntimeError(f"the trainer beside the rollouts failed: {self._error!r}") from self._error

    def cpu_s(self) -> float:
        """Thread CPU seconds of the steps so far."""
        with self._done:
            return sum(c for *_, c in self.steps)

    def figures(self, start: float, end: float) -> dict:
        """Median step seconds alone (steps wholly before `start` or after `end`) and during [start, end]."""
        with self._done:
            alone = [b - a for a, b, _ in self.steps if b <= start or a >= end]
            during = [b - a for a, b, _ in self.steps if a >= start and b <= end]
        out = {"steps_alone": len(alone), "steps_during": len(during)}
        if alone and during:
            a, d = statistics.median(alone), statistics.median(during)
            out.update(step_s_alone=round(a, 3), step_s_during=round(d, 3), slowdown=round(d / a - 1, 4))
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def train_steps(core: int, shape: tuple[int, int], record, stop: threading.Event | None = None) -> None:
    """Megatron-Core SFT steps of the embedded model on `core` (this thread only), back to back until `stop`;
    record((start, end, thread CPU seconds)) after each but the first (a warm-up)."""
    os.sched_setaffinity(0, {core})  # the calling thread (Linux: a thread's id)
    import torch
    from bench_train_step import megatron_trainer, sft_microbatches

    from swe_megatron.train.step import LossSpec

    torch.set_num_threads(1)
    cfg, _, _, trainer = megatron_trainer("tiny-qwen2", 1024, 1_000_000)
    mbs, _ = sft_microbatches(cfg.vocab_size, *shape, 1024)
    trainer.train_step(mbs, LossSpec("sft"))
    while stop is None or not stop.is_set():
        t0, c0 = time.monotonic(), time.thread_time()
        trainer.train_step(mbs, LossSpec("sft"))
        record((t0, time.monotonic(), time.thread_time() - c0))


class PhaseSpec:
    """--rollout-process: what the rollout process (pipeline/rollout_process.py, as async training starts it)
    needs to run the levels' phases; its worker returns each phase's figures and trajectories to this process,
    the trainer's, as the pipeline's returns a unit's."""

    def __init__(self, args, engine_urls: list[str], pool_urls: list[str], token: str, task):
        self.args = {k: v for k, v in vars(args).items() if k != "chat"}
        self.engine_urls, self.pool_urls, self.token, self.task = engine_urls, pool_urls, token, task

    def build(self) -> PhaseWorker:
        from swe_megatron.agent.tokens import ChatFormat
        from swe_megatron.model.tokenizer import load_tokenizer

        args = argparse.Namespace(**self.args, chat=ChatFormat(load_tokenizer("qwen2.5")))
        return PhaseWorker(args, self)


class PhaseWorker:
    """The rollout process's side of --rollout-process (the interface of rollout_process.Worker)."""

    rotations: list = []
    gate = None

    def __init__(self, args, spec: PhaseSpec):
        self.args, self.spec = args, spec

    def roll(self, level: int, episodes: int, out: Path) -> tuple[dict, list]:
        trajs: list = []
        standins = [argparse.Namespace(url=u) for u in self.spec.engine_urls]
        r = run_level(level, episodes, self.args, standins, self.spec.pool_urls, self.spec.token, self.spec.task,
                      out, keep=trajs)  # fmt: skip
        return r, trajs

    def close(self) -> None:
        pass


def run_level(concurrency: int, episodes: int, args, standins, pool_urls, token: str, task, out: Path,
              fault=None, beside: TrainerBeside | None = None, keep: list | None = None) -> dict:  # fmt: skip
    """One rollout phase of `episodes` at `concurrency` in flight; the figures (see the module docstring).
    fault: called args.kill_at seconds into the phase (kills one engine and one sandbox server).
    beside: the trainer running in this process (its steps' CPU is not counted as the controller's).
    keep: gets the phase's trajectories."""
    from swe_megatron.config.schema import RunConfig
    from swe_megatron.pipeline.metrics import rollout_metrics
    from swe_megatron.rollout.routing import RoutedEngine, SandboxPool
    from swe_megatron.rollout.setup import Rollouts

    cfg = RunConfig()
    cfg.agent.concurrency = concurrency
    cfg.agent.episode_timeout_s = 0.0
    cfg.agent.provenance_workers = args.provenance_workers
    cfg.monitor.progress = False
    cfg.sandbox.command_timeout_s = 60.0
    stage = getattr(cfg, args.stage)
    stage.t_max, stage.context_length = args.t_max, args.context
    stage.l_thr = min(stage.l_thr, args.t_max - 1)
    cfg.sampling.max_tokens_per_turn = 4096
    model = TurnModel(**json.loads(args.turn_model))
    sandboxes = SandboxPool.connect(pool_urls, token, command_timeout_s=cfg.sandbox.grade_timeout_s)
    inner = RoutedEngine.vllm([p.url for p in standins], "policy", cfg.sampling, [args.chat.eos_id], 600.0)
    engine = TimedEngine(inner, model)
    rollouts = Rollouts(cfg, engine, sandboxes, args.chat)
    monitor = Monitor(out / "tb", progress=False)
    base = Probe.sample()
    children0 = _children_cpu()
    cpu0, t0, mono0 = time.process_time(), time.perf_counter(), time.monotonic()
    in_process = beside is not None and not beside.separate  # its steps' CPU is this process's
    trainer_cpu0 = beside.cpu_s() if in_process else 0.0
    timer = threading.Timer(args.kill_at, fault) if fault is not None and args.kill_at > 0 else None
    if timer is not None:
        timer.start()
    try:
        with Probe() as probe:
            trajs, stats = rollouts.run([task], episodes, rollouts.limits(stage), out / "rollout")
            metrics = rollout_metrics(trajs, stage.t_max, stage.l_thr)
            for group, values in metrics.items():
                monitor.scalars(group, values, 0)
            monitor.histogram("episode/steps_hist", [t.num_steps for t in trajs], 0)
            monitor.histogram("episode/tokens_hist", [len(t.token_ids) for t in trajs], 0)
            monitor.flush()
    finally:
        if timer is not None:
            timer.cancel()
        monitor.close()
        sandboxes.close()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    if keep is not None:
        keep.extend(trajs)
    if beside is not None:  # the steps that ended in the phase; one running at its end is counted at its end
        cpu -= beside.cpu_s() - trainer_cpu0 if in_process else 0.0
        beside.wait_steps(args.trainer_steps)
        trainer = {"turns_per_s": round(stats.turns / wall, 2), **beside.figures(mono0, mono0 + wall)}
    if rollouts.provenance is not None:
        rollouts.provenance.close()  # its workers exit and are waited for: their CPU time counts below
    workers_cpu = _children_cpu() - children0
    added = [took - own for _, took, own in engine.calls]
    own_by_session: dict[str, float] = {}
    for session, _, own in engine.calls:
        key = session.rsplit("/", 1)[0]  # TASK/SAMPLE (the last attempt's calls count with it)
        own_by_session[key] = own_by_session.get(key, 0.0) + own
    per_turn_controller = []
    for t in trajs:
        own = own_by_session.get(f"{t.task_id}/{t.sample_index}", 0.0)
        if t.num_steps and "episode" in t.timings:
            per_turn_controller.append(
                (t.timings["episode"] - own - t.timings.get("exec_raw", 0.0)) / t.num_steps
            )
    turns = max(1, stats.turns)
    lengths = [len(t.token_ids) for t in trajs]
    return {
        "concurrency": concurrency,
        "episodes": stats.episodes,
        "turns": stats.turns,
        "generate_calls": len(engine.calls),
        "wall_s": round(wall, 2),
        "episodes_per_min": round(60 * stats.episodes / wall, 2),
        "turns_per_s": round(stats.turns / wall, 2),
        "controller_cpu_s": round(cpu, 2),
        "cpu_ms_per_turn": round(1000 * cpu / turns, 2),
        "cpu_cores_used": round(cpu / wall, 2),
        "provenance_workers": args.provenance_workers,
        "provenance_workers_cpu_s": round(workers_cpu, 2),
        "rss_base_mb": round(base["rss_mb"], 1),
        "rss_peak_mb": round(probe.peak["rss_mb"], 1),
        "mb_per_episode_in_flight": round((probe.peak["rss_mb"] - base["rss_mb"]) / concurrency, 2),
        "threads_peak": probe.peak["threads"],
        "sockets_peak": probe.peak["sockets"],
        "standin_turn_s_p50": round(_pct([own for *_, own in engine.calls], 0.5), 3),
        "added_ms_per_generate_p50": round(1000 * _pct(added, 0.5), 1),
        "added_ms_per_generate_p99": round(1000 * _pct(added, 0.99), 1),
        "controller_ms_per_turn_p50": round(1000 * _pct(per_turn_controller, 0.5), 1),
        "controller_ms_per_turn_p99": round(1000 * _pct(per_turn_controller, 0.99), 1),
        "context_mean": round(statistics.fmean(lengths)) if lengths else 0,
        "context_max": max(lengths, default=0),
        "resolved": stats.resolved,
        "distinct_samples": len({t.sample_index for t in trajs}),
        "retries": stats.retries,
        "faults": {
            "engines_out": len(inner.rotation.dead),
            "sandbox_servers_out": len(sandboxes.rotation.dead),
            "retried_attempts_s": round(stats.seconds.get("retried", 0.0), 1),
        },
        "infra_failures": stats.infra_failures,
        "drifted": stats.drifted,
        "exit_reasons": dict(stats.exit_reasons),
        "prewarm": stats.prewarm,
        "ms_per_turn_by_phase": {k: round(1000 * v / turns, 1) for k, v in sorted(stats.seconds.items())},
        "phase_monotonic": [mono0, mono0 + wall],
        **({"trainer_beside": trainer} if beside is not None else {}),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the levels and print (and with --json write) their figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--levels", type=int, nargs="+", default=[64, 256, 1024], help="episodes in flight")
    p.add_argument("--episodes-per-level", type=int, default=0, help="episodes per level (0: 2 x the level)")
    p.add_argument("--engines", type=int, default=16, help="stand-in vLLM server processes")
    p.add_argument("--sandbox-servers", type=int, default=3, help="real sandbox server processes")
    p.add_argument("--stage", default="stage1", choices=["stage1", "stage2"])
    p.add_argument("--t-max", type=int, default=40, help="turn limit (stage 1: 40, stage 2: 80)")
    p.add_argument(
        "--context", type=int, default=65536, help="context limit (stage 1: 65536, stage 2: 131072)"
    )
    p.add_argument("--turn-model", default="{}", help="TurnModel fields as JSON (tools/standin_vllm.py)")
    p.add_argument("--kill-at", type=float, default=0.0, help="seconds into each level: SIGKILL one stand-in "
                   "engine and one sandbox server (the first of each still alive); 0: no fault")  # fmt: skip
    p.add_argument("--provenance-workers", type=int, default=0,
                   help="agent.provenance_workers: processes for the provenance checks (0: episode threads)")  # fmt: skip
    p.add_argument("--trainer-core", type=int, default=-1,
                   help="async mode's trainer in this process (TrainerBeside): its thread pinned to this core, "
                        "everything else to the other cores; its step time alone and during each level "
                        "(-1: no trainer)")  # fmt: skip
    p.add_argument("--trainer-separate", action="store_true",
                   help="with --trainer-core: the control, the trainer in a process of its own (no shared GIL)")  # fmt: skip
    p.add_argument("--rollout-process", action="store_true",
                   help="with --trainer-core: each level's rollouts in the rollout process async training runs "
                        "them in (pipeline/rollout_process.py), the trainer in this process")  # fmt: skip
    p.add_argument("--switch-interval", type=float, default=0.0,
                   help="sys.setswitchinterval for this process, seconds (0: Python's default, 0.005): how long "
                        "a thread that holds the GIL keeps it while another waits")  # fmt: skip
    p.add_argument("--trainer-steps", type=int, default=6,
                   help="with --trainer-core: steps alone before and after each level")  # fmt: skip
    p.add_argument("--json", default="", help="write the figures here")
    p.add_argument(
        "--work",
        default="",
        help="folder for the task, logs, trajectories, TensorBoard (default: a new temp one)",
    )
    args = p.parse_args(argv)

    import sandbox_servers
    import tiny_task

    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.model.tokenizer import load_tokenizer

    why = sandbox_servers.missing()
    if why:
        sys.exit(f"sim_scale: {why}")
    apart = args.trainer_separate or args.rollout_process
    if args.switch_interval < 0 or (apart and args.trainer_core < 0):
        p.error(
            "--switch-interval must be >= 0, and --trainer-separate and --rollout-process need --trainer-core"
        )
    if args.rollout_process and (args.trainer_separate or args.kill_at > 0):
        p.error(
            "--rollout-process runs the trainer in this process: not with --trainer-separate or --kill-at"
        )
    if args.switch_interval > 0:
        sys.setswitchinterval(args.switch_interval)
    beside = None
    if args.trainer_core >= 0:
        cores = os.sched_getaffinity(0)
        if args.trainer_core not in cores or len(cores) < 2:
            sys.exit(f"sim_scale: --trainer-core {args.trainer_core} must be one of this process's cores "
                     f"{sorted(cores)}, and at least one other must be left for the rollouts")  # fmt: skip
        # inherited by every thread and process made next
        os.sched_setaffinity(0, cores - {args.trainer_core})
        beside = TrainerBeside(args.trainer_core, separate=args.trainer_separate).start()
    args.chat = ChatFormat(load_tokenizer("qwen2.5"))
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="sim-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "task").mkdir()
    task = tiny_task.build_task(work / "task", tiny_task.build_env())
    model = TurnModel(**json.loads(args.turn_model))
    standins = start_standins(args.engines, model, work)
    slots = max(4, math.ceil(2.2 * max(args.levels) / args.sandbox_servers))
    servers = [sandbox_servers.SandboxServer(work, slots) for _ in range(args.sandbox_servers)]
    results = []
    rollout_process = None
    try:
        if args.rollout_process:
            import sim_scale  # PhaseSpec by its module's name: the child has its own __main__

            from swe_megatron.pipeline.rollout_process import RolloutProcess

            spec = sim_scale.PhaseSpec(
                args, [sp.url for sp in standins], [s.url for s in servers], sandbox_servers.TOKEN, task
            )
            rollout_process = RolloutProcess(spec, pythonpath=sys.path[:4])
        for level in args.levels:
            episodes = args.episodes_per_level or 2 * level

            def fault() -> None:
                next(p for p in standins if p.poll() is None).kill()
                next(s for s in servers if s.proc.poll() is None).kill()
                print(
                    f"fault: killed one stand-in engine and one sandbox server at {args.kill_at:g} s",
                    flush=True,
                )

            if beside is not None:
                beside.wait_steps(args.trainer_steps)
            if rollout_process is not None:
                r, trajs = rollout_process.roll(level, episodes, work / f"level-{level}")
                del trajs  # received and unpickled here, in the trainer's process, as the pipeline's are
                beside.wait_steps(args.trainer_steps)
                r["trainer_beside"] = {
                    "turns_per_s": r["turns_per_s"],
                    **beside.figures(*r["phase_monotonic"]),
                }
            else:
                r = run_level(level, episodes, args, standins, [s.url for s in servers], sandbox_servers.TOKEN,
                              task, work / f"level-{level}", fault, beside)  # fmt: skip
            print(json.dumps(r), flush=True)
            results.append(r)
    finally:
        if rollout_process is not None:
            rollout_process.close()
        if beside is not None:
            beside.stop()
        for s in servers:
            s.close()
        for sp in standins:
            sp.kill()
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "chat"},
                                               "turn_model": asdict(model), "levels": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == [
        "--train-steps-on"
    ]:  # TrainerBeside(separate=True)'s child: CORE TRAJECTORIES LENGTH
        core, n, length = map(int, sys.argv[2:5])
        train_steps(core, (n, length), lambda step: print("STEP", *step, flush=True))
    else:
        main()
