"""Conversations as training examples: token ids, next-token targets, collation, visiting order.

A conversation is rendered once with the chat template (`fic.core.chat.render_chat`); its targets
come from token positions in that rendering, never from re-tokenised text. `targets[t]` is the
id at t+1 where that token is trained and `IGNORE` elsewhere, so the loss at position t needs
only the hidden state at t.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from fic.core.chat import record_error, render_chat
from fic.core.errors import FicError
from fic.core.records import read_records

IGNORE = -100
TARGET_KINDS = ("assistant", "non_final")


@dataclass
class Example:
    input_ids: list[int]
    targets: list[int]  # targets[t] is the id at t+1 when that token is trained, else IGNORE

    @property
    def n_targets(self) -> int:
        return sum(t != IGNORE for t in self.targets)


def shift_targets(input_ids: Sequence[int], mask: Sequence[int]) -> list[int]:
    """Next-token targets: position t predicts token t+1, trained where the mask marks t+1."""
    return [input_ids[t + 1] if mask[t + 1] else IGNORE for t in range(len(input_ids) - 1)] + [IGNORE]


def render_examples(records: Sequence[dict], tokenizer: Any, max_seq_len: int, source: str = "corpus",
                    progress: bool = True, targets: str = "assistant") -> tuple[list[Example], int]:
    """Render corpus records to examples; return them and how many were too long to use.

    `targets`: `assistant` trains every trained assistant turn (SFT); `non_final` only the
    trained turns before the last one (the deferrals and asks a VASD anchor keeps), and
    records without such a turn (single-turn conversations) are left out rather than refused.
    """
    from tqdm import tqdm


    if targets not in TARGET_KINDS:
        raise ValueError(f"targets must be one of {TARGET_KINDS}, got {targets!r}")
    examples, too_long = [], 0
    for number, record in enumerate(tqdm(records, desc="rendering", unit="conv", disable=not progress or None),
                                    start=1):
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages:
            raise FicError("expected a non-empty list of chat messages", path=source, record=number,
                           field="messages")
        try:
            rendered = render_chat(tokenizer, messages)
        except FicError as err:
            raise record_error(err, source, number) from None
        mask = rendered.assistant_mask
        if targets == "non_final":
            mask = [a and not f for a, f in zip(rendered.assistant_mask, rendered.final_mask)]
        shifted = shift_targets(rendered.input_ids, mask)
        if all(t == IGNORE for t in shifted):
            if targets == "non_final":
                continue
            raise FicError("no trained assistant tokens (a record needs an assistant turn with train: true)",
                           path=source, record=number, field="messages")
        if len(rendered.input_ids) > max_seq_len:
            too_long += 1
            continue
        examples.append(Example(rendered.input_ids, shifted))
    return examples, too_long


def load_corpus(path: str, tokenizer: Any, max_seq_len: int, progress: bool = True, targets: str = "assistant",
                length_key: str = "data.max_seq_len") -> tuple[list[Example], dict]:
    """Render every record of a corpus file; return the examples and counts for the model card.
    `length_key` names the setting that holds `max_seq_len`, for the error when nothing fits."""
    records = read_records(path)
    examples, too_long = render_examples(records, tokenizer, max_seq_len, path, progress, targets)
    if not examples:
        raise FicError(f"none of the {len(records)} records can be used: {too_long} are longer than "
                       f"{length_key}={max_seq_len} tokens", path=path)
    stats = {"records": len(records), "used": len(examples), "skipped_too_long": too_long,
             "target_tokens": sum(e.n_targets for e in examples), "tokens": sum(len(e.input_ids) for e in examples)}
    return examples, stats


def padded_width(lengths: Iterable[int], multiple: int = 0) -> int:
    """The longest length, rounded up to a multiple of `multiple` (0: not rounded)."""
    width = max(lengths)
    return -(-width // multiple) * multiple if multiple else width


def collate(examples: Sequence[Example], pad_id: int, multiple: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad to the longest conversation of the micro-batch (up to a multiple of `multiple`)."""
    width = padded_width((len(e.input_ids) for e in examples), multiple)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    targets = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.tensor(e.input_ids)
        targets[row, :n] = torch.tensor(e.targets)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "targets": targets}


class DataOrder:
    """Which records micro-batch k of a rank holds: a pure function of (seed, k), so the data
    position of a checkpoint is just the number of micro-batches consumed.

    The data is read as an endless stream of per-epoch permutations; global micro-step k
    takes the next `micro_batch_size * world` records of the stream, rank r the r-th slice.

    With `lengths` and `bucket` > 0 each epoch's permutation is cut into windows of `bucket`
    global micro-steps, each window sorted by length and its micro-steps put back in a random
    order: a micro-batch then holds conversations of similar length, so little of it is
    padding, while every record is still read once an epoch in an order that is a function of
    the seed.
    """

    def __init__(self, n: int, micro_batch_size: int, world: int, rank: int, seed: int, shuffle: bool,
                 lengths: Sequence[int] | None = None, bucket: int = 0):
        self.n, self.mbs, self.world, self.rank = n, micro_batch_size, world, rank
        self.seed, self.shuffle = seed, shuffle
        self.lengths = None if lengths is None or not bucket else np.asarray(lengths)
        self.bucket = bucket

    @functools.lru_cache(maxsize=4)  # noqa: B019 (one order per run, which lives as long as its cache)
    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.n)
        if self.lengths is None:
            return order
        step = self.mbs * self.world
        window = step * self.bucket
        out = []
        for start in range(0, self.n, window):
            part = order[start:start + window]
            part = part[np.argsort(self.lengths[part], kind="stable")]
            groups = [part[i:i + step] for i in range(0, len(part), step)]
            out += [groups[g] for g in rng.permutation(len(groups))]
        return np.concatenate(out)

    def micro_batch(self, k: int) -> list[int]:
        start = (k * self.world + self.rank) * self.mbs
        return [int(self._permutation(p // self.n)[p % self.n]) for p in range(start, start + self.mbs)]

    def epoch_at(self, k: int) -> float:
        return k * self.world * self.mbs / self.n
