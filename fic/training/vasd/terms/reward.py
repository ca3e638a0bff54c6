"""A verifiable reward (`terms.reward.*`): a group-relative policy-gradient term, RLOO-style.

Each task is played `group_size` times in a step (consecutive conversations, one run each, so each
samples from seeds of its own). A rollout's reward is the score of its last answer, discounted
when it answered before the request was complete: the premature call is the failure the stage
exists to remove, and an outcome reward alone pays a lucky early guess as much as a patient ask.
The advantage is the reward minus the mean reward of the group's other rollouts (the
leave-one-out baseline: unbiased, and 0 for every member of a group that all scored the same, so
such a group trains nothing). Every reply token of the rollout is then trained with
cross-entropy at `rollout.temperature` (the distribution it was sampled from) weighted by the
advantage (`policy_gradient_loss`), on the rollout's own row: no extra forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from fic.core.bounds import MAX_BATCH
from fic.core.config import setting
from fic.core.errors import FicError
from fic.training.vasd.rows import Rollout, weighted_spans
from fic.training.vasd.term import POLICY_GRADIENT, PlugIn, Term, moved


@dataclass
class RewardSection:
    weight: float = setting(0.0, "Weight of a policy-gradient term on a verifiable reward (0: off), group-relative "
                            "as in RLOO: each task is played group_size times a step, a rollout's reward is its "
                            "final answer's score, discounted when it answered early (premature_penalty), and its "
                            "advantage is that reward minus the mean of the group's other rollouts. Every reply "
                            "token of the rollout, the ask-or-answer ones included, is trained with cross-entropy "
                            "at rollout.temperature (the distribution it was sampled from) weighted by the "
                            "advantage. Untuned; the discount of a premature call follows RLAAR (arXiv 2510.18731).", min=0.0, unbounded="a loss term's weight: it scales a number, not work")
    group_size: int = setting(4, "Rollouts of each task per step; it divides train.micro_batch_size x "
                              "train.grad_accum_steps, so a step plays that many over group_size tasks.", min=2,
                              max=MAX_BATCH)
    premature_penalty: float = setting(1.0, "An early answer's reward is the final score times 1 - this (1: an "
                                       "early call earns nothing, however the conversation ends).", min=0.0, max=1.0)
    penalize: str = setting("premature", "Which early answers are discounted. premature: any answer attempt before "
                            "the last shard; unanswerable: only one made before the request was answerable "
                            "(`Task.answerable`; where the task cannot tell, as premature).",
                            choices=("premature", "unanswerable"))
    unanswered_reward: float = setting(0.0, "The reward of a rollout whose final reply, after the last shard, is no "
                                       "answer attempt, in place of its score (0: off, it keeps its last answer's score, 0 "
                                       "if it never answered). Below 0 an ask at the end scores worse than a wrong "
                                       "call; at 0 one dev seed learned to ask at the last shard (docs/results.md).",
                                       min=-1.0, max=0.0)


def rollout_reward(conv: Any, premature_penalty: float, penalize: str = "premature",
                   unanswered: float = 0.0) -> float:
    """The reward of one played conversation: its score (that of its last answer attempt, 0 when
    it never answered), times 1 - `premature_penalty` when its first answer was premature, as
    the evaluation counts it (`penalize: premature`), or premature and made before the request
    was answerable (`unanswerable`; where the task cannot tell, as premature). With `unanswered`
    below 0, a conversation whose final reply is no answer attempt earns that instead: asking after
    the last shard is then worse than a wrong call, where an outcome score alone ranks them alike."""
    if unanswered and (not conv.turns or conv.turns[-1].label != "answer_attempt"):
        return unanswered
    record = conv.to_record()
    early = record["premature_answer"] and (penalize == "premature" or record["answerable_at_first_answer"] is not True)
    return record["score"] * (1.0 - premature_penalty if early else 1.0)


def leave_one_out(rewards: Sequence[float], group_size: int) -> list[float]:
    """RLOO advantages: each reward minus the mean of the other rewards of its group, the groups
    being consecutive runs of `group_size`."""
    if group_size < 2 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not fall into groups of {group_size} (at least 2)")
    advantages = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        total = sum(group)
        flat = max(group) == min(group)  # exactly 0, not a rounding residue that would still count positions
        advantages += [0.0 if flat else r - (total - r) / (group_size - 1) for r in group]
    return advantages


def reward_figures(rewards: Sequence[float], advantages: Sequence[float], group_size: int) -> dict:
    """What a step's rewards were: their mean, and the share of groups that trained nothing (every
    member scored alike)."""
    groups = [advantages[i:i + group_size] for i in range(0, len(advantages), group_size)]
    return {"reward_mean": sum(rewards) / max(len(rewards), 1),
            "reward_flat_groups": sum(all(a == 0 for a in g) for g in groups) / max(len(groups), 1)}


def advantages(cfg: Any, convs: list) -> tuple[list[float], dict]:
    """Each rollout's group-relative advantage, and the step's reward figures."""
    reward = cfg.terms.reward
    rewards = [rollout_reward(conv, reward.premature_penalty, reward.penalize, reward.unanswered_reward)
               for conv in convs]
    values = leave_one_out(rewards, reward.group_size)
    return values, reward_figures(rewards, values, reward.group_size)


def reward_targets(cfg: Any, rollout: Rollout) -> tuple[list[int], list[float]]:
    """Every reply token of a rollout (the early asks, where the decision is made, and the final
    reply), weighing its advantage; nothing where the advantage is 0."""
    advantage = rollout.values.get("reward", 0.0)
    targets, weights = weighted_spans(len(rollout.ids), [*rollout.earlier, rollout.final] if advantage else [],
                                      rollout.ids, 0, 1.0)
    return targets, [w * advantage for w in weights]


def check(cfg: Any, source: str) -> None:
    reward = cfg.terms.reward
    if not reward.weight:
        return
    per_rank = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
    if per_rank % reward.group_size:
        raise FicError(f"terms.reward.group_size {reward.group_size} must divide the {per_rank} rollouts a process "
                       "plays a step (train.micro_batch_size x train.grad_accum_steps)", path=source,
                       field="terms.reward.group_size")
    if cfg.rollout.temperature <= 0:
        raise FicError("the reward's group needs sampled rollouts: greedy ones are all alike, so every advantage is "
                       "0; set rollout.temperature > 0", path=source, field="rollout.temperature")


PLUGIN = PlugIn(
    name="reward", section=RewardSection, help="A group-relative policy-gradient term on a verifiable reward that "
    "discounts early answers.",
    # normalised by its positions: its weights are signed advantages
    term=lambda cfg: Term("reward", POLICY_GRADIENT, "policy_gradient_loss", cfg.terms.reward.weight,
                          temperature=cfg.rollout.temperature or 1.0, per="positions"),
    check=check, group=lambda cfg: cfg.terms.reward.group_size, values=advantages, own=reward_targets,
    must_match=("terms.reward.group_size",),
    renamed=moved("reward", "terms.reward", ("weight", "group_size", "premature_penalty", "penalize",
                                             "unanswered_reward")))
