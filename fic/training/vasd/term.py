"""What a loss term of VASD is, declared once (`Term`), and what a plug-in term brings (`PlugIn`).

A run's terms are data: `fic.training.vasd.terms.run_terms` lists them, `DistillLoss` loops over
them, `window_backward` weighs each and divides it by its count over the window and all ranks,
and the step logs each under its metric. The paper's two terms (`distill`: the divergence to the
teacher at the distilled replies; `anchor`: cross-entropy on SFT-corpus conversations) are the
core's; every other arm is a plug-in, one file under `fic/training/vasd/terms/` holding its
settings, its term and the rows it trains on. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

DIVERGENCE = "divergence"            # to a no-gradient head's distribution at the same tokens
CROSS_ENTROPY = "cross_entropy"      # on target tokens, weighted
POLICY_GRADIENT = "policy_gradient"  # cross-entropy at the sampling temperature, weighted by signed advantages
KINDS = (DIVERGENCE, CROSS_ENTROPY, POLICY_GRADIENT)
# What a divergence reads beside the student: the teacher (`teacher.mode`, `teacher.view`) at the
# teacher's own rows, or the starting weights (`reference`) on the student's own ids.
READERS = ("teacher", "reference")


@dataclass(frozen=True)
class Term:
    """One loss term of a run.

    `name` keys its tables in a micro-batch (`batch["targets"][name]`, `batch["weights"][name]`),
    its sum in `DistillLoss`'s output and its count; `metric` is its per-position mean's name in
    metrics.jsonl. `reads` (divergences only) names the hidden states and head of the other side
    (`READERS`). `temperature` divides the logits (a divergence: both sides'). `per`: the term
    is divided by its total weight over the window (`weight`) or by its positions (`positions`,
    for signed weights)."""

    name: str
    kind: str
    metric: str
    weight: float
    reads: str | None = None
    temperature: float = 1.0
    per: str = "weight"

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.per not in ("weight", "positions") or \
                (self.reads not in READERS if self.kind == DIVERGENCE else self.reads is not None):
            raise ValueError(f"ill-declared loss term {self}")


@dataclass(frozen=True)
class PlugIn:
    """A VASD arm beyond the paper's, declared by the module that holds it (`PLUGIN`): its
    settings (`section`, read as `cfg.terms.<name>`), its loss term, and the hooks the step calls.
    Every hook is optional; `cfg` is the run's `VASDConfig`.

    - `term(cfg)`: its `Term` in a run (None, or weight 0: off). The hooks below that feed a term
      run only while it is on.
    - `check(cfg, source)`: rules between its settings and the rest, when the config loads.
    - `group(cfg)`: rollouts of each task a step (the reward's group).
    - `values(cfg, convs)`: a value per rollout of the step (the reward's advantages) and the
      step's figures; a rollout keeps its value in `rollout.values[name]`.
    - `own(cfg, rollout)`: its (targets, weights) on the rollout's own row.
    - `gold(cfg, conv, tokenizer)`: rows of its own (`GoldRow`s: the student's context, gold replies).
    - `replies(cfg, conv, rollout, tokenizer, replies)`: the replies the divergence is taken on,
      given the final one (`Reply`s), reshaped (per-turn views); called whenever the divergence is on.
    - `must_match`: its keys a resumed run must keep; `renamed`: old keys -> where they went."""

    name: str
    section: type
    help: str
    term: Callable[[Any], Term | None] | None = None
    check: Callable[[Any, str], None] | None = None
    group: Callable[[Any], int] | None = None
    values: Callable[[Any, list], tuple[list[float], dict]] | None = None
    own: Callable[[Any, Any], tuple[list[int], list[float]]] | None = None
    gold: Callable[[Any, Any, Any], list] | None = None
    replies: Callable[[Any, Any, Any, Any, list], list] | None = None
    must_match: tuple[str, ...] = ()
    renamed: dict[str, str] = field(default_factory=dict)


def moved(old: str, new: str, keys: tuple[str, ...]) -> dict[str, str]:
    """`renamed` entries for a section that moved whole, its keys unchanged."""
    return {old: f"{new} (the same keys)", **{f"{old}.{key}": f"{new}.{key}" for key in keys}}
