"""The reference regulariser (`terms.reference.*`): a divergence to the starting model on the
rollout's earlier replies, their first tokens (the defer-or-answer decision) weighted more, so
the shared update does not leak the teacher's answer-at-once into earlier turns
(`reference_divergence`). On the prototype it was too weak alone (the decision is about one
token in forty); beside the anchor it is the demo's `both`. It reads the starting weights: with
LoRA the adapter-free model, in full fine-tuning a frozen copy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fic.core.config import setting
from fic.core.errors import FicError
from fic.training.vasd.rows import Rollout, weighted_spans
from fic.training.vasd.term import DIVERGENCE, PlugIn, Term

EMA_WITH_REFERENCE = ("in full fine-tuning teacher.mode=ema with a reference term would need a third copy of the model "
                      "(the average, and the starting weights the reference reads): use LoRA, teacher.mode=frozen "
                      "or live, or terms.reference.weight=0")


@dataclass
class ReferenceSection:
    weight: float = setting(0.0, "Weight of the divergence to the starting model on the rollouts' earlier replies "
                            "(0: off), next to the distillation term; loss.divergence and its settings.", min=0.0, unbounded="a loss term's weight: it scales a number, not work")
    first_tokens: int = setting(4, "The first this many tokens of each earlier reply weigh first_token_weight.", min=0)
    first_token_weight: float = setting(4.0, "Weight of those first tokens (the defer-or-answer decision).", min=0.0, unbounded="a token weight")


def reference_targets(cfg: Any, rollout: Rollout) -> tuple[list[int], list[float]]:
    reference = cfg.terms.reference
    return weighted_spans(len(rollout.ids), rollout.earlier, rollout.ids, reference.first_tokens,
                          reference.first_token_weight)


def check(cfg: Any, source: str) -> None:
    if cfg.terms.reference.weight and cfg.teacher.mode == "ema" and not cfg.lora.enabled:
        raise FicError(EMA_WITH_REFERENCE, path=source, field="teacher.mode")


PLUGIN = PlugIn(
    name="reference", section=ReferenceSection, help="A divergence to the starting model on the earlier replies.",
    term=lambda cfg: Term("reference", DIVERGENCE, "reference_divergence", cfg.terms.reference.weight,
                          reads="reference", temperature=cfg.loss.temperature),
    check=check, own=reference_targets,
    renamed={"regularizer.reference_weight": "terms.reference.weight"})
