"""Shard validation (`fic shard ... --validate MODEL.yaml`): the Lost-in-Conversation rule.

The model plays the single-turn views full, concat and shuffle-concat N times per instance
(lockstep simulator, rule classifier); an instance is kept only if both concat and
shuffle-concat reach at least `threshold` (0.8) times its full score. An instance the model
never solves in full view passes trivially (0 >= 0.8 x 0) as in LiC; their count is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.generation import Backend, SamplingParams
from fic.core.instance import Instance
from fic.core.progress import Progress

VALIDATION_VIEWS = ("full", "concat", "shuffle-concat")


@dataclass
class Verdict:
    instance: Instance
    scores: dict[str, float] = field(default_factory=dict)  # mean score (0..1) per view
    keep: bool = True
    reason: str | None = None


def validate_shards(instances: Sequence[Instance], backend: Backend, *, runs: int = 3, temperature: float = 1.0,
                    threshold: float = 0.8, max_new_tokens: int = 384, batch_size: int = 64, seed: int = 0,
                    progress: bool = True) -> list[Verdict]:
    """The LiC validation rule for each instance (see the module docstring)."""
    conversations = make_conversations(instances, VALIDATION_VIEWS, runs, view_seed=seed)
    bar = Progress(len(conversations), "validating", "conv", enabled=progress)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    play(conversations, backend, VerbatimUser(), RuleClassifier(), params, batch_size=batch_size, seed=seed,
         on_finish=lambda conv: bar.update(1))
    bar.close()
    totals: dict[tuple[str, str], list[float]] = {}
    for conv in conversations:
        totals.setdefault((conv.instance.task_id, conv.view), []).append(conv.score())
    verdicts = []
    for instance in instances:
        scores = {view: sum(totals[(instance.task_id, view)]) / runs for view in VALIDATION_VIEWS}
        verdict = Verdict(instance, scores)
        short = [view for view in ("concat", "shuffle-concat") if scores[view] < threshold * scores["full"] - 1e-9]
        if short:
            verdict.keep = False
            verdict.reason = "; ".join(f"{view} scores {scores[view]:.2f} < {threshold} x full {scores['full']:.2f}"
                                       for view in short)
        verdicts.append(verdict)
    return verdicts
