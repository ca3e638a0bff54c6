"""The transformers backend: a decoding loop over a loaded causal LM, on any device torch runs on.

Prompts are grouped into micro-batches of similar length (sorted longest first, so an
out-of-memory error shows up on the first batch rather than after an hour), LEFT-padded so
every row's last prompt token sits in the final column, with position ids counted over real
tokens only: a padded row sees the same positions as it would alone, so batched greedy output
equals unbatched greedy output (up to floating-point ties).

The loop (`fic.backends.decoding`) is ours rather than `model.generate` for three reasons. It
keeps each row's keys and values after the call (`fic.backends.kv_reuse`), so the next turn of a
conversation feeds the model only its new tokens; each row samples from its own seed alone, so a
reply does not depend on its batch; and nothing from a checkpoint's `generation_config.json`
(top_k=50, repetition_penalty, ...) can change what is sampled. Each step records the chosen
token's log-prob under the raw logits, then samples from exactly softmax(logits / temperature)
cut to top_p, the distribution vLLM samples from (transformers' own temperature and top-p
warpers, in vLLM's order); greedy decoding is the argmax of the raw logits.

With its weights partitioned across processes (ZeRO-3, FSDP) the backend runs in lockstep: every
rank runs the same number of forward passes in each call, whatever its rows (see `generate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from fic.backends.decoding import (
    CHECK_EVERY,
    LOOPS,
    decode,
    decode_legacy,
    forward_kwargs,
    lockstep_wanted,
    real_positions,
)
from fic.backends.kv_reuse import (
    KV,
    KVStore,
    batch_rows,
    common_prefix_length,
    layer_kv,
    left_padded,
    shared_prefixes,
    spans_kv,
)
from fic.core import progress
from fic.core.errors import FicError
from fic.core.generation import (
    BackendConfig,
    Generation,
    SamplingParams,
    chat_by_generate,
    check_prompts,
    finish,
    request_seeds,
    stop_ids,
)
from fic.core.model import default_device, load_model, load_tokenizer
from fic.core.ranks import Ranks

# What one extra forward pass costs, in token reads: every weight is read once whatever the
# batch, which on the reference CPU takes about as long as computing 30-60 tokens.
FORWARD_PASS_COST = 64
# Cache room reserved for a reply up front; a longer reply doubles the storage as it goes.
FIRST_REPLY_SLICE = 256


def _grad_off(model: Any) -> Any:
    """inference_mode, except for a model whose weights DeepSpeed ZeRO-3 partitions (their
    parameters carry `ds_id`): ZeRO-3 gathers each weight for a forward and frees it after, and
    under inference_mode the freed weights come back as inference tensors, which a later
    `requires_grad_` (PEFT switching the adapters back on after the teacher's pass) refuses. There
    no_grad, which leaves them ordinary tensors."""
    first = next(iter(model.parameters()), None)
    return torch.no_grad() if first is not None and hasattr(first, "ds_id") else torch.inference_mode()


class HFBackend:
    """Generation with a loaded transformers causal LM. Build it from a model already in memory
    (the trainer's live policy, a test model) or from a config with `load_hf_backend`.

    `kv_reuse_mb` is the memory for keys and values kept between calls (see `fic.kv_reuse`);
    0 turns reuse off. They are forgotten whenever the model's weights change. `decode_loop` and
    `check_every`: see `BackendConfig`. `lockstep`: run every forward pass on every rank of the
    default process group (see `generate`); None turns it on where the weights are partitioned
    across ranks (`fic.backends.decoding.lockstep_wanted`)."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16, kv_reuse_mb: float = 0,
                 decode_loop: str = "fast", check_every: int = CHECK_EVERY, lockstep: bool | None = None):
        if decode_loop not in LOOPS:
            raise FicError(f"decode_loop must be one of {', '.join(LOOPS)}, got {decode_loop!r}", field="decode_loop")
        if check_every < 1:
            raise FicError(f"check_every must be at least 1, got {check_every}", field="check_every")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, max(1, int(batch_size))
        self.decode_loop, self.check_every, self.lockstep = decode_loop, int(check_every), lockstep
        # The checkpoint's generation_config may list more eos ids (Llama 3: eot, eom, eos).
        generation_config = getattr(model, "generation_config", None)
        self.stop_ids = stop_ids(tokenizer, generation_config)
        pad = getattr(tokenizer, "pad_token_id", None)
        # Any id works as padding (masked out, trimmed afterwards); an end-of-turn id is always there.
        self.pad_id = int(pad) if pad is not None else min(self.stop_ids)
        # Only full-attention layers (made GrowingLayers) can be spliced into a prefix, or take a
        # prepared 4-D mask; sliding-window, chunked or hybrid ones cannot.
        self.full_attention = all(isinstance(layer, GrowingLayer) for layer in new_cache(model, 1).layers)
        reusable = kv_reuse_mb > 0 and self.full_attention
        self.kv_store = KVStore(int(kv_reuse_mb * 2**20)) if reusable else None
        self.fed_tokens = 0  # prompt tokens run through the model so far (what reuse saves)

    def chat(self, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
        return chat_by_generate(self, conversations, params)

    def weights_changed(self) -> None:
        """Forget every stored key and value: the model was just updated (a trainer calls this
        after each optimizer step; fused optimizers change weights without a trace), or the calls
        before must not shape the ones after (VASD's held-out play before its next rollouts)."""
        if self.kv_store is not None:
            self.kv_store.clear()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Continue each prompt; one Generation each.

        In lockstep every rank must call this as often as the others (a rank with nothing to say
        in a turn calls it with no prompts). The ranks then agree on the number of micro-batches
        and, per micro-batch, on the number of prefill passes and of decoding steps; a rank short
        of any runs placeholder passes over a one-token row, so that every rank runs the same
        forward passes."""
        check_prompts(prompts)
        device = _model_device(self.model)
        in_lockstep = lockstep_wanted(self.model) if self.lockstep is None else self.lockstep
        ranks = Ranks.current() if in_lockstep else None
        if ranks is not None and not ranks.lockstep:
            ranks = None  # one process: nothing to agree with
        if ranks is not None and self.decode_loop == "legacy":
            raise FicError("the legacy decoding loop cannot run in lockstep; use decode_loop=fast",
                           field="decode_loop")
        batches = -(-len(prompts) // self.batch_size)
        if ranks is not None:
            batches = ranks.most(batches)
        if not batches:
            return []
        # Longest first: similar lengths share a batch (less padding) and OOM fails early.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
        results: list[Generation | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; restored below for a live training model
        if self.kv_store is not None:
            self.kv_store.check_weights(self.model)
        # Each row samples from its own seed: params.seeds, else params.seed + its index in the
        # call (`request_seeds`); with neither, from seeds drawn from torch's generator. The
        # legacy loop without per-prompt seeds reseeds torch's global generator instead, inside
        # fork_rng, which gives the caller its own state back afterwards.
        reseed = self.decode_loop == "legacy" and params.seeds is None and params.seed is not None \
            and params.temperature > 0
        seeds = None
        if params.seeds is not None or (params.seed is not None and self.decode_loop == "fast"):
            seeds = request_seeds(params, len(prompts))
        fork_devices = []
        if device.type == "cuda":
            fork_devices = [device.index if device.index is not None else torch.cuda.current_device()]
        try:
            with torch.random.fork_rng(devices=fork_devices, enabled=reseed), _grad_off(self.model):
                if reseed:
                    torch.manual_seed(params.seed)
                for start in range(0, batches * self.batch_size, self.batch_size):
                    batch = order[start:start + self.batch_size]
                    if not batch:
                        self._idle_batch(params, device, ranks)
                        continue
                    outputs = self._generate_batch([prompts[i] for i in batch], params, device,
                                                   None if seeds is None else [seeds[i] for i in batch], ranks)
                    for i, out in zip(batch, outputs):
                        results[i] = out
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, device: torch.device,
                        seeds: list[int] | None, ranks: Ranks | None) -> list[Generation]:
        plan = self._prefill_plan(prompts) if self.kv_store is not None else []
        passes, steps = len(plan), params.max_new_tokens
        if ranks is not None:
            passes, steps = ranks.most(passes), ranks.most(steps)
        for token_lists in plan:  # then every row feeds only its last prompt token
            self._feed(token_lists, device)
        for _ in range(passes - len(plan)):
            self._idle_forward(device)
        rows = self._assemble(prompts, params.max_new_tokens, device)
        keep_rows = self.kv_store is not None
        if self.decode_loop == "legacy":
            decoded = decode_legacy(self.model, rows.cache, rows.input_ids, rows.attention_mask, params,
                                    stops=self.stop_ids, pad_id=self.pad_id, keep_rows=keep_rows, seeds=seeds)
        else:
            decoded = decode(self.model, rows.cache, rows.input_ids, rows.attention_mask, params,
                             stops=self.stop_ids, pad_id=self.pad_id, keep_rows=keep_rows, seeds=seeds,
                             check_every=self.check_every, steps=steps, ranks=ranks,
                             full_attention=self.full_attention, padded=rows.padded)
        results = [finish(self.tokenizer, ids, lps, self.stop_ids)
                   for ids, lps in zip(decoded.ids.cpu().tolist(), decoded.logprobs.cpu().tolist())]
        # The heartbeat's count of tokens written since the loop last counted.
        progress.decoded(sum(len(g.token_ids) for g in results) - decoded.reported, 0)
        # The last reply token was sampled but never fed: its keys and values do not exist.
        self._keep(rows, [p + g.token_ids[:-1] for p, g in zip(prompts, results)], decoded.row_kvs)
        return results

    def _idle_batch(self, params: SamplingParams, device: torch.device, ranks: Ranks) -> None:
        """A micro-batch this rank does not have, in lockstep: the other ranks' prefill passes and
        decoding steps, run over a one-token placeholder row whose output is dropped."""
        passes, steps = ranks.most(0), ranks.most(params.max_new_tokens)
        for _ in range(passes):
            self._idle_forward(device)
        cache = new_cache(self.model, 1 + min(steps, FIRST_REPLY_SLICE))
        placeholder = torch.full((1, 1), self.pad_id, dtype=torch.long, device=device)
        decode(self.model, cache, placeholder, torch.ones_like(placeholder), SamplingParams(max_new_tokens=1),
               stops=self.stop_ids, pad_id=self.pad_id, check_every=self.check_every, steps=steps,
               ranks=ranks, padded=False, idle=True)

    def _idle_forward(self, device: torch.device) -> None:
        """One forward pass over a one-token placeholder row (lockstep: another rank's pass)."""
        placeholder = torch.full((1, 1), self.pad_id, dtype=torch.long, device=device)
        self.model(input_ids=placeholder, attention_mask=torch.ones_like(placeholder), use_cache=False)

    def _prefill_plan(self, prompts: list[list[int]]) -> list[list[list[int]]]:
        """The forward passes that put the keys and values of every prompt but its last token into
        the store, each a list of token lists to feed; planned before any runs, so that ranks in
        lockstep can agree on their number first.

        A prefix several prompts share (a system prompt, one task's tools in several views, N
        runs of one conversation) is fed once, shorter shared prefixes before the longer ones
        that extend them (`shared_prefixes`). The rest is fed in groups of similar length, each
        one forward pass, so that short rows are not padded to the longest (padding costs as much
        compute as real tokens; half of a turn's tokens were padding). What the plan feeds counts
        as stored for its later passes (the store keeps what is fed, within its budget)."""
        store = self.kv_store
        reused = [store.match(p)[1] for p in prompts]
        planned: list[list[int]] = []
        passes: list[list[list[int]]] = []

        def feed_grouped(token_lists: list[list[int]]) -> None:
            # + [0]: a whole stored list counts
            stored = [max([store.match(t + [0])[1]] + [common_prefix_length(f, t) for f in planned])
                      for t in token_lists]
            todo = [i for i, t in enumerate(token_lists) if stored[i] < len(t)]
            lengths = [len(token_lists[i]) - stored[i] for i in todo]
            passes.extend([token_lists[todo[j]] for j in group] for group in prefill_groups(lengths, FORWARD_PASS_COST))
            planned.extend(token_lists[i] for i in todo)

        pending = shared_prefixes(prompts, reused, FORWARD_PASS_COST)
        while pending:  # rounds: a prefix waits until the shorter shared prefix it extends is planned
            ready = [p for p in pending if not any(len(q) < len(p) and p[:len(q)] == q for q in pending)]
            feed_grouped(ready)
            pending = [p for p in pending if p not in ready]
        feed_grouped([p[:-1] for p in prompts])
        return passes

    def _feed(self, token_lists: list[list[int]], device: torch.device) -> None:
        """One forward pass over the rows, storing each row's keys and values; no sampling."""
        rows = self._assemble(token_lists, 0, device)
        self.model(input_ids=rows.input_ids, attention_mask=rows.attention_mask,
                   position_ids=real_positions(rows.attention_mask, rows.input_ids.shape[1]),
                   use_cache=True, **forward_kwargs(self.model, rows.cache))
        self._keep(rows, token_lists, batch_rows(layer_kv(rows.cache), range(len(token_lists))))

    def _assemble(self, token_lists: list[list[int]], extra: int, device: torch.device) -> _Rows:
        """Lay out a batch: each row's longest stored prefix (copied into a fresh cache with room
        for `extra` more positions), then the rest of its tokens, left-padded."""
        store = self.kv_store
        matches = [store.match(t) if store is not None else (None, 0) for t in token_lists]
        reused = [m for _, m in matches]
        fresh = [t[m:] for t, m in zip(token_lists, reused)]
        past, width = max(reused), max(len(f) for f in fresh)
        room = width + min(extra, FIRST_REPLY_SLICE)
        cache = new_cache(self.model, past + room)
        if past:  # reuse happens only with GrowingLayers: they take the stacked prefixes as storage
            prefixes = [store.entries[k].kv if k is not None else None for k, _ in matches]
            for layer, (keys, values) in zip(cache.layers, left_padded(prefixes, reused, room)):
                layer.adopt(keys, values, past)
        self.fed_tokens += sum(len(f) for f in fresh)
        input_ids = torch.full((len(token_lists), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(token_lists), past + width), dtype=torch.long)
        for row, (ids, m) in enumerate(zip(fresh, reused)):
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, past - m:past] = 1
            attention_mask[row, past + width - len(ids):] = 1
        return _Rows(cache, input_ids.to(device), attention_mask.to(device), matches, fresh, past, width,
                     padded=bool((attention_mask == 0).any()))  # read here, in host memory

    def _keep(self, rows: _Rows, token_lists: list[list[int]], row_kvs: list[KV] | None) -> None:
        """Store row i's keys and values for `token_lists[i]` (what it fed: its prompt, and for a
        generation its reply but the last token), and drop the entries rows continued in full.
        `row_kvs[i]` is row i's part of the batch cache, columns as laid out in `rows`."""
        if row_kvs is None:  # reuse is off
            return
        for row, tokens in enumerate(token_lists):
            reused = rows.matches[row][1]
            generated = len(tokens) - reused - len(rows.fresh[row])
            spans = [(rows.past - reused, rows.past),
                     (rows.past + rows.width - len(rows.fresh[row]), rows.past + rows.width + generated)]
            self.kv_store.put(tokens, spans_kv(row_kvs[row], spans))
        for key, m in rows.matches:
            entry = self.kv_store.entries.get(key) if key is not None else None
            if entry is not None and m == len(entry.tokens):
                self.kv_store.drop(key)


@dataclass
class _Rows:
    """A batch laid out by `HFBackend._assemble`. Columns of row i: [zeros | reused prefix]
    (`past` wide), [left padding | fresh tokens] (`width` wide), then what is generated."""

    cache: Any
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    matches: list[tuple[int | None, int]]  # (store key, reused length) per row
    fresh: list[list[int]]
    past: int
    width: int
    padded: bool  # some position is masked out


def prefill_groups(lengths: list[int], pass_cost: int) -> list[list[int]]:
    """Split rows into forward passes minimising padded tokens + `pass_cost` per pass.

    A pass costs (rows x its longest row) token reads; sorted by length, the best split is a
    run of consecutive rows per pass, found by dynamic programming over the split points.
    Returns groups of indices into `lengths`."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    best = [0] + [None] * len(order)  # best[j]: cost of the first j rows
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):  # rows i..j-1 in one pass, padded to the longest, lengths[order[i]]
            cost = best[i] + (j - i) * lengths[order[i]] + pass_cost
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def new_cache(model: Any, expected: int) -> Any:
    """An empty cache laid out for this model. When every layer is a plain full-attention one
    (the models whose keys and values can be reused), each becomes a `GrowingLayer` with room
    for `expected` positions: a `DynamicLayer` concatenates at every token, which re-copies the
    whole cache each step and took 40% of a lockstep rollout's time on a CPU."""
    cache = DynamicCache(config=model.config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer(expected) for _ in cache.layers]
    return cache


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer writing into storage that doubles when full (amortised
    constant work per token), sized at first for the positions a call expects: the prompt
    plus a first slice of the reply, not all of `max_new_tokens` that replies rarely reach."""

    def __init__(self, expected: int):
        super().__init__()
        self.capacity, self.length = max(1, expected), 0

    def adopt(self, key_storage: torch.Tensor, value_storage: torch.Tensor, length: int) -> None:
        """Start from storage whose first `length` positions are already written (no copy)."""
        self.key_storage, self.value_storage = key_storage, value_storage
        self.capacity, self.length = key_storage.shape[2], length
        self.device, self.is_initialized = key_storage.device, True
        self.keys, self.values = key_storage[:, :, :length], value_storage[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        end = self.length + key_states.shape[-2]
        if self.length == 0 or end > self.capacity:
            self.capacity = max(self.capacity, end) if self.length == 0 else max(2 * self.capacity, end)
            keys = key_states.new_empty(key_states.shape[:2] + (self.capacity, key_states.shape[-1]))
            values = value_states.new_empty(value_states.shape[:2] + (self.capacity, value_states.shape[-1]))
            if self.length:
                keys[:, :, :self.length] = self.keys
                values[:, :, :self.length] = self.values
            self.key_storage, self.value_storage = keys, values
            self.device, self.is_initialized = key_states.device, True
        self.key_storage[:, :, self.length:end] = key_states
        self.value_storage[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.key_storage[:, :, :end], self.value_storage[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self.key_storage, self.value_storage = self.key_storage[indices], self.value_storage[indices]
            self.keys = self.key_storage[:, :, :self.length]
            self.values = self.value_storage[:, :, :self.length]


def _model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def column_major_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Store every Linear weight column-major, for CPU decoding of an inference-only model.

    `F.linear(x, W)` multiplies by W transposed. With W row-major (as loaded) MKL takes its
    "NT" matrix-product path, which on AVX-512 CPUs is several times slower at the row counts
    of batched decoding (2-48 rows) than the "NN" path it takes when W's transpose is
    contiguous: on the reference machine a 16 x 576 by 576 x 1536 product took 0.75 ms
    against 0.16 ms, and a lockstep decoding step of 16 SmolLM2-135M conversations 220 ms
    against 110 ms. Large products (prefill) run at the same speed either way.

    The values are unchanged; only strides change. An output head tied to the input
    embedding gets its own copy, so that embedding lookups keep reading contiguous rows.
    Never apply this to a model being trained (optimizers and checkpoints expect the
    weights as loaded).
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.weight.stride(-1) == 1:
                column_major = module.weight.detach().t().contiguous().t()
                module.weight = torch.nn.Parameter(column_major, requires_grad=False)
    return model


def load_hf_backend(cfg: BackendConfig) -> HFBackend:
    """Load `cfg.model` with fic.core.model (dtype resolved for the device: bf16 where supported).

    The backend owns this model (nothing trains it), so keys and values are reused between
    calls within `cfg.kv_reuse_mb`, and on a CPU its weights are laid out for decoding with
    `column_major_linears`."""

    device = default_device() if cfg.device == "auto" else cfg.device
    # A checkpoint's model/ or a LoRA adapter (a run's final/, a checkpoint's) loads over its base.
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code, adapter_ok=True)
    model = load_model(cfg.model, dtype=cfg.dtype, device=device,
                       trust_remote_code=cfg.trust_remote_code, adapter_ok=True)
    if _model_device(model).type == "cpu":
        column_major_linears(model)
    return HFBackend(model, tokenizer, batch_size=cfg.batch_size, kv_reuse_mb=cfg.kv_reuse_mb,
                     decode_loop=cfg.decode_loop, check_every=cfg.check_every)
