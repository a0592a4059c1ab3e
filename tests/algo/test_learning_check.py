"""Learning check: DAPO with group advantages teaches a tiny policy a two-turn task; the two classic bugs do not.

The environment: each task hides a secret digit s. Turn 1: the agent answers a digit (right with chance
1/4) or says LOOK, and the environment shows s. Turn 2 (after LOOK): the agent answers. After each
answer the environment shows a verdict, OK or BAD. Reward 1 for the right digit. Other tokens are
format errors (reward 0). The reward depends on using what an earlier observation revealed, so credit
must reach the turn-1 LOOK through the final reward, and the answer must copy the observation.

The policy is a next-token table (logits = W[previous token]): like an LLM, one head predicts action
and observation tokens from shared contexts. That is what makes training observation tokens harmful:
the verdict OK follows a digit with positive advantage, so the policy learns to "say" OK after seeing
a digit (hallucinating the environment's success message) instead of answering. Chance success is
about 0.15, direct guessing 0.25, LOOK-then-copy 1.0.

Rollouts go through the real pieces: Trajectory records with engine logprobs, build_dapo_batch
(group advantages, dynamic sampling), the trajectories' loss masks, to_samples and pack (the trainer's
micro-batches), split_optimizer_steps, dapo_loss with the step's global token count. The two bug tests put
the bug into the project's code (monkeypatched), not into this file's trainer.
"""

import pytest
import torch

from swe_megatron.algo import (
    DapoOptions,
    build_dapo_batch,
    dapo_batch,
    dapo_loss,
    split_optimizer_steps,
    token_logprobs,
)
from swe_megatron.pipeline.stages import to_samples
from swe_megatron.train.packing import pack
from swe_megatron.trajectory import ExitReason, Trajectory

START, LOOK, OK, BAD = 0, 1, 2, 3
DIGITS = 4
V = 4 + DIGITS
MAX_LEN = 5  # START a1 o1 a2 o2


def _rollout(w: torch.Tensor, secrets: list[int], gen: torch.Generator) -> list[Trajectory]:
    n = len(secrets)
    logp = torch.log_softmax(w.detach(), -1)
    d = torch.tensor(secrets) + 4
    a1 = torch.multinomial(logp[START].exp().expand(n, V), 1, generator=gen).squeeze(1)
    a2 = torch.multinomial(logp[d].exp(), 1, generator=gen).squeeze(1)  # used only after LOOK
    out = []
    for i in range(n):
        tok, lp = [START, int(a1[i])], [0.0, logp[START, a1[i]].item()]
        spans, first = [[1, 2]], int(a1[i])
        if first == LOOK:
            second = int(a2[i])
            tok += [int(d[i]), second]
            lp += [0.0, logp[d[i], second].item()]
            spans.append([3, 4])
            answer = second
        else:
            answer = first
        solved = answer == int(d[i])
        tok.append(OK if solved else BAD)
        lp.append(0.0)
        reason = ExitReason.submitted if answer >= 4 else ExitReason.format_limit
        mask = [0] * len(tok)
        for s, _ in spans:
            mask[s] = 1
        out.append(
            Trajectory(
                task_id=f"secret-{secrets[i]}-{i // 8}",
                sample_index=i % 8,
                token_ids=tok,
                action_mask=mask,
                logprobs=lp,
                prompt_len=1,
                turn_spans=spans,
                num_steps=len(spans),
                exit_reason=reason,
                reward=float(solved),
                resolved=solved,
            )
        )
    return out


def _success_rate(w: torch.Tensor, gen: torch.Generator, n: int = 1024) -> float:
    secrets = torch.randint(0, DIGITS, (n,), generator=gen).tolist()
    return sum(t.reward for t in _rollout(w, secrets, gen)) / n


def _train(seed: int, iterations: int = 60, tasks: int = 16, group: int = 8):
    """DAPO through the project's own data path: build_dapo_batch (advantages, dynamic sampling), the
    trajectories' loss masks, pipeline.stages.to_samples, train.packing.pack (rows, targets, per-token
    advantages, engine logprobs as the old policy), dapo_loss over the step's global action-token count."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.zeros(V, V, requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.1)
    # two turns at most stay below l_thr: no length penalty here (test_rewards pins it), so R_final = R
    options = DapoOptions(t_max=4, l_thr=3, adv_eps=1e-6, eps_low=0.2, eps_high=0.3)
    before = _success_rate(w, gen)
    for it in range(iterations):
        secrets = torch.randint(0, DIGITS, (tasks,), generator=gen).repeat_interleave(group).tolist()
        batch = build_dapo_batch(_rollout(w, secrets, gen), options)
        trajs = batch.trajectories
        if not trajs:
            continue
        samples = to_samples(
            trajs, [t.loss_mask(mask_malformed=False) for t in trajs], batch.advantages.tolist()
        )
        for step in split_optimizer_steps(
            list(range(len(samples))), batch_size=32, min_steps=2, max_steps=8, seed=it
        ):
            mbs = pack([samples[i] for i in step], token_budget=64)
            total = sum(mb.num_action_tokens for mb in mbs)
            opt.zero_grad()
            for mb in mbs:
                # the table policy: the logits at a position are W[token there]; rows index the [b * s] positions
                lp = token_logprobs(w[mb.tokens.flatten()[mb.rows]], mb.targets)
                old = mb.engine_logprobs
                loss, _ = dapo_loss(lp, old, mb.advantages, torch.ones_like(lp, dtype=torch.bool),
                                    options.eps_low, options.eps_high, total)  # fmt: skip
                loss.backward()
            torch.nn.utils.clip_grad_norm_([w], 1.0)
            opt.step()
    return before, _success_rate(w, gen)


@pytest.mark.parametrize("seed", [0, 1])
def test_dapo_learns_to_look_and_copy(seed):
    before, after = _train(seed)
    assert before < 0.2
    assert after > 0.9


def test_training_observation_tokens_breaks_it(monkeypatch):
    """The bug in the project: Trajectory.loss_mask also marks observation tokens (whose logprobs are the
    environment's 0.0). The same trainer then learns to hallucinate the verdict instead of answering."""

    def every_token_after_the_prompt(self, mask_malformed):
        return [0] * self.prompt_len + [1] * (len(self.token_ids) - self.prompt_len)

    monkeypatch.setattr(Trajectory, "loss_mask", every_token_after_the_prompt)
    before, after = _train(0)
    assert before < 0.2
    assert after < 0.5


def test_wrong_advantage_sign_unlearns(monkeypatch):
    """The bug in the project: group advantages with the wrong sign (algo/advantages.py as dapo_batch calls it)."""
    right = dapo_batch.group_advantages
    monkeypatch.setattr(dapo_batch, "group_advantages", lambda *a, **k: -right(*a, **k))
    before, after = _train(0)
    assert after < 0.05 < before
