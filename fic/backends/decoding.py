"""The hf backend's decoding loop: one forward pass a step for a whole batch, with the host out of
the way.

A GPU runs ahead of the Python that launches its work only as long as that Python never waits for
a result. Every `int()`, `bool()`, `.item()`, `.tolist()`, `nonzero` or boolean-mask index on a
device tensor makes the host wait until the device has caught up, and a decoding step of a 3B
model is a few milliseconds of device work: a wait per step leaves the device idle for the next
step's launch overhead. So the loop (`decode`) decides everything it can on the device and reads
back to the host once every `check_every` steps:

- stop conditions are a device tensor (`finished`), updated each step; the host reads it (with
  each row's length, one transfer) only at a check, to stop when every row is done, drop finished
  rows from the batch (a quarter of it at least: each departure copies the cache once), and
  report progress. Rows that finish between checks write padding until the check;
- every row samples in one batched operation, the Gumbel-max way (`sample`): the argmax of its
  temperature- and top-p-filtered scores plus Gumbel noise, token t's noise at step s a
  counter-based hash of (row i's seed, s, t) (`row_keys`, `token_hashes`). No generator state is
  carried, so a row's reply depends on its seed alone, never on the rows beside it or on the
  batch it was put in. (Inverting one uniform through the cumulative distribution would read one
  random number a row instead of one a token, but it moves with every last-bit change of every
  probability before the chosen token: on a tiny random model's near-uniform distribution over
  49,152 tokens a reply changed with the batch's shape; the Gumbel maximum moves only on a near
  tie of the top two.) Greedy decoding is the argmax of the raw logits, as before;
- the attention mask and the position ids are laid out once per call for every step the call may
  take; each step reads a slice. For models whose every layer attends to every position the mask
  is handed to the model already in its 4-D form (transformers would otherwise check a 2-D mask
  for padding on the host at every step).

Lockstep (`ranks`, a `fic.core.ranks.Ranks`): when the model's weights are partitioned across
processes (DeepSpeed ZeRO-3, FSDP), every forward pass is a collective and every rank must run the
same number of them. The loop then agrees on its number of steps with the other ranks: at each
check, right after its one read, it asks the ranks whether any is still decoding (`Ranks.any`, one
all-reduce of one number every `check_every` steps), and a rank whose rows are done keeps taking
idle steps until none is.

`decode_legacy` is the loop as it was before (a host read every step, one `torch.multinomial`
per row with a generator of its own), kept so that `fic bench decode` can compare both in one
run (`HFBackend(decode_loop="legacy")`); it does not take part in lockstep.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, NamedTuple

import torch
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from fic.backends.kv_reuse import KV, batch_rows, layer_kv
from fic.core import progress
from fic.core.generation import SamplingParams
from fic.core.ranks import Ranks

# Steps between two reads of the device. At least 8 keeps the loop at one host wait every 8
# steps or fewer; more would leave finished rows and finished batches running longer (up to
# check_every - 1 wasted steps a call). Chosen by measurement (docs/performance.md).
CHECK_EVERY = 8
LOOPS = ("fast", "legacy")
MASK32 = 0xFFFFFFFF


def lockstep_wanted(model: Any) -> bool:
    """Whether this process's model runs its forward passes as collectives: torch.distributed is
    up with more than one process and the weights are partitioned across them (ZeRO-3 marks its
    parameters with `ds_id`; FSDP2 makes them DTensors; FSDP1 wraps modules). Under DDP or ZeRO-2
    each rank holds the whole model and decodes on its own."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    first = next(iter(model.parameters()), None)
    if first is not None and (hasattr(first, "ds_id") or type(first).__name__ == "DTensor"):
        return True
    return any(type(module).__name__ == "FullyShardedDataParallel" for module in model.modules())


class Decoded(NamedTuple):
    ids: torch.Tensor             # (rows, steps), padded with the pad id after a row's stop id
    logprobs: torch.Tensor        # (rows, steps) raw log-probs of those ids
    row_kvs: list[KV] | None      # each row's keys and values when it left the batch (keep_rows)
    reported: int                 # tokens already counted with `progress.decoded`


def decode(model: Any, cache: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
           params: SamplingParams, *, stops: frozenset[int], pad_id: int, keep_rows: bool = False,
           seeds: list[int] | None = None, check_every: int = CHECK_EVERY, steps: int | None = None,
           ranks: Ranks | None = None, full_attention: bool = False, padded: bool = True,
           idle: bool = False) -> Decoded:
    """Feed `input_ids` after what `cache` already holds (`attention_mask` covers both), then
    sample up to `params.max_new_tokens` tokens per row until every row has written a stop id.
    Row i samples from `seeds[i]` alone (None: seeds drawn from torch's global generator).

    `steps`: the steps this call may take, `params.max_new_tokens` or more (lockstep: the
    largest over the ranks; a row stops writing at its own limit). `ranks`: take steps until no
    rank is decoding (None: this process alone). `full_attention`: every layer
    attends to every cached position, so the mask can be passed in 4-D form. `padded`: some
    position of `attention_mask` is 0 (the caller knows it without asking the device); without
    padding no mask is passed at all. `idle`: the rows are placeholders (a rank with nothing to
    decode in lockstep), finished from the start."""
    rows, width = input_ids.shape
    device = input_ids.device
    own = params.max_new_tokens
    steps = own if steps is None else max(steps, own)
    seen = attention_mask.shape[1]  # cached positions + this call's fed tokens
    mask = attention_mask.new_ones((rows, seen + steps))  # every step's mask, laid out once
    mask[:, :seen] = attention_mask
    if not padded:  # transformers' own causal masking, and nothing to check
        first_mask, step_mask = None, None
    elif full_attention:
        first_mask, step_mask = _mask_4d(model, mask[:, :seen], width), _mask_4d(model, mask, 1)
    else:
        first_mask, step_mask = mask[:, :seen], mask
    positions = real_positions(attention_mask, width)
    later_positions = positions[:, -1:] + torch.arange(1, steps + 1, device=device)
    keys, noise = None, None
    if params.temperature > 0:
        keys = row_keys(seeds if seeds is not None else torch.randint(2**62, (rows,)).tolist(), steps, device)
    warpers = logits_warpers(params)
    stop_ids = torch.tensor(sorted(stops), device=device)

    out_ids = torch.full((rows, own), pad_id, dtype=torch.long, device=device)
    out_logprobs = torch.zeros((rows, own), dtype=torch.float32, device=device)
    ids, logprobs = out_ids, out_logprobs  # the batch's rows: out_* itself until a row leaves
    row_kvs: list[KV] | None = [[] for _ in range(rows)] if keep_rows else None
    active = list(range(rows))  # original row of each batch row (host side)
    finished = torch.full((rows,), idle, dtype=torch.bool, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)  # tokens each row has written
    reported, in_batch, step_ids = 0, 0, input_ids  # tokens counted; of those, by rows still in the batch
    for step in range(steps):
        if step == 0:
            out = model(input_ids=step_ids, attention_mask=first_mask, position_ids=positions,
                        use_cache=True, **forward_kwargs(model, cache))
        else:
            out = model(input_ids=step_ids, attention_mask=None if step_mask is None else step_mask[..., :seen + step],
                        position_ids=later_positions[:, step - 1:step], use_cache=True,
                        **forward_kwargs(model, cache))
        scores = out.logits[:, -1, :].float()
        if keys is not None and noise is None:
            noise = token_hashes(scores.shape[-1], device)
        chosen = sample(scores, warpers, None if keys is None else keys[:, step], noise)
        chosen = chosen.masked_fill(finished, pad_id)
        if step < own:
            ids[:, step] = chosen
            logprobs[:, step] = scores.gather(-1, chosen[:, None])[:, 0] - scores.logsumexp(-1)
        lengths += ~finished
        finished |= (chosen[:, None] == stop_ids).any(-1)
        if step + 1 >= own:
            finished.fill_(True)  # at its own limit: idle steps only from here
        if step + 1 == steps:
            break
        if (step + 1) % check_every:
            step_ids = chosen[:, None]
            continue
        # The loop's one host read: which rows are done, how far each got.
        host = torch.cat([finished.long(), lengths]).tolist()
        done, row_lengths = host[:len(active)], host[len(active):]
        progress.decoded(sum(row_lengths) - in_batch, len(done) - sum(done))
        reported, in_batch = reported + sum(row_lengths) - in_batch, sum(row_lengths)
        writing = not all(done)
        if ranks is not None:
            writing = ranks.any(writing)
        if not writing:
            break
        staying = [k for k, d in enumerate(done) if not d] or [0]  # lockstep: an idle row stays
        if sum(done) >= max(1, len(active) // 4) and len(staying) < len(active):
            leaving = [k for k in range(len(active)) if k not in staying]
            if row_kvs is not None:  # copied: the batch storage is about to be rebuilt without them
                for k, kv in zip(leaving, batch_rows(layer_kv(cache), leaving, copy=True)):
                    row_kvs[active[k]] = kv
            if ids is not out_ids:
                gone = torch.tensor([active[k] for k in leaving], device=device)
                left = torch.tensor(leaving, device=device)
                out_ids[gone], out_logprobs[gone] = ids[left], logprobs[left]
            keep = torch.tensor(staying, device=device)
            cache.batch_select_indices(keep)
            ids, logprobs, finished, lengths = ids[keep], logprobs[keep], finished[keep], lengths[keep]
            later_positions, chosen = later_positions[keep], chosen[keep]
            step_mask = None if step_mask is None else step_mask[keep]
            keys = None if keys is None else keys[keep]
            active = [active[k] for k in staying]
            in_batch -= sum(row_lengths[k] for k in leaving)
        step_ids = chosen[:, None]
    if ids is not out_ids:
        rest = torch.tensor(active, device=device)
        out_ids[rest], out_logprobs[rest] = ids, logprobs
    if row_kvs is not None:
        for row, kv in zip(active, batch_rows(layer_kv(cache), range(len(active)))):
            row_kvs[row] = kv
    taken = min(step + 1, own)
    return Decoded(out_ids[:, :taken], out_logprobs[:, :taken], row_kvs, reported)


def sample(scores: torch.Tensor, warpers: list, keys: torch.Tensor | None,
           token_hash: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row: the argmax of `scores` (`keys` None), else the argmax of the warped
    scores plus Gumbel noise, -log(-log(u)) with u a hash of (the row's key this step, the token):
    a draw from softmax(warped scores). `token_hash`: `token_hashes` of the vocabulary."""
    if keys is None:
        return scores.argmax(dim=-1)
    for warper in warpers:
        scores = warper(None, scores)
    bits = _mix32(token_hash[None, :] ^ keys[:, None])
    uniform = (bits >> 9).float().add_(0.5).mul_(2.0**-23)  # 23 bits: exact in float32, never 0 or 1
    return scores.sub(uniform.log_().neg_().log_()).argmax(dim=-1)


def row_keys(seeds: list[int], steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(rows, steps) 32-bit keys in int64: entry (i, s) is a function of (seeds[i], s) only, a
    keyed bijection of the step counter (three rounds of `_mix32`, the seed's two 32-bit halves
    mixed in between), so a row never repeats a key within 2^32 steps and rows with different seeds
    draw unrelated ones. Computed once per call, on the device."""
    key = [seed % 2**64 for seed in seeds]
    low = torch.tensor([k & MASK32 for k in key], dtype=torch.long, device=device)[:, None]
    high = torch.tensor([k >> 32 for k in key], dtype=torch.long, device=device)[:, None]
    counter = torch.arange(steps, dtype=torch.long, device=device)[None, :]
    return _mix32(_mix32(_mix32(counter ^ 0x9E3779B9) ^ low) ^ high)


def token_hashes(vocabulary: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Each token id hashed once, so that a row's key mixed with it (`sample`) gives tokens
    unrelated noise (a key XORed with the bare ids would only permute two rows' noise)."""
    return _mix32(torch.arange(vocabulary, dtype=torch.long, device=device) ^ 0x7F4A7C15)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 tensors, in place (pass a tensor of its own): Chris Wellons'
    two-multiply shape (shift-xor, multiply, shift-xor, multiply, shift-xor) with his
    hash-prospector constants 0x21f0aaad and 0x735a2d97, both under 2^31, so that no product of a
    32-bit value leaves int64. In place because it runs over every token of every row each step."""
    x ^= x >> 16
    x.mul_(0x21F0AAAD).bitwise_and_(MASK32)
    x ^= x >> 15
    x.mul_(0x735A2D97).bitwise_and_(MASK32)
    x ^= x >> 15
    return x


def logits_warpers(params: SamplingParams) -> list:
    """transformers' temperature and top-p warpers, in vLLM's order (none for greedy)."""
    warpers = []
    if params.temperature > 0:
        if params.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.top_p < 1.0:
            warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


def _mask_4d(model: Any, mask: torch.Tensor, queries: int) -> torch.Tensor:
    """The 2-D padding mask of the last `queries` positions in the 4-D form the model's attention
    takes (causal within them), so that transformers passes it through as it is instead of
    checking the 2-D mask for padding on the host. The same tensor transformers would build; only
    sdpa (boolean) and eager (additive) attention are known to take it, others get the 2-D mask."""
    kind = getattr(model.config, "_attn_implementation", None)
    if kind not in ("sdpa", "eager"):
        return mask
    seen = mask.shape[1]
    allowed = mask.bool()[:, None, None, :]
    if queries > 1:
        key = torch.arange(seen, device=mask.device)
        query = torch.arange(seen - queries, seen, device=mask.device)
        allowed = allowed & (key[None, :] <= query[:, None])
    if kind == "sdpa":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill(~allowed, torch.finfo(dtype).min)


def decode_legacy(model: Any, cache: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  params: SamplingParams, *, stops: frozenset[int], pad_id: int,
                  keep_rows: bool = False, seeds: list[int] | None = None) -> Decoded:
    """The loop before `decode` (kept for comparison): the same outputs for greedy decoding; with
    `seeds`, row i samples from a `torch.Generator` seeded `seeds[i]`, one `multinomial` per row
    per step, else one `multinomial` for the batch from torch's global generator. It reads the
    device every step, and drops finished rows once they are a quarter of the batch."""
    warpers = logits_warpers(params)
    rows, device = input_ids.shape[0], input_ids.device
    generators = None if seeds is None or params.temperature == 0 else \
        [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
    stop_tensor = torch.tensor(sorted(stops), device=device)
    out_ids = torch.full((rows, params.max_new_tokens), pad_id, dtype=torch.long, device=device)
    out_logprobs = torch.zeros((rows, params.max_new_tokens), dtype=torch.float32, device=device)
    row_kvs: list[KV] | None = [[] for _ in range(rows)] if keep_rows else None
    active = torch.arange(rows, device=device)  # original row of each batch row
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    positions = real_positions(attention_mask, input_ids.shape[1])
    step_ids, steps, writing, reported = input_ids, 0, rows, 0
    for step in range(params.max_new_tokens):
        out = model(input_ids=step_ids, attention_mask=attention_mask, position_ids=positions,
                    use_cache=True, **forward_kwargs(model, cache))
        scores = out.logits[:, -1, :].float()
        raw = torch.log_softmax(scores, dim=-1)
        if params.temperature > 0:
            for warper in warpers:
                scores = warper(None, scores)
            probs = torch.softmax(scores, dim=-1)
            if generators is None:
                chosen = torch.multinomial(probs, num_samples=1)
            else:  # one draw from each row's own generator (`active` maps batch rows to rows)
                chosen = torch.stack([torch.multinomial(probs[k], 1, generator=generators[row])
                                      for k, row in enumerate(active.tolist())])
        else:
            chosen = scores.argmax(dim=-1, keepdim=True)
        chosen = chosen.masked_fill(finished[:, None], pad_id)
        out_ids[active, step] = chosen[:, 0]
        out_logprobs[active, step] = raw.gather(-1, chosen)[:, 0]
        finished |= torch.isin(chosen[:, 0], stop_tensor)
        steps = step + 1
        done_rows = int(finished.sum())
        progress.decoded(writing, len(active) - done_rows)  # the heartbeat's rows and tokens
        reported, writing = reported + writing, len(active) - done_rows
        if done_rows == len(active) or steps == params.max_new_tokens:
            break
        if done_rows >= max(1, len(active) // 4):
            if row_kvs is not None:  # copied: the batch storage is about to be rebuilt without them
                leaving = finished.nonzero()[:, 0].tolist()
                for row, kv in zip(active[leaving].tolist(), batch_rows(layer_kv(cache), leaving, copy=True)):
                    row_kvs[row] = kv
            staying = (~finished).nonzero()[:, 0]
            cache.batch_select_indices(staying)
            active, finished, chosen = active[staying], finished[staying], chosen[staying]
            positions, attention_mask = positions[staying], attention_mask[staying]
        step_ids = chosen
        positions = positions[:, -1:] + 1
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=1)
    if row_kvs is not None:
        for row, kv in zip(active.tolist(), batch_rows(layer_kv(cache), range(len(active)))):
            row_kvs[row] = kv
    return Decoded(out_ids[:, :steps], out_logprobs[:, :steps], row_kvs, reported)


def real_positions(attention_mask: torch.Tensor, width: int) -> torch.Tensor:
    """Position ids of the last `width` columns, counting real tokens only, so that the gaps
    padding leaves do not shift them."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -width:]


def forward_kwargs(model: Any, cache: Any) -> dict:
    """The cache and last-position-only logits, under the names this transformers version uses
    (`past_key_values` became `cache`; `num_logits_to_keep` became `logits_to_keep`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps it
    names = _forward_parameters(type(base))
    kwargs = {"cache" if "cache" in names else "past_key_values": cache}
    for keep in ("logits_to_keep", "num_logits_to_keep"):
        if keep in names:
            kwargs[keep] = 1
            break
    return kwargs


@functools.cache
def _forward_parameters(model_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)
