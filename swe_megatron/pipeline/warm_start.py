"""Warm start (NOT the paper's method; labelled as such everywhere): scripted gold-patch solutions to imitate.

A tiny randomly initialised model never solves a task on its own, so RFT would keep nothing and DAPO would
see only all-zero groups. `rft.warm_start: scripted` first plays a TEST FAKE policy (engine/scripted.py)
through the real sandbox and grader: for each training task a short script built from its gold patch,
`open FILE` + `replace SEARCH REPLACE` (the shortest unique SEARCH around the changed characters) +
`submit`, or the general open/edit script when the patch is not a one-line change. The resolved
trajectories (real token ids of real observations) are the SFT data of the warm-start epochs. It trains
on gold solutions of the TRAINING tasks only; held-out test tasks are never scripted.

With `rft.warm_start_decoys: D` > 0 each task also gets D scripted give-up demonstrations (the script's first
turn, which opens the file the fix is in, then `submit` without a fix; graded 0 by the real grader). The SFT
data is then behaviour cloning of a policy that fixes the bug in 1 of 1 + D attempts: after the first
observation the warm-started model chooses between fixing and giving up at about those odds, and the RL
stages have one decision whose credit they must assign from the reward alone.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from unidiff import PatchSet

from swe_megatron.algo import rft_select
from swe_megatron.engine.scripted import SESSION_SEP, gold_patch_script
from swe_megatron.tasks.schema import Task
from swe_megatron.trajectory import Trajectory


def _block(command: str) -> str:
    return f"```\n{command}\n```"


def _one_line_change(patch: str) -> tuple[str, str, str] | None:
    """(path, old line, new line) when the patch changes exactly one line of one existing file."""
    files = PatchSet(patch)
    if len(files) != 1 or files[0].is_added_file or files[0].is_removed_file or len(files[0]) != 1:
        return None
    hunk = files[0][0]
    removed = [ln.value.rstrip("\n") for ln in hunk if ln.is_removed]
    added = [ln.value.rstrip("\n") for ln in hunk if ln.is_added]
    if len(removed) != 1 or len(added) != 1:
        return None
    return files[0].path, removed[0], added[0]


def shortest_unique_replace(source: str, old: str, new: str, min_len: int = 4) -> tuple[str, str] | None:
    """(SEARCH, REPLACE): the shortest slice of `old` around its difference from `new` occurring once in
    `source`, and the matching slice of `new`; None when even the whole line is not unique."""
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    s = 0
    while s < min(len(old), len(new)) - p and old[-1 - s] == new[-1 - s]:
        s += 1
    a, b = p, len(old) - s
    while True:
        search = old[a:b]
        if len(search) >= min_len and source.count(search) == 1:
            return search, new[a : len(new) - (len(old) - b)]
        if a == 0 and b == len(old):
            return None
        # Grow towards the side with more room, one character at a time (short SEARCH = few tokens).
        if (b < len(old) and (len(old) - b >= a or a == 0)) or a == 0:
            b += 1
        else:
            a -= 1


def short_script(task: Task, fits: Callable[[str], bool] = lambda turn: True) -> list[str]:
    """The assistant turns of the scripted solution of `task` (see the module docstring); fits: whether a turn
    fits the engine's per-turn token cap (engine.scripted.turn_fits), for the general script's edits."""
    change = _one_line_change(task.patch)
    repo = task.extra.get("repo_dir")
    if change and repo and (Path(repo) / change[0]).is_file():
        path, old, new = change
        found = shortest_unique_replace((Path(repo) / path).read_text(encoding="utf-8"), old, new)
        if found and "\n" not in found[0] + found[1]:
            search, repl = found
            return [
                _block(f"open {path}"),
                _block(f"replace {shlex.quote(search)} {shlex.quote(repl)}"),
                _block("submit"),
            ]
    return gold_patch_script(task.patch, fits)


def give_up_script(task: Task) -> list[str]:
    """A scripted non-solution of `task`: the first turn of its solution (open the file), then `submit`."""
    return short_script(task)[:1] + [_block("submit")]


def scripts(
    tasks: list[Task], decoys: int, fits: Callable[[str], bool] = lambda turn: True
) -> dict[str, list[str]]:
    """ScriptedPolicy scripts: sample 0 of every task plays its solution, samples 1..decoys give up."""
    out = {t.instance_id: short_script(t, fits) for t in tasks}
    for t in tasks:
        for k in range(1, decoys + 1):
            out[f"{t.instance_id}{SESSION_SEP}{k}"] = give_up_script(t)
    return out


def sft_data(trajs: list[Trajectory], max_per_task: int) -> tuple[list[Trajectory], list[list[int]], dict]:
    """Warm-start SFT data from the scripted rollouts: resolved solutions (sample 0, `rft_select`) and every
    give-up demonstration (samples >= 1) that is not an infrastructure failure; loss masks as in RFT
    (action tokens of well-formed turns). Returns (trajectories, masks, metrics)."""
    kept, masks, report = rft_select([t for t in trajs if t.sample_index == 0], max_per_task)
    decoys = [t for t in trajs if t.sample_index > 0 and not t.excluded]
    metrics = {"scripted_resolved": float(report.kept), "decoys": float(len(decoys)),
               "decoys_resolved": float(sum(t.resolved for t in decoys))}  # fmt: skip
    return kept + decoys, masks + [t.loss_mask(mask_malformed=True) for t in decoys], metrics
