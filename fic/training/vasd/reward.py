"""The reward mode of stage 2 (`reward.weight`): a verifiable reward per rollout and its
group-relative advantage, RLOO-style.

Each task is played `reward.group_size` times in a step (consecutive conversations, one run
each, so each samples from seeds of its own). A rollout's reward is the score of its last answer,
discounted when it answered before the request was complete: the premature call is the failure
the stage exists to remove, and an outcome reward alone pays a lucky early guess as much as a
patient ask. The advantage is the reward minus the mean reward of the group's other rollouts (the
leave-one-out baseline: unbiased, and 0 for every member of a group that all scored the same, so
such a group trains nothing). `fic.training.vasd.distill` turns the advantages into weights on
each rollout's own reply tokens.
"""

from __future__ import annotations

from typing import Any, Sequence


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
