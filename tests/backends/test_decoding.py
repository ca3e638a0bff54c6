"""The hf backend's decoding loop (`fic.backends.decoding`): how often it waits for the device,
batched sampling that gives a row the same reply whatever rows sit beside it, and the legacy
loop behind its setting."""

from __future__ import annotations

import pytest
import torch

from fic.core.errors import FicError
from fic.core.generation import SamplingParams

MASK32 = 0xFFFFFFFF


def _backend(tiny, **kwargs):
    from fic.backends.hf import HFBackend

    model, tokenizer = tiny
    return HFBackend(model, tokenizer, **kwargs)


def _staggered_stops(free) -> frozenset[int]:
    """Tokens the free replies write first at different steps (the 3rd of one, the 20th of
    another, ...): declared the end of the turn, they make rows finish at staggered steps."""
    stops: set[int] = set()
    for gen, at in zip(free, (2, 13, 7, 30)):
        if len(gen.token_ids) > at and gen.token_ids[at] not in gen.token_ids[:at]:
            stops.add(gen.token_ids[at])
    return frozenset(stops)


def _counting(monkeypatch, name: str) -> list:
    """Wrap the backend's loop `name` so that each call's host waits are counted; returns the
    list that gets (waits, steps written, by kind) per call."""
    from fic.backends import hf
    from fic.bench.decode import SyncCounter

    loop, calls = getattr(hf, name), []

    def counted(*args, **kwargs):
        with SyncCounter() as counter:
            out = loop(*args, **kwargs)
        calls.append((counter.total, out.ids.shape[1], dict(counter.counts)))
        return out

    monkeypatch.setattr(hf, name, counted)
    return calls


@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.slow), 1.0])
def test_the_loop_waits_for_the_device_at_most_once_every_8_steps(tiny, prompts, monkeypatch, temperature):
    params = SamplingParams(max_new_tokens=40, temperature=temperature, seed=1)
    backend = _backend(tiny, batch_size=3, kv_reuse_mb=64)  # 4 prompts: batches of 3 and 1, left-padded
    prompts = prompts[:4]
    fast = _counting(monkeypatch, "decode")
    free = backend.generate(prompts, params)
    backend.stop_ids = _staggered_stops(free)
    ended = backend.generate(prompts, params)  # the same draws, now ending at staggered steps
    assert len({len(g.token_ids) for g in ended}) >= 3
    extra = tiny[1].encode("<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    backend.generate([p + g.token_ids + extra for p, g in zip(prompts, ended)], params)  # keys and values reused
    assert len(fast) == 6
    for waits, steps, kinds in fast:
        assert waits <= steps / 8, kinds
    # The counter is not blind: the legacy loop waits at every step, once or more.
    legacy = _counting(monkeypatch, "decode_legacy")
    _backend(tiny, batch_size=3, decode_loop="legacy").generate(prompts, params)
    for waits, steps, kinds in legacy:
        assert waits >= steps, kinds


def test_a_sampled_reply_is_the_same_alone_and_in_any_batch(tiny, prompts):
    """Row i draws from (its seed, the step) only: alone, in one batch of four, in batches of two
    in another order, beside rows that end early and leave the batch, its reply is the same."""
    seeds, prompts = [101, 202, 303, 404], prompts[1:5]

    def params(row_seeds, top_p=0.9):
        return SamplingParams(max_new_tokens=16, temperature=1.0, top_p=top_p, seeds=tuple(row_seeds))

    backend = _backend(tiny, batch_size=16)
    together = [g.token_ids for g in backend.generate(prompts, params(seeds))]
    alone = [backend.generate([p], params([s]))[0].token_ids for p, s in zip(prompts, seeds)]
    assert together == alone
    order = [2, 0, 3, 1]
    pairs = _backend(tiny, batch_size=2).generate([prompts[i] for i in order], params([seeds[i] for i in order]))
    assert [g.token_ids for g in pairs] == [together[i] for i in order]
    # Beside rows that finish at staggered steps (and leave the batch), checked every step or every 32.
    backend.stop_ids = _staggered_stops([g for g in backend.generate(prompts, params(seeds))])
    cut = [backend.generate([p], params([s]))[0].token_ids for p, s in zip(prompts, seeds)]
    assert len({len(c) for c in cut}) >= 3
    for check_every in (1, 32):
        backend.check_every = check_every
        assert [g.token_ids for g in backend.generate(prompts, params(seeds))] == cut
    # The same prompt with two seeds: two samples; with one seed twice: one reply twice.
    twice = backend.generate([prompts[1]] * 3, params([7, 8, 7], top_p=1.0))
    assert twice[0].token_ids == twice[2].token_ids != twice[1].token_ids


def test_greedy_replies_are_transformers_generate_s_exactly(tiny, prompts):
    """Greedy decoding is the argmax of the raw logits, as `model.generate` does it: each prompt
    decoded alone by `generate` (float32, no padding) gives the reply and log-probs the loop gives
    in one left-padded batch whose rows end at staggered steps and leave it."""
    from transformers import GenerationConfig

    model, _ = tiny
    params = SamplingParams(max_new_tokens=24)
    backend = _backend(tiny, batch_size=16, check_every=4)
    backend.stop_ids = _staggered_stops(backend.generate(prompts, params))
    batched = backend.generate(prompts, params)
    assert len({len(g.token_ids) for g in batched}) >= 3
    config = GenerationConfig(do_sample=False, max_new_tokens=params.max_new_tokens, top_k=None, top_p=None,
                              eos_token_id=sorted(backend.stop_ids), pad_token_id=backend.pad_id,
                              output_logits=True, return_dict_in_generate=True)
    for prompt, gen in zip(prompts, batched):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        reply = out.sequences[0, len(prompt):].tolist()
        logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, reply)]
        assert gen.token_ids == reply
        assert gen.logprobs == pytest.approx(logprobs, abs=1e-4)


def _mix32(x: int) -> int:  # the hash in Python integers
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & MASK32
    x ^= x >> 15
    x = (x * 0x735A2D97) & MASK32
    return x ^ (x >> 15)


def test_row_keys_and_token_hashes_are_the_hash_of_the_seed_the_step_and_the_token():
    from fic.backends.decoding import row_keys, token_hashes

    seeds = [0, 1, 2**31 - 1, 2**40 + 5, -3]
    keys = row_keys(seeds, 50)
    assert keys.shape == (5, 50)
    for row, seed in enumerate(seeds):
        key = seed % 2**64
        for step in (0, 1, 49):
            assert keys[row, step].item() == _mix32(_mix32(_mix32(step ^ 0x9E3779B9) ^ (key & MASK32)) ^ (key >> 32))
    assert token_hashes(10).tolist() == [_mix32(t ^ 0x7F4A7C15) for t in range(10)]
    # A row's keys depend on its seed alone, not on the rows beside it or the steps asked for.
    assert torch.equal(row_keys([seeds[3]], 10)[0], keys[3, :10])
    many = row_keys([7], 20000)[0]
    assert len(set(many.tolist())) == 20000  # a bijection of the step
    assert abs(many.double().mean().item() / 2**32 - 0.5) < 0.01


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_batched_sampling_draws_from_the_filtered_distribution(temperature, top_p):
    from transformers import TopPLogitsWarper

    from fic.backends.decoding import logits_warpers, row_keys, sample, token_hashes

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, -8.0])
    rows = 40000
    chosen = sample(logits.repeat(rows, 1), logits_warpers(SamplingParams(temperature=temperature, top_p=top_p)),
                    row_keys(list(range(rows)), 1)[:, 0], token_hashes(len(logits)))
    expected = torch.softmax(TopPLogitsWarper(top_p)(None, (logits / temperature)[None])[0], dim=-1)
    frequency = torch.bincount(chosen, minlength=len(logits)).double() / rows
    assert (frequency - expected).abs().max() < 0.01
    assert frequency[expected == 0].sum() == 0  # a token top-p cut is never drawn
    # A flat distribution over a wide vocabulary: 64 rows x 64 steps draw 4,096 of 4,096 tokens,
    # each token's count Poisson(1) if draws are independent (variance 1; clumped noise gives more).
    keys = row_keys(list(range(64)), 64)
    wide = torch.cat([sample(torch.zeros(64, 4096), [], keys[:, step], token_hashes(4096)) for step in range(64)])
    assert torch.bincount(wide, minlength=4096).double().var().item() == pytest.approx(1.0, abs=0.1)
    # Greedy: the argmax, with no noise at all.
    assert sample(logits[None], [], None).tolist() == [0]


@pytest.mark.slow  # conversations decoded twice, by both loops
def test_the_legacy_loop_stays_behind_its_setting_and_decodes_greedy_alike(tiny, prompts, monkeypatch):
    from fic.backends import decoding, hf

    fast, legacy = _backend(tiny, batch_size=4, kv_reuse_mb=64), _backend(tiny, batch_size=4, kv_reuse_mb=64,
                                                                         decode_loop="legacy")
    params = SamplingParams(max_new_tokens=40)
    fast.stop_ids = legacy.stop_ids = _staggered_stops(_backend(tiny).generate(prompts, params))
    ran = []
    monkeypatch.setattr(hf, "decode_legacy", lambda *a, **k: ran.append(1) or decoding.decode_legacy(*a, **k))
    extra = tiny[1].encode("<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    turn_a, turn_b = prompts, prompts
    for _ in range(2):  # the second turn reuses each row's keys and values, as they were when it left
        a, b = fast.generate(turn_a, params), legacy.generate(turn_b, params)
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        for x, y in zip(a, b):
            assert x.finish_reason == y.finish_reason
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
        turn_a = [p + g.token_ids + extra for p, g in zip(turn_a, a)]
        turn_b = [p + g.token_ids + extra for p, g in zip(turn_b, b)]
    assert ran and fast.fed_tokens == legacy.fed_tokens


def test_the_loop_settings_are_checked(tiny, tiny_model_dir):
    from fic.backends import make_backend
    from fic.core.config import load_config
    from fic.core.generation import BackendConfig

    with pytest.raises(FicError, match="decode_loop must be one of fast, legacy"):
        _backend(tiny, decode_loop="slow")
    with pytest.raises(FicError, match="check_every must be at least 1"):
        _backend(tiny, check_every=0)
    with pytest.raises(FicError, match="decode_loop"):
        load_config(BackendConfig, overrides=["model=m", "decode_loop=slow"])
    with pytest.raises(FicError, match="check_every"):
        load_config(BackendConfig, overrides=["model=m", "check_every=0"])
    backend = make_backend(BackendConfig(model=str(tiny_model_dir), device="cpu", decode_loop="legacy", check_every=4))
    assert (backend.decode_loop, backend.check_every) == ("legacy", 4)
    assert _backend(tiny).decode_loop == "fast" and _backend(tiny).lockstep is None
