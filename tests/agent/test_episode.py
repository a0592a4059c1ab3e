"""The episode loop over the fake directory sandbox, with the scripted policy and a tiny random model."""

import re
import subprocess

import pytest
from fake_sandbox import DirSandbox

from swe_megatron.agent.episode import Episode, EpisodeLimits, Scaffold
from swe_megatron.agent.prompts import load_prompts
from swe_megatron.config.schema import AgentConfig, ModelConfig
from swe_megatron.engine.base import EngineError
from swe_megatron.engine.scripted import ScriptedPolicy, gold_patch_script
from swe_megatron.sandbox.base import SandboxError, SandboxServerLost
from swe_megatron.tasks.schema import Task
from swe_megatron.trajectory import ExitReason

CFG = AgentConfig(window=20)
PROMPTS = load_prompts(CFG.prompts)


@pytest.fixture
def task(tmp_path):
    """A repo whose add() subtracts and whose gold patch (two hunks + a new file) fixes it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    body = [
        "def add(a, b):",
        "    return a - b",
        *[f"# filler {i}" for i in range(30)],
        "def sub(a, b):",
        "    return a + b",
    ]
    (repo / "calc.py").write_text("\n".join(body) + "\n")
    git = "git -c user.email=t@t -c user.name=t"
    subprocess.run(f"git init -q && git add -A && {git} commit -qm init", shell=True, cwd=repo, check=True)
    fixed = body.copy()
    fixed[1], fixed[-1] = "    return a + b", "    return a - b"
    (repo / "calc.py").write_text("\n".join(fixed) + "\n")
    (repo / "notes.txt").write_text("fixed\n")
    gold = subprocess.run(
        "git add -A && git diff --cached", shell=True, cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    subprocess.run("git reset -q --hard", shell=True, cwd=repo, check=True)
    return Task(
        "demo__calc-1",
        "demo/calc",
        "HEAD",
        gold,
        "",
        "add() subtracts.",
        [],
        [],
        extra={"repo_dir": str(repo)},
    )


_HUNK = re.compile(r"^(@@ [^@]* @@).*")


def diff_lines(patch: str) -> list[str]:
    """A patch's lines as the host-side diff writes them (agent/commands.py takes the patch on the host): no
    index lines, nothing after a hunk header's closing "@@" (git's function context, which apply ignores)."""
    return [_HUNK.sub(r"\1", ln) for ln in patch.splitlines() if not ln.startswith("index ")]


def limits(**kw):
    base = dict(t_max=10, context_length=8192, max_tokens_per_turn=256, command_timeout_s=10, output_cap=4000)
    return EpisodeLimits(**{**base, **kw})


def episode(task, engine, chat, sb=None, **kw):
    sb = sb or DirSandbox(task.extra["repo_dir"])
    scaffold = Scaffold(engine, chat, PROMPTS, CFG, limits(**kw))
    return Episode(scaffold, task, 0, sb, sb.workdir, f"{task.instance_id}/0/0").run()


def test_scripted_gold_patch_reproduces_the_gold_diff(task, chat):
    script = gold_patch_script(task.patch)
    # Bottom-up, one edit per changed line (no context lines rewritten).
    assert (
        script[0].endswith("```\nopen calc.py\n```")
        and "edit 34:34\n    return a - b\nend_of_edit" in script[1]
    )
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: script}), chat)
    assert traj.exit_reason == ExitReason.submitted and traj.infra_failure is None
    assert traj.num_steps == len(script) and traj.malformed_turns == []
    assert (
        "+    return a + b" in traj.patch and "+    return a - b" in traj.patch and "notes.txt" in traj.patch
    )
    assert diff_lines(traj.patch) == diff_lines(task.patch)
    assert not traj.drifted
    traj.check()
    assert traj.messages[3]["content"].endswith(
        f"current file: {traj.messages[3]['content'].split()[1]}) bash-$"
    )


def test_format_errors_are_marked_and_answered(task, chat):
    turns = ["no command", "```\nls\n```\nand\n```\npwd\n```", "```\nsubmit\n```"]
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: turns}), chat)
    assert traj.exit_reason == ExitReason.submitted and traj.malformed_turns == [0, 1]
    assert "it contained 0" in traj.messages[3]["content"] and "it contained 2" in traj.messages[5]["content"]
    assert traj.patch == ""


def test_turn_and_context_limits_are_model_outcomes_with_a_patch(task, chat):
    turns = ["```\nopen calc.py\n```", "```\nedit 2:2\n    return a + b\nend_of_edit\n```"] + [
        "```\nls\n```"
    ] * 10
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: turns}), chat, t_max=3)
    assert (
        traj.exit_reason == ExitReason.turn_limit
        and traj.num_steps == 3
        and "+    return a + b" in traj.patch
    )
    assert not traj.excluded
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: turns}), chat, context_length=900)
    assert traj.exit_reason == ExitReason.context_limit and len(traj.token_ids) < 900 and not traj.excluded
    traj.check()


def test_no_observation_follows_the_last_allowed_turn(task, chat):
    """The trained sequence ends with the t_max-th assistant turn: an observation after it would be context the
    model never acts on (and tokens the turn limit should have stopped)."""
    turns = ["```\nls\n```"] * 10
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: turns}), chat, t_max=3)
    assert traj.exit_reason == ExitReason.turn_limit and traj.num_steps == 3
    assert [m["role"] for m in traj.messages] == ["system", "user"] + ["assistant", "user"] * 2 + [
        "assistant"
    ]
    assert traj.turn_spans[-1][1] == len(traj.token_ids) and traj.action_mask[-1] == 1


def test_engine_and_sandbox_failures_are_infrastructure(task, chat):
    class Broken(ScriptedPolicy):
        def generate(self, prompt_ids, max_tokens, session=""):
            raise EngineError("connection refused")

    traj = episode(task, Broken(chat, {}), chat)
    assert (
        traj.exit_reason == ExitReason.engine_error
        and traj.excluded
        and "connection refused" in traj.infra_failure
    )


def _failing_on(task, command: str, error: Exception | None = None, *, for_good: bool = False) -> DirSandbox:
    """The fake sandbox, failing (SandboxError, or `error`) when `command` is sent to it (for_good: and
    every command after it, as a sandbox whose shell will not restart)."""
    sb = DirSandbox(task.extra["repo_dir"])
    orig = sb.exec
    broken = []

    def flaky(cmd, timeout_s=None):
        if cmd == command or broken:
            broken.extend([True] * for_good)
            raise error or SandboxError("bwrap died")
        return orig(cmd, timeout_s)

    sb.exec = flaky
    return sb


def test_a_sandbox_failure_is_excluded_only_before_the_agents_first_command(task, chat):
    """grading/exclusion.py: before any agent command ran, a sandbox failure is infrastructure; after, the
    agent may have caused it (a dead shell, a locked repository), so it is scored with what patch there is."""
    script = ["```\necho fixed > notes.txt\n```", "```\nls\n```"]
    sb = DirSandbox(task.extra["repo_dir"])
    sb.fail_next = True  # fails the harness's own first command (the shell setup)
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: script}), chat, sb=sb)
    assert traj.exit_reason == ExitReason.sandbox_error and traj.excluded and "bwrap died" not in traj.patch
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: script}), chat, sb=_failing_on(task, "ls"))
    assert traj.exit_reason == ExitReason.sandbox_lost and not traj.excluded and traj.infra_failure is None
    assert "+fixed" in traj.patch and traj.num_steps == 2
    # the sandbox never runs a command again (not even the diff): the patch is taken on the host (item 5)
    traj = episode(
        task,
        ScriptedPolicy(chat, {task.instance_id: script}),
        chat,
        sb=_failing_on(task, "ls", for_good=True),
    )
    assert traj.exit_reason == ExitReason.sandbox_lost and not traj.excluded and "+fixed" in traj.patch
    # any other harness failure after the agent's commands (attack 6 was a PermissionError) is scored too
    sb = _failing_on(task, "ls", PermissionError(13, "file has other hard links"))
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: script}), chat, sb=sb)
    assert traj.exit_reason == ExitReason.harness_broken and not traj.excluded and "+fixed" in traj.patch
    # the sandbox server itself stopped answering (rule 3: outside every sandbox): excluded at any time
    sb = _failing_on(task, "ls", SandboxServerLost("sandbox server http://b stopped answering"))
    traj = episode(task, ScriptedPolicy(chat, {task.instance_id: script}), chat, sb=sb)
    assert traj.exit_reason == ExitReason.sandbox_error and traj.excluded


class _SlowPolicy(ScriptedPolicy):
    """The scripted policy, each generation taking `seconds` (a slow engine)."""

    seconds = 0.0

    def generate(self, prompt_ids, max_tokens, session=""):
        __import__("time").sleep(self.seconds)
        return super().generate(prompt_ids, max_tokens, session)


@pytest.mark.parametrize(
    ("command_s", "generate_s", "reason"),
    [(0.6, 0.0, ExitReason.time_limit), (0.0, 0.6, ExitReason.harness_timeout)],
)
def test_a_deadline_is_scored_when_the_agents_own_commands_took_the_time(
    task, chat, command_s, generate_s, reason
):
    """Issue 24 attack 7: an agent whose own commands run long reaches the deadline -> scored (time_limit);
    a slow engine -> excluded (harness_timeout)."""
    policy = _SlowPolicy(chat, {task.instance_id: [f"```\nsleep {command_s}\n```"] * 8})
    policy.seconds = generate_s
    sb = DirSandbox(task.extra["repo_dir"])
    scaffold = Scaffold(policy, chat, PROMPTS, CFG, limits())
    deadline = __import__("time").monotonic() + 2.0
    traj = Episode(scaffold, task, 0, sb, sb.workdir, f"{task.instance_id}/0/0", deadline).run()
    assert traj.exit_reason == reason, (traj.exit_reason, traj.infra_failure, traj.timings)
    assert traj.excluded == (reason == ExitReason.harness_timeout)


def test_tiny_random_model_episode_keeps_provenance(task, chat):
    from swe_megatron.engine.hf import TransformersEngine
    from swe_megatron.model.tiny import tiny_qwen2

    model = tiny_qwen2(ModelConfig(tie_word_embeddings=True, num_layers=1), seed=0)
    engine = TransformersEngine(model, chat.eos_id, seed=1)
    traj = episode(task, engine, chat, t_max=3, max_tokens_per_turn=12)
    assert traj.exit_reason == ExitReason.turn_limit and traj.malformed_turns == [0, 1, 2]
    assert not traj.drifted
    traj.check()
    acts = [lp for lp, m in zip(traj.logprobs, traj.action_mask) if m]
    assert len(acts) >= 3 and all(lp < 0 for lp in acts)


def _git_task(tmp_path, files: dict[str, str], fixed: dict[str, str]) -> Task:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, text in files.items():
        (repo / name).write_text(text)
    git = "git -c user.email=t@t -c user.name=t"
    subprocess.run(f"git init -q && git add -A && {git} commit -qm init", shell=True, cwd=repo, check=True)
    for name, text in fixed.items():
        (repo / name).write_text(text)
    gold = subprocess.run(
        "git add -A && git diff --cached", shell=True, cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    subprocess.run("git reset -q --hard", shell=True, cwd=repo, check=True)
    return Task("demo__big-1", "demo/big", "HEAD", gold, "", "x", [], [], extra={"repo_dir": str(repo)})


def test_gold_script_splits_edits_to_fit_the_turn_cap_and_still_reproduces_the_gold_diff(tmp_path, chat):
    """A 12-line replacement, a 3-line deletion and a new 15-line file under a 48-token turn cap: the script
    splits them into edits that each fit (an engine would cut a longer turn), and the episode at that cap ends
    with exactly the gold diff."""
    from swe_megatron.engine.scripted import turn_fits

    old = [f"x{i} = {i}" for i in range(40)]
    new = old[:5] + [f"y{i} = compute({i}, scale=2)" for i in range(12)] + old[6:20] + old[23:]
    task = _git_task(tmp_path, {"m.py": "\n".join(old) + "\n"},
                     {"m.py": "\n".join(new) + "\n", "n.py": "".join(f"z{i} = {i} * 3\n" for i in range(15))})  # fmt: skip
    cap = 48
    script = gold_patch_script(task.patch, turn_fits(chat, cap))
    policy = ScriptedPolicy(chat, {task.instance_id: script})
    assert len(script) > 6 and policy.problems(cap, t_max=len(script)) == {}
    unsplit = gold_patch_script(task.patch)
    assert (
        ScriptedPolicy(chat, {"t": unsplit}).problems(cap, len(unsplit))["t"].startswith("turn 3 of 6 needs")
    )
    traj = episode(task, policy, chat, max_tokens_per_turn=cap, t_max=len(script))
    assert traj.exit_reason == ExitReason.submitted and traj.malformed_turns == []
    assert diff_lines(traj.patch) == diff_lines(task.patch)


def test_scripts_that_cannot_play_out_are_named(chat):
    """A line longer than the cap cannot be split: `problems` names the turn and the cap; a script longer than
    t_max names both counts."""
    long = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a = 1\n+a = " + " + ".join(["1"] * 80) + "\n"
    policy = ScriptedPolicy(chat, {"t": gold_patch_script(long, lambda turn: False)})
    assert (
        "turn 2 of 3 needs" in policy.problems(64, 10)["t"]
        and "max_tokens_per_turn=64" in policy.problems(64, 10)["t"]
    )
    assert policy.problems(4096, 2) == {"t": "the script needs 3 turns, more than the stage's t_max=2"}


def test_warm_start_decoys_give_up_and_are_kept_for_sft(task, chat):
    """Sample 0 plays the solution, samples >= 1 the give-up script (open, submit); sft_data keeps the resolved
    solution and every non-excluded give-up demonstration."""
    from swe_megatron.pipeline.warm_start import give_up_script, scripts, sft_data

    policy = ScriptedPolicy(chat, scripts([task], decoys=2))

    def run(k):
        sb = DirSandbox(task.extra["repo_dir"])
        scaffold = Scaffold(policy, chat, PROMPTS, CFG, limits())
        return Episode(scaffold, task, k, sb, sb.workdir, f"{task.instance_id}/{k}/0").run()

    solved = run(0)
    gave_up = [run(1), run(2)]
    assert solved.patch and solved.num_steps == len(gold_patch_script(task.patch))
    assert all(t.patch == "" and t.num_steps == 2 for t in gave_up)
    assert gave_up[0].messages[2]["content"] == solved.messages[2]["content"]  # same first turn
    assert give_up_script(task)[-1].endswith("```\nsubmit\n```")
    solved.reward, solved.resolved = 1.0, True
    gave_up[1].infra_failure = "grading: timeout"  # infrastructure failures never become SFT data
    data, masks, metrics = sft_data([solved, *gave_up], max_per_task=1)
    assert data == [solved, gave_up[0]] and len(masks) == 2 and sum(masks[1]) > 0
    assert metrics == {"scripted_resolved": 1.0, "decoys": 1.0, "decoys_resolved": 0.0}
