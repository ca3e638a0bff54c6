"""Keys and values kept between generation calls, so that a conversation's next turn reads only
its new tokens.

A multi-turn rollout calls the backend once per turn with the whole conversation so far. Without
reuse every call runs the model over every earlier turn again: a conversation of T turns costs
O(T^2) prompt tokens, and on a CPU prompt reading does not get faster with batching (it is
already compute-bound), so it dominated lockstep rollouts. The hf backend therefore keeps, per
finished row, the keys and values of `prompt + reply[:-1]` (the last reply token was sampled but
never fed to the model) in a `KVStore`, and a later prompt that starts with those tokens feeds
the model only what follows.

Matching is by longest common token prefix, not by conversation id: the simulator builds each
turn by appending token ids (never re-tokenising), so a conversation's next prompt starts with
exactly the stored tokens, and unrelated prompts that share a system prompt reuse that too.
Entries are dropped least-recently-used first past a memory budget, dropped when a row continues
them in full (the longer entry it leaves behind replaces them), and all dropped when the model's
weights change (a live policy being trained), since the stored values would then be stale.

Only models whose every layer caches every position (plain full-attention layers: Llama,
Qwen2/3, SmolLM, OLMo, Phi-3 without sliding window, ...) can reuse; for others the backend
reads whole prompts as before.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of one row, (heads, length, dim)


@dataclass
class Entry:
    tokens: np.ndarray  # the token ids whose keys and values are stored
    kv: KV
    nbytes: int


class KVStore:
    """Per-row keys and values of earlier calls, found by token prefix, within `budget_bytes`."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self.nbytes = 0
        self.weights_version: object = None
        self._next_key = 0

    def match(self, prompt: list[int]) -> tuple[int | None, int]:
        """(key, length) of the entry sharing the longest prefix with `prompt`, capped at
        len(prompt) - 1 so that at least one token is fed (its logits give the first reply
        token); (None, 0) when nothing is shared."""
        ids = np.asarray(prompt, dtype=np.int64)
        best_key, best = None, 0
        for key, entry in self.entries.items():
            n = min(len(entry.tokens), len(ids) - 1)
            if n <= best:
                continue
            same = entry.tokens[:n] == ids[:n]
            shared = n if same.all() else int(np.argmin(same))
            if shared > best:
                best_key, best = key, shared
        if best_key is not None:
            self.entries.move_to_end(best_key)
        return best_key, best

    def put(self, tokens: list[int], kv: KV) -> None:
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.budget_bytes:
            return
        self.entries[self._next_key] = Entry(np.asarray(tokens, dtype=np.int64), kv, nbytes)
        self._next_key += 1
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes:
            _, oldest = self.entries.popitem(last=False)
            self.nbytes -= oldest.nbytes

    def drop(self, key: int) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry.nbytes

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0

    def check_weights(self, model: torch.nn.Module) -> None:
        """Forget everything if any parameter was replaced or changed in place since the last call.

        A safety net only: plain in-place updates bump a tensor's version counter, but fused
        optimizer kernels (AdamW(fused=True), the default in FiC's trainers) do not, so a trainer
        that samples from its live model must also call `HFBackend.weights_changed()` after each
        optimizer step."""
        version = tuple((id(p), p._version) for p in model.parameters())
        if version != self.weights_version:
            self.clear()
            self.weights_version = version


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    same = np.asarray(a[:n], dtype=np.int64) == np.asarray(b[:n], dtype=np.int64)
    return n if same.all() else int(np.argmin(same))


def shared_prefixes(prompts: list[list[int]], stored: list[int], min_saving: int) -> list[list[int]]:
    """Prefixes that two or more prompts share beyond what each already has stored, worth one
    forward pass of their own: feeding such a prefix once saves (rows - 1) x its new tokens.

    Sorting the prompts puts prompts with a common prefix next to each other, so a prompt's
    longest prefix shared with any other is the longer of its common prefixes with its two
    neighbours (capped one token short of the prompt: a row must feed a token of its own). The
    same task in several views shares its system prompt and tools; N runs of one conversation
    share everything. Returned shortest first, so that a longer prefix can reuse a shorter one
    once that is stored."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    neighbour = [common_prefix_length(prompts[order[k]], prompts[order[k + 1]]) for k in range(len(order) - 1)]
    rows_of: dict[tuple, list[int]] = {}
    for k, i in enumerate(order):
        length = min(max(neighbour[k - 1] if k else 0, neighbour[k] if k < len(neighbour) else 0),
                     len(prompts[i]) - 1)
        if length > stored[i]:
            rows_of.setdefault(tuple(prompts[i][:length]), []).append(i)
    chosen = []
    for prefix in rows_of:
        sharing = [i for i, p in enumerate(prompts) if p[:len(prefix)] == list(prefix)]
        saving = (len(sharing) - 1) * (len(prefix) - max(stored[i] for i in sharing))
        if saving >= min_saving:
            chosen.append(list(prefix))
    return sorted(chosen, key=len)


def layer_kv(cache) -> KV:
    """Per-layer (keys, values) of a transformers cache, (batch, heads, length, dim) each."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def left_padded(prefixes: list[KV | None], lengths: list[int], room: int = 0) -> KV:
    """Stack row prefixes into one batch max(lengths) wide: row i's first lengths[i] positions
    end at column max(lengths), the columns before them are zeros (masked out by the caller).
    The tensors have `room` more columns after those, left unwritten, for the cache to grow into."""
    width = max(lengths)
    template = next(p for p, n in zip(prefixes, lengths) if n)
    batch: KV = []
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_empty((len(prefixes), k0.shape[0], width + room, k0.shape[2]))
        values = v0.new_empty((len(prefixes), v0.shape[0], width + room, v0.shape[2]))
        keys[:, :, :width] = 0
        values[:, :, :width] = 0
        for row, (prefix, n) in enumerate(zip(prefixes, lengths)):
            if n:
                keys[row, :, width - n:width] = prefix[layer][0][:, :n]
                values[row, :, width - n:width] = prefix[layer][1][:, :n]
        batch.append((keys, values))
    return batch


def batch_rows(batch: KV, rows, copy: bool = False) -> list[KV]:
    """Each listed row's part of a batch (views, or copies that outlive the batch storage)."""
    if copy:
        return [[(keys[row].clone(), values[row].clone()) for keys, values in batch] for row in rows]
    return [[(keys[row], values[row]) for keys, values in batch] for row in rows]


def spans_kv(row: KV, spans: list[tuple[int, int]]) -> KV:
    """One row's keys and values at the columns [start, end) of each span, copied (so that the
    batch they came from can be freed)."""
    return [(torch.cat([keys[:, a:b] for a, b in spans], dim=1), torch.cat([values[:, a:b] for a, b in spans], dim=1))
            for keys, values in row]
