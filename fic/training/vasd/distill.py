"""VASD's pieces: rollouts as student rows, the single-turn teacher rows, and the loss module.

Token layout (nothing is ever re-tokenised). A rollout is a `fic.conversation.simulator.Conversation`
played on-policy: `conv.ids` are the exact ids the student saw and wrote, and turn k's reply
occupies `[turn.prompt_tokens, turn.prompt_tokens + turn.reply_tokens)` of them. The final
reply is the reply to the last shard. For a distilled reply the teacher reads

    teacher ids = prompt_ids(system + a single-turn view) + the student's own reply ids

so reply token j sits at student position p + j and teacher position q + j, where p and q
are the two prompt lengths: the loss at position t predicts token t + 1, and both sides are
read at the same reply tokens, one for one. The final reply's single-turn view is
`teacher.view` (the whole request; `hinted` adds the reference answer after it); with
`loss.turns: all` every earlier reply k is distilled too (its first `loss.nonfinal_tokens`
tokens, where set: the ask-or-answer decision), against the single-turn view of what the user
had revealed by turn k (the concat view of those shards, `fic.data.views.partial_instance`): a
teacher that reads an incomplete request in one turn, where it is easier to see that something
is missing.

Rows of one micro-batch (right-padded, one forward of the student):

- `distill_targets`/`distill_weights`: the distilled replies' next-token targets (rollouts)
  and their weights (`loss.nonfinal_weight` on earlier replies, `loss.decision_weight` on the
  first `loss.decision_tokens` of each); the divergence to the teacher is taken there.
  `teacher_hidden` holds the teacher's hidden states at the same tokens, in the same
  row-major order, shaped [n_reply_tokens, views, hidden] (an earlier reply's one view fills
  every slot).
- `labels_targets`/`labels_weights` (`labels.weight`): the student's own context at one of its
  earlier turns followed by a gold ask or deferral for that state (`Task.early_reply`), trained
  with cross-entropy: imitation on the states the policy visits (DAgger), premature answers
  included in the context.
- `corrections_targets`/`corrections_weights` (`corrections.weight`): the student's own context
  up to its first premature turn, continued with the gold replies to the end (or, when nothing
  was premature but the final reply is wrong, the gold answer in its own context); cross-entropy
  on the gold replies.
- `reward_targets`/`reward_weights` (`reward.weight`): every reply token of a rollout, weighted
  by its group-relative advantage (`fic.training.vasd.reward`); cross-entropy at the sampling
  temperature, so the term's gradient is the policy gradient. It is normalised by its positions,
  not by its weights, which are signed.
- `anchor_targets`/`anchor_weights`: an SFT-corpus conversation's non-final assistant turns
  (its deferrals and asks), trained with cross-entropy to keep what SFT taught.
- `reference_targets`/`reference_weights`: a rollout's non-final replies, pulled towards the
  starting model (`reference_hidden`, the frozen model on the same ids).

The first `first_tokens` positions of each non-final reply weigh `first_token_weight`: the
defer-or-answer decision is made there, about one token in forty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from fic import tasks
from fic.core.chat import prompt_ids
from fic.data.views import partial_instance, system_message, user_turns
from fic.training.data import IGNORE, Example, padded_width
from fic.training.losses import causal_lm, decoder_and_head, divergence_rows, softcap_of, weighted_ce_rows

# VASD's loss terms, each named once: the key of its targets, weights and positions in a
# micro-batch (`<term>_targets`, `<term>_weights`, counts) and of its sum in `DistillLoss`'s
# output, mapped to the name of its per-position mean in metrics.jsonl.
TERMS = {"distill": "divergence_per_token", "anchor": "anchor_ce", "labels": "labels_ce",
         "corrections": "corrections_ce", "reference": "reference_divergence", "reward": "policy_gradient_loss"}


@dataclass
class Rollout:
    """One played conversation, reduced to what the losses need."""

    ids: list[int]
    final: tuple[int, int]                  # [start, end) of the final reply in `ids`
    earlier: list[tuple[int, int]]          # spans of the non-final replies
    finished: bool                          # the final reply ended with its end-of-turn token
    teacher_prompts: list[list[int]] = field(default_factory=list)  # one per teacher view
    partial_prompts: list[list[int]] = field(default_factory=list)  # one per earlier reply (loss.turns: all)
    distilled: list[tuple[tuple[int, int], float]] = field(default_factory=list)  # (span, weight) to distill
    advantage: float = 0.0                  # reward.weight: its group-relative advantage (0: no reward targets)

    @property
    def answer_ids(self) -> list[int]:
        return self.ids[self.final[0]:self.final[1]]

    def teacher_rows(self, view: int) -> list[tuple[list[int], list[int]]]:
        """(teacher prompt, reply ids) of each distilled reply, in order, for teacher view slot
        `view`: the final reply reads that view, an earlier reply its partial request."""
        earlier = {start: k for k, (start, _) in enumerate(self.earlier)}  # a distilled span may be cut short
        return [(self.teacher_prompts[view] if span == self.final else self.partial_prompts[earlier[span[0]]],
                 self.ids[span[0]:span[1]]) for span, _ in self.distilled]


def rollout_from(conv: Any) -> Rollout:
    """The token spans of a played conversation (`fic.conversation.simulator.Conversation`)."""
    spans = [(t.prompt_tokens, t.prompt_tokens + t.reply_tokens) for t in conv.turns]
    if not spans or conv.ids[spans[-1][0]:spans[-1][1]] == [] or spans[-1][1] != len(conv.ids):
        raise ValueError("the conversation has no final reply at the end of its ids")
    return Rollout(ids=list(conv.ids), final=spans[-1], earlier=spans[:-1],
                   finished=conv.turns[-1].finish_reason == "stop")


def revealed_by_turn(conv: Any) -> list[list[int]]:
    """The shard ids the user had revealed by each turn of a played conversation (cumulative)."""
    seen: list[int] = []
    out = []
    for turn in conv.turns:
        seen += [i for i in turn.shard_ids if i not in seen]
        out.append(list(seen))
    return out


def partial_prompts(tokenizer: Any, conv: Any) -> list[list[int]]:
    """The teacher's prompt ids for each earlier reply of `conv`: the task's system prompt and, as
    one user turn, the concat view of the shards revealed by that turn."""
    return [prompt_ids(tokenizer, [system_message(conv.instance), {
        "role": "user", "content": user_turns(partial_instance(conv.instance, shown), "concat")[0]}])
        for shown in revealed_by_turn(conv)[:-1]]


HINT = "\n\n(For reference, the correct final answer is: {answer})"  # teacher.view: hinted


def teacher_request(instance: Any, view: str) -> str:
    """The teacher's one user turn for a single-turn view; `hinted` is the full view followed by
    the reference answer (`HINT`) and nothing else."""
    if view == "hinted":
        return user_turns(instance, "full")[0] + HINT.format(answer=tasks.of(instance).reference_answer(instance))
    return user_turns(instance, view)[0]


def teacher_prompts(tokenizer: Any, instance: Any, views: Sequence[str]) -> list[list[int]]:
    """The teacher's prompt ids for each single-turn view: the task's system prompt, the view as
    one user turn (`teacher_request`), and the generation prompt, rendered by the chat template."""
    return [prompt_ids(tokenizer, [system_message(instance), {"role": "user", "content": teacher_request(instance, v)}])
            for v in views]


def weighted_spans(length: int, spans: Sequence[tuple[int, int]], ids: Sequence[int], first_tokens: int,
                   first_weight: float) -> tuple[list[int], list[float]]:
    """Targets and weights of `length` positions that train the tokens in `spans`: position t
    predicts ids[t + 1]; the first `first_tokens` tokens of each span weigh `first_weight`."""
    targets, weights = [IGNORE] * length, [0.0] * length
    for start, end in spans:
        for k, token in enumerate(range(start, end)):
            targets[token - 1] = ids[token]
            weights[token - 1] = first_weight if k < first_tokens else 1.0
    return targets, weights


def runs_of(targets: Sequence[int]) -> list[tuple[int, int]]:
    """Token spans (as token positions, i.e. target position + 1) of the runs of consecutive
    trained targets: one per assistant reply in an SFT example."""
    spans, start = [], None
    for t, y in enumerate(list(targets) + [IGNORE]):
        if y != IGNORE and start is None:
            start = t
        elif y == IGNORE and start is not None:
            spans.append((start + 1, t + 1))
            start = None
    return spans


@dataclass
class GoldRow:
    """The student's own ids up to one of its turns, continued with gold replies (labels: one
    reply at an earlier turn; corrections: every reply from there to the final one, with the user
    turns between): `ids`, and the `spans` of the gold replies in them, trained with
    cross-entropy (imitation on the states the policy visits)."""

    ids: list[int]
    spans: list[tuple[int, int]]

    @classmethod
    def single(cls, context: list[int], reply: list[int]) -> GoldRow:
        return cls(context + reply, [(len(context), len(context) + len(reply))])


def decision_weighted(spans: Sequence[tuple[tuple[int, int], float]], length: int, ids: Sequence[int],
                      decision_tokens: int, decision_weight: float) -> tuple[list[int], list[float]]:
    """Targets and weights of the (span, weight) pairs: each span's tokens weigh its weight, its
    first `decision_tokens` tokens that times `decision_weight`."""
    targets, weights = [IGNORE] * length, [0.0] * length
    for (start, end), weight in spans:
        span_t, span_w = weighted_spans(length, [(start, end)], ids, decision_tokens, decision_weight)
        for t in range(start - 1, end - 1):
            targets[t], weights[t] = span_t[t], weight * span_w[t]
    return targets, weights


def _row(ids: list[int], term: str | None = None, targets: list[int] = (), weights: list[float] = ()) -> dict:
    """A student row that trains `term` at `targets` with `weights` (None: nothing), the other
    terms' targets empty."""
    n = len(ids)
    row: dict = {"input_ids": ids}
    for name in TERMS:
        row[f"{name}_targets"], row[f"{name}_weights"] = (list(targets), list(weights)) if name == term else \
            ([IGNORE] * n, [0.0] * n)
    return row


def student_rows(rollouts: Sequence[Rollout], anchors: Sequence[Example], labels: Sequence[GoldRow] = (),
                 corrections: Sequence[GoldRow] = (), *, reference: bool, first_tokens: int, first_weight: float,
                 decision_tokens: int = 0, decision_weight: float = 1.0) -> list[dict]:
    """One row per rollout, then per anchor example, label row and correction row, as lists (see
    the module docstring). A rollout's distilled replies are its `distilled` (span, weight) pairs;
    with an `advantage`, every reply token is a reward target weighing it."""
    rows = []
    for rollout in rollouts:
        n = len(rollout.ids)
        distill_t, distill_w = decision_weighted(rollout.distilled, n, rollout.ids, decision_tokens, decision_weight)
        ref_t, ref_w = weighted_spans(n, rollout.earlier if reference else [], rollout.ids, first_tokens, first_weight)
        reward_t, reward_w = weighted_spans(n, [*rollout.earlier, rollout.final] if rollout.advantage else [],
                                            rollout.ids, 0, 1.0)
        row = _row(rollout.ids, "distill", distill_t, distill_w)
        row["reference_targets"], row["reference_weights"] = ref_t, ref_w
        row["reward_targets"], row["reward_weights"] = reward_t, [w * rollout.advantage for w in reward_w]
        rows.append(row)
    for example in anchors:
        anchor_t, anchor_w = weighted_spans(len(example.input_ids), runs_of(example.targets), example.input_ids,
                                            first_tokens, first_weight)
        rows.append(_row(example.input_ids, "anchor", anchor_t, anchor_w))
    for term, gold in (("labels", labels), ("corrections", corrections)):
        for row in gold:
            gold_t, gold_w = weighted_spans(len(row.ids), row.spans, row.ids, first_tokens, first_weight)
            rows.append(_row(row.ids, term, gold_t, gold_w))
    return rows


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    return next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _add_branch(row: dict, ids: Sequence[int], shared: int) -> None:
    """Append ids[shared:] to a row with branches (`input_ids`, `position_ids`, `segments`,
    `limits`) as a new branch at `shared`: its tokens keep their positions in `ids`."""
    tail = len(ids) - shared
    row["input_ids"] += list(ids[shared:])
    row["position_ids"] += list(range(shared, len(ids)))
    row["segments"] += [max(row["segments"]) + 1] * tail
    row["limits"] += [shared] * tail


def shared_prefix_rows(rows: Sequence[dict]) -> list[dict]:
    """Student rows of one rollout as few rows: the first row's ids are the trunk, and each other
    row whose ids start like the trunk's adds only the tokens after their longest common prefix,
    as a branch. A branch token keeps the position it has in its own row and attends to the trunk
    before the branch point and to its branch up to itself (`segments`: 0 trunk, b branch b;
    `limits`: a branch token's branch point; `branch_mask`), so every token sees what it saw in
    its own row and the losses and gradients are those of the separate rows, while the shared
    context (a label row is the rollout's own ids up to an earlier turn) is computed once. A row
    sharing nothing, or whose targets would fall where the trunk already trains the same term,
    stays a row of its own."""
    trunk = {name: list(value) for name, value in rows[0].items()}
    n = len(trunk["input_ids"])
    trunk.update(position_ids=list(range(n)), segments=[0] * n, limits=[0] * n)
    alone = []
    for row in rows[1:]:
        ids = row["input_ids"]
        shared = common_prefix(ids, trunk["input_ids"][:n])
        on_trunk = [(name, t) for name in TERMS for t in range(shared) if row[f"{name}_targets"][t] != IGNORE]
        if not shared or any(trunk[f"{name}_targets"][t] != IGNORE for name, t in on_trunk):
            alone.append(row)
            continue
        for name, t in on_trunk:
            trunk[f"{name}_targets"][t], trunk[f"{name}_weights"][t] = row[f"{name}_targets"][t], row[f"{name}_weights"][t]
        for name in TERMS:
            for kind in ("targets", "weights"):
                trunk[f"{name}_{kind}"] += row[f"{name}_{kind}"][shared:]
        _add_branch(trunk, ids, shared)
    return [trunk, *alone]


def packed_sequences(sequences: Sequence[Sequence[int]], min_shared: float = 0.5
                     ) -> tuple[list[dict], list[tuple[int, int, int]]]:
    """Sequences in order as rows with branches (see `shared_prefix_rows`): a sequence that shares
    at least `min_shared` of its ids with the trunk of the row before it (the first sequence
    there) rides on that row as a branch, else it starts a row. Also, for each sequence, (row,
    shared, start): its token t sits at index t of that row when t < shared, else at
    start + t - shared. The bar keeps rows short: sequences of one rollout (a teacher's prompts,
    one system prompt and a few words apart) share, different tasks (a common preamble) do not."""
    rows: list[dict] = []
    where, trunk = [], 0
    for ids in sequences:
        shared = common_prefix(ids, rows[-1]["input_ids"][:trunk]) if rows else 0
        if shared and shared >= min_shared * len(ids):
            where.append((len(rows) - 1, shared, len(rows[-1]["input_ids"])))
            _add_branch(rows[-1], ids, shared)
            continue
        trunk = len(ids)
        rows.append({"input_ids": list(ids), "position_ids": list(range(trunk)), "segments": [0] * trunk,
                     "limits": [0] * trunk})
        where.append((len(rows) - 1, trunk, 0))
    return rows, where


def branch_mask(segments: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """The [batch, 1, width, width] attention mask (True: attends) of rows with branches: a token
    attends to the earlier tokens of its own segment, and a branch token also to the trunk before
    its branch point (`limits`). Padding (segment -1) attends to earlier padding only, so no row of
    the mask is empty."""
    index = torch.arange(segments.shape[1], device=segments.device)
    causal = index[None, :] <= index[:, None]
    same = segments[:, None, :] == segments[:, :, None]
    trunk_before = (segments[:, None, :] == 0) & (index[None, None, :] < limits[:, :, None])
    return (causal & (same | trunk_before))[:, None]


def body_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The decoder's attention inputs for a collated batch: the padding mask, or, where rows have
    branches, their positions and `branch_mask`."""
    if "segments" not in batch:
        return {"attention_mask": batch["attention_mask"]}
    return {"attention_mask": branch_mask(batch["segments"], batch["limits"]), "position_ids": batch["position_ids"]}


def collate_rows(rows: Sequence[dict], pad_id: int, multiple: int = 0, terms: bool = True) -> dict[str, torch.Tensor]:
    """Right-pad the rows of `student_rows` (with `terms`; else bare ids) into one batch (up to a
    multiple of `multiple`); where any row has branches (`shared_prefix_rows`), with every row's
    positions and segments."""
    width = padded_width((len(r["input_ids"]) for r in rows), multiple)
    batch = {"input_ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
             "attention_mask": torch.zeros((len(rows), width), dtype=torch.long)}
    for term in TERMS if terms else ():
        batch[f"{term}_targets"] = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        batch[f"{term}_weights"] = torch.zeros((len(rows), width), dtype=torch.float32)
    if any("segments" in r for r in rows):
        batch["position_ids"] = torch.zeros((len(rows), width), dtype=torch.long)
        batch["segments"] = torch.full((len(rows), width), -1, dtype=torch.long)
        batch["limits"] = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        batch["attention_mask"][i, :n] = 1
        if "segments" in batch and "segments" not in row:
            row = {**row, "position_ids": list(range(n)), "segments": [0] * n, "limits": [0] * n}
        for name, value in row.items():
            batch[name][i, :n] = torch.tensor(value, dtype=batch[name].dtype)
    return batch


def batch_counts(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Positions (or total weight) of each loss term in a collated micro-batch; the reward's
    positions (its weights are signed advantages)."""
    return {**{term: float(batch[f"{term}_weights"].sum()) for term in TERMS},
            "reward": float((batch["reward_targets"] != IGNORE).sum()), "tokens": float(batch["attention_mask"].sum())}


def hidden_at(net: torch.nn.Module, sequences: Sequence[list[int]], positions: Sequence[Sequence[int]],
              pad_id: int, device: Any, multiple: int = 0, share_prefixes: bool = False) -> torch.Tensor:
    """Hidden states of `net` (no gradient) at the given positions of each sequence, rows in
    order: sequence by sequence, positions as listed. One forward pass, right-padded (up to a
    multiple of `multiple`); with `share_prefixes`, sequences that start like the one before them
    ride on its row as branches (`packed_sequences`), the same hidden states from fewer positions."""
    if not sequences:  # in the weights' dtype, as the rows of a forward pass would be
        dtype = next(net.parameters()).dtype
        return torch.zeros((0, causal_lm(net).config.hidden_size), device=device, dtype=dtype)
    body, _ = decoder_and_head(net)
    if share_prefixes:
        rows, where = packed_sequences(sequences)
    else:
        rows, where = [{"input_ids": list(s)} for s in sequences], [(i, len(s), 0) for i, s in enumerate(sequences)]
    batch = {k: v.to(device) for k, v in collate_rows(rows, pad_id, multiple, terms=False).items()}
    with torch.no_grad():
        hidden = body(input_ids=batch["input_ids"], use_cache=False, **body_inputs(batch)).last_hidden_state
    picked = [hidden[r, [t if t < shared else start + t - shared for t in p]]
              for (r, shared, start), p in zip(where, positions) if len(p)]
    return torch.cat(picked) if picked else hidden.new_zeros((0, hidden.shape[-1]))


class DistillLoss(torch.nn.Module):
    """The student's forward for one micro-batch; returns the summed loss terms `distill`
    (divergence to the teacher at the distilled replies' tokens), `anchor` (cross-entropy on SFT
    corpus turns), `labels` and `corrections` (cross-entropy on gold replies at the student's own
    states), `reward` (advantage-weighted cross-entropy on the rollouts' own replies) and
    `reference` (divergence to the starting model on earlier replies).

    `weights` (term -> weight, the terms the run trains) is what `window_backward` combines the
    terms with, each divided by its positions over the window and all ranks: a term, its weight
    and its normalisation are read in one place. `for_run` builds it from a VASD config.

    `teacher_head` and `reference_head` map hidden rows to logits with no gradient (the same
    head for a live teacher or LoRA with adapters off, a frozen copy's head otherwise). They are
    kept out of the module tree (a module assigned as an attribute would be registered as a
    submodule): the state dict, the checkpoints, the optimizer and the DDP/DeepSpeed wrapper see
    the student's weights only, never a frozen or moving-average copy's head.
    """

    def __init__(self, model: torch.nn.Module, teacher_head: Callable, reference_head: Callable | None, *,
                 divergence: str, estimator: str, beta: float, temperature: float, top_k: int, chunk_tokens: int,
                 weights: dict[str, float] | None = None, max_log_ratio: float = 0.0, reward_temperature: float = 1.0):
        super().__init__()
        self.model = model
        self.weights = {"distill": 1.0} if weights is None else {k: v for k, v in weights.items() if v > 0}
        self._heads = (teacher_head, reference_head)  # a tuple: nn.Module does not register what it holds
        self.kind, self.estimator, self.beta = divergence, estimator, beta
        self.temperature, self.top_k, self.chunk_tokens = temperature, top_k, chunk_tokens
        self.max_log_ratio, self.reward_temperature = max_log_ratio, reward_temperature
        self.softcap = softcap_of(model)

    @classmethod
    def for_run(cls, cfg: Any, model: torch.nn.Module, parts: Any, *, anchors: bool) -> DistillLoss:
        """The loss of a VASD run (`VASDConfig` `cfg`, teacher and reference `parts`): its
        divergence settings and each term's weight, 0 (left out) where the run has no such rows."""
        weights = {"distill": cfg.loss.weight, "anchor": cfg.regularizer.anchor_weight if anchors else 0.0,
                   "reference": cfg.regularizer.reference_weight if parts.ref_head is not None else 0.0,
                   "labels": cfg.labels.weight, "corrections": cfg.corrections.weight, "reward": cfg.reward.weight}
        return cls(model, parts.head, parts.ref_head, divergence=cfg.loss.divergence, estimator=cfg.loss.estimator,
                   beta=cfg.loss.beta, temperature=cfg.loss.temperature, top_k=cfg.loss.top_k,
                   chunk_tokens=cfg.train.loss_chunk_tokens, weights=weights, max_log_ratio=cfg.loss.max_log_ratio,
                   reward_temperature=cfg.rollout.temperature or 1.0)

    @property
    def teacher_head(self) -> Callable:
        return self._heads[0]

    @property
    def reference_head(self) -> Callable | None:
        return self._heads[1]

    @property
    def config(self) -> Any:  # DeepSpeed reads hidden_size from here
        return causal_lm(self.model).config

    def _term(self, hidden: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, other: torch.Tensor,
              head: Callable, other_head: Callable) -> torch.Tensor:
        where = targets != IGNORE
        return divergence_rows(head, hidden[where], other_head, other, targets[where], weights[where].float(),
                               chunk_tokens=self.chunk_tokens, softcap=self.softcap, kind=self.kind,
                               estimator=self.estimator, beta=self.beta, temperature=self.temperature,
                               top_k=self.top_k, max_log_ratio=self.max_log_ratio)

    def _anchor(self, hidden: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, head: Callable,
                temperature: float = 1.0) -> torch.Tensor:
        where = targets != IGNORE
        return weighted_ce_rows(head, hidden[where], targets[where], weights[where], self.chunk_tokens, self.softcap,
                                temperature)

    def forward(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, distill_targets: torch.Tensor,
                distill_weights: torch.Tensor, teacher_hidden: torch.Tensor, anchor_targets: torch.Tensor,
                anchor_weights: torch.Tensor, reference_targets: torch.Tensor, reference_weights: torch.Tensor,
                labels_targets: torch.Tensor, labels_weights: torch.Tensor, corrections_targets: torch.Tensor,
                corrections_weights: torch.Tensor, reward_targets: torch.Tensor, reward_weights: torch.Tensor,
                reference_hidden: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, segments: torch.Tensor | None = None,
                limits: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        body, head = decoder_and_head(self.model)
        attention = body_inputs({"attention_mask": attention_mask} if segments is None else
                                {"segments": segments, "limits": limits, "position_ids": position_ids})
        hidden = body(input_ids=input_ids, use_cache=False, **attention).last_hidden_state
        terms = {"distill": self._term(hidden, distill_targets, distill_weights, teacher_hidden, head,
                                       self.teacher_head),
                 "anchor": self._anchor(hidden, anchor_targets, anchor_weights, head),
                 "labels": self._anchor(hidden, labels_targets, labels_weights, head),
                 "corrections": self._anchor(hidden, corrections_targets, corrections_weights, head),
                 "reward": self._anchor(hidden, reward_targets, reward_weights, head, self.reward_temperature)}
        if reference_hidden is not None and self.reference_head is not None:
            terms["reference"] = self._term(hidden, reference_targets, reference_weights, reference_hidden[:, None],
                                            head, self.reference_head)
        else:
            terms["reference"] = hidden.new_zeros((), dtype=torch.float32) + 0.0 * hidden.sum()
        return terms
