"""VASD's loss module: the student's forward over one micro-batch and the summed value of each of
the run's terms (`fic.training.vasd.term.Term`), read from the micro-batch's term tables."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from fic.training.data import IGNORE
from fic.training.losses import causal_lm, decoder_and_head, divergence_rows, softcap_of, weighted_ce_rows
from fic.training.vasd.batches import body_inputs
from fic.training.vasd.term import DIVERGENCE, Term
from fic.training.vasd.terms import run_terms


class DistillLoss(torch.nn.Module):
    """The student's forward for one micro-batch; returns each term's sum over its positions:
    a divergence to the head its term reads (`Term.reads`) at the same tokens, or a weighted
    cross-entropy at the term's temperature (a policy gradient is one with signed weights).

    `weights` (term -> weight) is what `window_backward` combines the terms with, each divided
    by its count over the window and all ranks: a term, its weight and its normalisation are read
    in one place, its declaration. `for_run` builds the module of a VASD config.

    `heads` (reader -> a function from hidden rows to logits, with no gradient: the same head for
    a live teacher or LoRA with adapters off, a frozen copy's head otherwise) are kept out of the
    module tree (a module assigned as an attribute would be registered as a submodule): the state
    dict, the checkpoints, the optimizer and the DDP/DeepSpeed wrapper see the student's weights
    only, never a frozen or moving-average copy's head."""

    def __init__(self, model: torch.nn.Module, terms: Sequence[Term], heads: dict[str, Callable], *,
                 chunk_tokens: int, divergence: str = "forward_kl", estimator: str = "full", beta: float = 0.5,
                 top_k: int = 64, max_log_ratio: float = 0.0):
        super().__init__()
        self.model = model
        self.terms = tuple(terms)
        missing = [term.name for term in self.terms if term.reads is not None and term.reads not in heads]
        if missing:
            raise ValueError(f"no head for the divergence term(s) {', '.join(missing)}")
        self._heads = dict(heads)  # a dict: nn.Module registers only what is assigned as a module
        self.kind, self.estimator, self.beta, self.top_k = divergence, estimator, beta, top_k
        self.chunk_tokens, self.max_log_ratio = chunk_tokens, max_log_ratio
        self.softcap = softcap_of(model)

    @classmethod
    def for_run(cls, cfg: Any, model: torch.nn.Module, heads: dict[str, Callable], *, anchors: bool) -> DistillLoss:
        """The loss of a VASD run (`VASDConfig` `cfg`; `anchors`: whether its batches hold anchor
        conversations): its terms (`run_terms`) and divergence settings."""
        loss = cfg.loss
        return cls(model, run_terms(cfg, anchors=anchors), heads, chunk_tokens=cfg.train.loss_chunk_tokens,
                   divergence=loss.divergence, estimator=loss.estimator, beta=loss.beta, top_k=loss.top_k,
                   max_log_ratio=loss.max_log_ratio)

    @property
    def weights(self) -> dict[str, float]:
        return {term.name: term.weight for term in self.terms}

    @property
    def heads(self) -> dict[str, Callable]:
        return self._heads

    @property
    def config(self) -> Any:  # DeepSpeed reads hidden_size from here
        return causal_lm(self.model).config

    def forward(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, targets: dict[str, torch.Tensor],
                weights: dict[str, torch.Tensor], hidden: dict[str, torch.Tensor] | None = None,
                position_ids: torch.Tensor | None = None, segments: torch.Tensor | None = None,
                limits: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """`targets[name]`/`weights[name]` [batch, width] per term (IGNORE: untrained); `hidden[reader]`
        [rows, views, hidden]: that network's hidden states at a divergence's targets, in row-major order."""
        body, head = decoder_and_head(self.model)
        attention = body_inputs({"attention_mask": attention_mask} if segments is None else
                                {"segments": segments, "limits": limits, "position_ids": position_ids})
        states = body(input_ids=input_ids, use_cache=False, **attention).last_hidden_state
        sums = {}
        for term in self.terms:
            where = targets[term.name] != IGNORE
            rows, tokens, row_weights = states[where], targets[term.name][where], weights[term.name][where]
            if term.kind == DIVERGENCE:
                sums[term.name] = divergence_rows(
                    head, rows, self._heads[term.reads], hidden[term.reads], tokens, row_weights.float(),
                    chunk_tokens=self.chunk_tokens, softcap=self.softcap, kind=self.kind, estimator=self.estimator,
                    beta=self.beta, temperature=term.temperature, top_k=self.top_k, max_log_ratio=self.max_log_ratio)
            else:
                sums[term.name] = weighted_ce_rows(head, rows, tokens, row_weights, self.chunk_tokens, self.softcap,
                                                   term.temperature)
        return sums
