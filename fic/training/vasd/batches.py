"""Rows as tensors: student rows collated into a micro-batch (`collate_rows`), the attention of
rows with branches (`branch_mask`), a term's count in a micro-batch (`batch_counts`), and the
hidden states a no-gradient network gives at chosen positions of some sequences (`hidden_at`)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from fic.training.data import IGNORE, padded_width
from fic.training.losses import causal_lm, decoder_and_head
from fic.training.vasd.rows import add_branch, common_prefix
from fic.training.vasd.term import Term


def packed_sequences(sequences: Sequence[Sequence[int]], min_shared: float = 0.5
                     ) -> tuple[list[dict], list[tuple[int, int, int]]]:
    """Sequences in order as rows with branches (see `fic.training.vasd.rows.shared_prefix_rows`):
    a sequence that shares at least `min_shared` of its ids with the trunk of the row before it
    (the first sequence there) rides on that row as a branch, else it starts a row. Also, for
    each sequence, (row, shared, start): its token t sits at index t of that row when t < shared,
    else at start + t - shared. The bar keeps rows short: sequences of one rollout (a teacher's
    prompts, one system prompt and a few words apart) share, different tasks (a common preamble)
    do not."""
    rows: list[dict] = []
    where, trunk = [], 0
    for ids in sequences:
        shared = common_prefix(ids, rows[-1]["input_ids"][:trunk]) if rows else 0
        if shared and shared >= min_shared * len(ids):
            where.append((len(rows) - 1, shared, len(rows[-1]["input_ids"])))
            add_branch(rows[-1], ids, shared)
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


def collate_rows(rows: Sequence[dict], pad_id: int, multiple: int = 0, names: Sequence[str] = ()) -> dict:
    """Right-pad rows (`fic.training.vasd.rows`) into one batch (up to a multiple of `multiple`):
    the ids, the padding mask, and for each term of `names` its targets and weights
    (`batch["targets"][name]`, `batch["weights"][name]`; untrained where a row does not hold it);
    where any row has branches, every row's positions and segments."""
    width = padded_width((len(r["input_ids"]) for r in rows), multiple)
    batch: dict[str, Any] = {"input_ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
                             "attention_mask": torch.zeros((len(rows), width), dtype=torch.long)}
    if names:
        batch["targets"] = {name: torch.full((len(rows), width), IGNORE, dtype=torch.long) for name in names}
        batch["weights"] = {name: torch.zeros((len(rows), width), dtype=torch.float32) for name in names}
    branched = any("segments" in r for r in rows)
    if branched:
        batch["position_ids"] = torch.zeros((len(rows), width), dtype=torch.long)
        batch["segments"] = torch.full((len(rows), width), -1, dtype=torch.long)
        batch["limits"] = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        batch["attention_mask"][i, :n] = 1
        if branched and "segments" not in row:
            row = {**row, "position_ids": list(range(n)), "segments": [0] * n, "limits": [0] * n}
        for key in ("input_ids", "position_ids", "segments", "limits"):
            if key in row and key in batch:
                batch[key][i, :n] = torch.tensor(row[key], dtype=batch[key].dtype)
        for name in names:
            if name in row.get("targets", {}):
                batch["targets"][name][i, :n] = torch.tensor(row["targets"][name], dtype=torch.long)
                batch["weights"][name][i, :n] = torch.tensor(row["weights"][name], dtype=torch.float32)
    return batch


def batch_counts(batch: dict, terms: Sequence[Term]) -> dict[str, float]:
    """Each term's count in a collated micro-batch (its total weight, or its positions where its
    weights are signed), and the batch's real tokens."""
    counts = {term.name: float(batch["weights"][term.name].sum()) if term.per == "weight" else
              float((batch["targets"][term.name] != IGNORE).sum()) for term in terms}
    return {**counts, "tokens": float(batch["attention_mask"].sum())}


def hidden_at(net: torch.nn.Module, sequences: Sequence[list[int]], positions: Sequence[Sequence[int]],
              pad_id: int, device: Any, multiple: int = 0, share_prefixes: bool = False) -> torch.Tensor:
    """Hidden states of `net` (no gradient) at the given positions of each sequence, rows in
    order: sequence by sequence, positions as listed. One forward pass, right-padded (up to a
    multiple of `multiple`); with `share_prefixes`, sequences that start like the one before them
    ride on its row as branches (`packed_sequences`), the same hidden states from fewer positions.
    With no sequence at all the forward still runs, on one padding token: under ZeRO-3 a
    forward gathers each layer's weights with every rank, so every rank runs the same passes."""
    body, _ = decoder_and_head(net)
    given = bool(sequences)
    if not given:
        sequences, positions = [[pad_id]], [[]]
    if share_prefixes:
        rows, where = packed_sequences(sequences)
    else:
        rows, where = [{"input_ids": list(s)} for s in sequences], [(i, len(s), 0) for i, s in enumerate(sequences)]
    batch = {k: v.to(device) for k, v in collate_rows(rows, pad_id, multiple).items()}
    with torch.no_grad():
        hidden = body(input_ids=batch["input_ids"], use_cache=False, **body_inputs(batch)).last_hidden_state
    if not given:  # in the weights' dtype, as before any forward: the loss's heads read these rows
        return torch.zeros((0, causal_lm(net).config.hidden_size), device=device, dtype=next(net.parameters()).dtype)
    picked = [hidden[r, [t if t < shared else start + t - shared for t in p]]
              for (r, shared, start), p in zip(where, positions) if len(p)]
    return torch.cat(picked) if picked else hidden.new_zeros((0, hidden.shape[-1]))
