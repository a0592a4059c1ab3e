"""`swe-megatron rollout CONFIG --tasks FILE --out DIR` and `swe-megatron show-trajectory FILE`.

rollout runs the stage's episodes (tasks x G) standalone and writes trajectories.jsonl + summary.json in DIR
(a start that fails before any trajectory leaves DIR as it found it, so the same command can be rerun).
The engine is, in order: `--policy gold` (the scripted test fake that applies each task's gold patch);
`--engine-url` servers already running; the engines of `--rendezvous FILE` (default cfg.cluster.rendezvous,
the rendezvous.json of a Slurm job, see launch/rendezvous.py); cfg.engine.backend=transformers (in-process,
tiny models only); otherwise cfg.engine.num_servers local vLLM servers started on cfg.model.hf_path (a tiny
random checkpoint is written into DIR when hf_path is null) and stopped at the end. Sandboxes run on the
rendezvous' sandbox servers when it lists any, else on the local backend. Episodes are spread over the
servers and a dead server is taken out of rotation (rollout/routing.py). Grading logs go to DIR/grade.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path

from swe_megatron.agent.tokens import ChatFormat
from swe_megatron.atomic_write import write_json_atomic
from swe_megatron.config.load import load_config
from swe_megatron.config.schema import EngineBackend
from swe_megatron.engine.scripted import ScriptedPolicy, turn_fits
from swe_megatron.errors import UsageError, output_folder
from swe_megatron.launch import rendezvous
from swe_megatron.model.tokenizer import load_tokenizer
from swe_megatron.monitor.console import library_warnings_to
from swe_megatron.rollout.routing import policy_engine, run_sandboxes
from swe_megatron.tasks.load import load_tasks_for_command
from swe_megatron.trajectory import Trajectory


def _rollout(args: argparse.Namespace) -> int:
    for flag, value in (("--samples", args.samples), ("--concurrency", args.concurrency)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value} is invalid; allowed: an integer >= 1 (omit it for the default)")
    concurrency = [f"agent.concurrency={args.concurrency}"] if args.concurrency else []
    cfg = load_config(args.config, [*args.overrides, *concurrency])  # read-only from here on
    rv_file = args.rendezvous or cfg.cluster.rendezvous
    rv = rendezvous.load(rv_file) if rv_file else None
    tasks = load_tasks_for_command(args.tasks, args.max_tasks)
    out = output_folder(args.out)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    trajectories = out / "trajectories.jsonl"
    args.kept = lambda: (
        f"trajectories finished so far: {trajectories}; rerun into a new --out"
        if _written(trajectories)
        else f"no trajectory was written and {out} is left as it was; rerun the same command"
    )
    library_warnings_to(out / "library-warnings.log")
    try:
        stats = _run(cfg, args, rv, tasks, out)
    except BaseException:
        if not _written(trajectories):  # a failed start: nothing to keep, and a rerun must not be refused
            _clear(out, made)
        raise
    summary = stats.summary()
    write_json_atomic(out / "summary.json", summary, indent=2)
    samples = args.samples or getattr(cfg, args.stage).samples_per_task
    print(
        f"rollout: {summary['episodes']} episode(s) ({len(tasks)} task(s) x {samples}) in {summary['wall_s']:.0f} s: "
        f"resolved {summary['resolved']}, infrastructure failures {summary['infra_failures']}, "
        f"timeouts {summary['timeouts']}; trajectories: {trajectories} (read one: swe-megatron show-trajectory "
        f"{trajectories}), summary: {out / 'summary.json'}"
    )
    return 0


def _run(cfg, args: argparse.Namespace, rv, tasks, out: Path):
    """The episodes of the command: engine and sandboxes up, tasks x G rolled out into out, all stopped; the stats."""
    # lazy, after the checks: torch, transformers (rollout.setup); the CLI imports every command module at start
    from swe_megatron.rollout.setup import Rollouts

    stage = getattr(cfg, args.stage)
    with ExitStack() as stack:
        sandboxes = None
        if rv is not None and rv.sandbox_servers:
            sandboxes = run_sandboxes(cfg, rv.sandbox_servers, rv.token)
            stack.callback(sandboxes.close)
        chat = ChatFormat(load_tokenizer(cfg.model.tokenizer))
        engine = _engine(cfg, args, tasks, out, stack, chat, rv.engines if rv is not None else ())
        rollouts = Rollouts(cfg, engine, sandboxes, chat)
        limits = rollouts.limits(stage)
        _, stats = rollouts.run(tasks, args.samples or stage.samples_per_task, limits, out)
    return stats


def _written(trajectories: Path) -> bool:
    """Whether at least one trajectory reached the file (the rollout then ran; its output is kept)."""
    return trajectories.is_file() and trajectories.stat().st_size > 0


def _clear(out: Path, made: bool) -> None:
    """Undo a failed start in out, which was new (`made`: removed) or empty (emptied)."""
    if made:
        shutil.rmtree(out, ignore_errors=True)
        return
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _engine(cfg, args, tasks, out: Path, stack, chat, rendezvous_engines=()):
    if args.policy == "gold":
        return gold_policy(chat, tasks, cfg.sampling.max_tokens_per_turn, getattr(cfg, args.stage).t_max)
    if args.engine_url or rendezvous_engines:
        return policy_engine(cfg, args.engine_url or rendezvous_engines, chat.eos_id)
    # lazy: torch, transformers (engine.vllm_server, engine.hf)
    from swe_megatron.engine.vllm_server import engine_model_dir

    model_dir = str(engine_model_dir(cfg.model, out / "model", seed=cfg.seed))  # the trainer's config.json
    if cfg.engine.backend == EngineBackend.transformers:
        from swe_megatron.engine.hf import TransformersEngine

        return TransformersEngine.from_pretrained(model_dir, chat.eos_id, cfg.seed)
    from swe_megatron.engine.vllm_server import start_servers

    stage = getattr(cfg, args.stage)
    servers = start_servers(model_dir, cfg.engine, out / "engines", stage.context_length)
    for s in servers:
        stack.callback(s.stop)
    return policy_engine(cfg, [s.url for s in servers], chat.eos_id)


def gold_policy(chat: ChatFormat, tasks, max_tokens: int, t_max: int) -> ScriptedPolicy:
    """The scripted gold solutions of `tasks` (the warm start's scripts, edits split to fit max_tokens); one
    stderr line per task whose script cannot play out within the limits (it will not be resolved), saying why."""
    from swe_megatron.pipeline.warm_start import scripts

    policy = ScriptedPolicy(chat, scripts(tasks, 0, turn_fits(chat, max_tokens)))
    for task, why in sorted(policy.problems(max_tokens, t_max).items()):
        print(f"rollout --policy gold: {task} cannot be resolved by its script: {why}", file=sys.stderr)
    return policy


def render_trajectory(traj, color: bool = False) -> str:
    """A trajectory as readable text: header, then each message with its role, malformed turns marked."""
    bold, dim, red, reset = ("\033[1m", "\033[2m", "\033[31m", "\033[0m") if color else ("", "", "", "")
    head = (
        f"{bold}{traj.task_id} #{traj.sample_index}{reset}  exit={traj.exit_reason.value}  reward={traj.reward:g}  "
        f"resolved={traj.resolved}  steps={traj.num_steps}  tokens={len(traj.token_ids)} "
        f"(actions {sum(traj.action_mask)})  malformed={traj.malformed_turns}  drifted={traj.drifted}"
    )
    lines = [head]
    if traj.infra_failure:
        lines.append(f"{red}infrastructure failure: {traj.infra_failure}{reset}")
    if traj.timings:
        lines.append(dim + "timings: " + ", ".join(f"{k}={v:.2f}s" for k, v in traj.timings.items()) + reset)
    turn = 0
    for m in traj.messages:
        tag = m["role"]
        if tag == "assistant":
            version = f", weights v{traj.policy_versions[turn]}" if turn < len(traj.policy_versions) else ""
            tag += f" [turn {turn}{version}{', MALFORMED' if turn in traj.malformed_turns else ''}]"
            turn += 1
        lines += ["", f"{bold}── {tag} ──{reset}", m["content"]]
    if traj.patch:
        lines += ["", f"{bold}── patch ──{reset}", traj.patch]
    return "\n".join(lines)


def _show(args: argparse.Namespace) -> int:
    try:
        lines = [ln for ln in Path(args.file).read_text(encoding="utf-8").splitlines() if ln.strip()]
    except OSError as e:
        raise UsageError(f"cannot read {args.file}: {e}") from e
    if not -len(lines) <= args.index < len(lines):
        raise UsageError(f"{args.file} has {len(lines)} trajectories; --index {args.index} is out of range")
    try:
        traj = Trajectory.from_json(lines[args.index])
    except (ValueError, TypeError, KeyError) as e:
        raise UsageError(
            f"{args.file} line {args.index % len(lines) + 1} is not a trajectory ({e}); give a trajectories.jsonl "
            "(a rollout's or RUN_DIR/units/UNIT/), not a predictions or tasks file"
        ) from None
    print(render_trajectory(traj, color=sys.stdout.isatty()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the rollout and show-trajectory subcommands."""
    p = sub.add_parser("rollout", help="run tasks x G agent episodes and write trajectories as JSONL")
    p.add_argument("config", metavar="CONFIG", help="a preset under configs/ or a YAML path")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    p.add_argument("--tasks", required=True, help="JSONL task file")
    p.add_argument(
        "--out", required=True, help="output folder, new or empty (trajectories.jsonl, summary.json, grade/)"
    )
    p.add_argument(
        "--stage", default="stage1", choices=["rft", "stage1", "stage2"], help="stage whose limits apply"
    )
    p.add_argument("--samples", type=int, help="samples per task (default: the stage's G)")
    p.add_argument("--max-tasks", type=int, help="use only the first N tasks (default: all)")
    p.add_argument("--concurrency", type=int, help="episodes at once (default: agent.concurrency)")
    p.add_argument("--engine-url", nargs="+", default=None, help="running vLLM servers to use")
    p.add_argument(
        "--rendezvous",
        default="",
        metavar="FILE",
        help="a Slurm job's rendezvous.json: use its engines and sandbox servers (default: cluster.rendezvous)",
    )
    p.add_argument("--policy", choices=["model", "gold"], default="model", help="gold: scripted test fake")
    p.set_defaults(func=_rollout)
    s = sub.add_parser("show-trajectory", help="print one trajectory of a JSONL file readably")
    s.add_argument("file", metavar="FILE", help="trajectories.jsonl")
    s.add_argument("--index", type=int, default=0, help="which line (negative counts from the end)")
    s.set_defaults(func=_show)
