"""Generation backends: hf on a tiny random model, openai against a real local HTTP server,
vllm only where it can run (a GPU with vllm installed)."""

from __future__ import annotations

import importlib.util
import socket
import sys
import time

import pytest
import torch
from scripted import FunctionBackend, end_of_turn_id
from servers import ChatServer, chat_reply

from fic.backends import make_backend
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.generation import BackendConfig, Generation, SamplingParams

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


# --------------------------------------------------------------------------- tiny model

def _sharpen(model: torch.nn.Module) -> torch.nn.Module:
    """Re-draw the weights at a larger scale, with an untied output layer. A default random
    init (std 0.02, tied embeddings) gives near-uniform logits and repeats its input token
    forever, which would make the batching and stopping tests vacuous; this one writes varied
    tokens with log-probs around -4, far from argmax ties."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                scale = 1.0 if "embed" in name else 2.0 / param.shape[1] ** 0.5
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(torch.randn(head.weight.shape, generator=gen) * 2.0 / head.weight.shape[1] ** 0.5)
        model.config.tie_word_embeddings = False
    return model.float().eval()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    """(model, tokenizer) from conftest's tiny Llama: fp32, eval mode, sharpened logits."""
    from transformers import AutoModelForCausalLM

    from fic.core.model import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return _sharpen(model), load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(tiny):
    from fic.core.chat import prompt_ids

    _, tokenizer = tiny
    texts = ["Hi", "What is 2 + 2?", "Tell me a long story about a cat who learns to count " * 3,
             "ok", "Name three colours.", "Why is the sky blue? Explain briefly."]
    return [prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def _hf(tiny, batch_size=16, kv_reuse_mb=0):
    from fic.backends.hf import HFBackend

    model, tokenizer = tiny
    return HFBackend(model, tokenizer, batch_size=batch_size, kv_reuse_mb=kv_reuse_mb)


def _forward_logprobs(model, prompt, generated):
    """Log-prob of each generated id from one plain forward pass over prompt + reply."""
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    steps = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
    return steps.gather(-1, torch.tensor(generated)[:, None]).squeeze(-1).tolist()


# --------------------------------------------------------------------------- hf backend

def test_hf_greedy_is_deterministic_and_well_formed(tiny, prompts):
    backend = _hf(tiny)
    first, second = backend.generate(prompts, GREEDY), backend.generate(prompts, GREEDY)
    assert [g.token_ids for g in first] == [g.token_ids for g in second]
    for gen in first:
        assert isinstance(gen, Generation)
        assert len(gen.token_ids) == len(gen.logprobs) <= GREEDY.max_new_tokens
        assert gen.finish_reason in ("stop", "length")
        assert all(lp <= 0 for lp in gen.logprobs)
    # The sharpened model produces varied text, so the batching test below means something.
    assert len({tuple(g.token_ids) for g in first}) > 1


@pytest.mark.slow  # every prompt generated twice
def test_hf_batched_equals_unbatched(tiny, prompts):
    batched = _hf(tiny, batch_size=4).generate(prompts, GREEDY)  # uneven batches, left padding
    alone = [_hf(tiny, batch_size=1).generate([p], GREEDY)[0] for p in prompts]
    for b, a in zip(batched, alone):
        assert b.token_ids == a.token_ids
        assert b.finish_reason == a.finish_reason
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


@pytest.mark.parametrize("kv_reuse_mb", [0, 64])
@pytest.mark.slow  # full forward passes compared
def test_hf_logprobs_match_a_forward_pass(tiny, prompts, kv_reuse_mb):
    model, _ = tiny
    backend = _hf(tiny, batch_size=3, kv_reuse_mb=kv_reuse_mb)
    for params in (GREEDY, SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, seed=3)):
        for prompt, gen in zip(prompts, backend.generate(prompts, params)):
            # Raw model log-probs: the same whatever temperature was used to sample.
            assert gen.logprobs == pytest.approx(_forward_logprobs(model, prompt, gen.token_ids), abs=1e-4)


def test_hf_stops_at_end_of_turn_and_keeps_the_id(tiny, prompts):
    backend = _hf(tiny)
    from fic.core.chat import end_of_turn_ids

    assert backend.stop_ids >= frozenset(end_of_turn_ids(tiny[1]))
    assert tiny[1].convert_tokens_to_ids("<|im_end|>") in backend.stop_ids
    free = backend.generate(prompts[:1], GREEDY)[0].token_ids
    # Declare a token the model is about to produce as the end of turn: it must stop right there.
    k = next(i for i in range(2, len(free)) if free[i] not in free[:i])
    backend.stop_ids = frozenset({free[k]})
    gen = backend.generate(prompts[:1], GREEDY)[0]
    assert gen.token_ids == free[:k + 1]
    assert gen.finish_reason == "stop"
    assert len(gen.logprobs) == k + 1
    assert gen.text == tiny[1].decode(free[:k], skip_special_tokens=True)


def test_hf_max_new_tokens_gives_length(tiny, prompts):
    # (The sharpened random model does not write an end-of-turn token in its first 5 tokens.)
    for gen in _hf(tiny).generate(prompts, SamplingParams(max_new_tokens=5)):
        assert len(gen.token_ids) == len(gen.logprobs) == 5 and gen.finish_reason == "length"


@pytest.mark.slow  # sampling repeated
def test_hf_seeded_sampling_is_reproducible_and_scoped(tiny, prompts):
    backend = _hf(tiny, batch_size=4)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=123)
    state = torch.random.get_rng_state()
    first = backend.generate(prompts, params)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is left alone
    again = backend.generate(prompts, params)
    other = backend.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=124))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    # The same prompt twice in one call is sampled twice, not copied.
    twice = backend.generate([prompts[1], prompts[1]], params)
    assert twice[0].token_ids != twice[1].token_ids


def test_hf_chat_renders_with_the_template_and_restores_training_mode(tiny):
    from fic.core.chat import prompt_ids

    model, tokenizer = tiny
    backend = _hf(tiny)
    conversation = [{"role": "user", "content": "Add 3 and 4."}]
    model.train()
    try:
        via_chat = backend.chat([conversation], GREEDY)[0]
        assert model.training
    finally:
        model.eval()
    assert via_chat.token_ids == backend.generate([prompt_ids(tokenizer, conversation)], GREEDY)[0].token_ids


def test_hf_rejects_bad_prompts_and_params(tiny):
    backend = _hf(tiny)
    assert backend.generate([], GREEDY) == []
    with pytest.raises(FicError, match="empty prompt"):
        backend.generate([[]], GREEDY)
    with pytest.raises(FicError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(FicError, match="top_p"):
        SamplingParams(top_p=0.0)


# --------------------------------------------------------------------------- hf: keys and values kept between calls

NEXT_USER_TURN = "<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"


def _play_turns(backend, tokenizer, prompts, turns, params=GREEDY):
    """Each turn continues every prompt token-in/token-out: prompt + reply + a new user turn."""
    extra = tokenizer.encode(NEXT_USER_TURN, add_special_tokens=False)
    history = []
    for _ in range(turns):
        outputs = backend.generate(prompts, params)
        history.append((prompts, outputs))
        prompts = [p + g.token_ids + extra for p, g in zip(prompts, outputs)]
    return history


@pytest.mark.slow  # whole conversations generated twice
def test_hf_kv_reuse_replies_like_a_full_read_and_feeds_only_new_tokens(tiny, prompts):
    from fic.backends.hf import HFBackend

    model, tokenizer = tiny
    plain, reusing = _hf(tiny, batch_size=4), HFBackend(model, tokenizer, batch_size=4, kv_reuse_mb=64)
    extra = len(tokenizer.encode(NEXT_USER_TURN, add_special_tokens=False))
    fed = []
    for (_, full), (turn_prompts, reused) in zip(_play_turns(plain, tokenizer, prompts, 3),
                                                 _play_turns(_FedCounter(reusing, fed), tokenizer, prompts, 3)):
        for a, b, prompt in zip(full, reused, turn_prompts):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
            assert b.logprobs == pytest.approx(_forward_logprobs(model, prompt, b.token_ids), abs=1e-4)
    # Turn 1 reads each prompt at most once (the template's shared system prompt once per batch);
    # later turns read the last reply token and the new user turn only.
    assert fed[0] <= sum(len(p) for p in prompts)
    assert fed[1] == fed[2] == len(prompts) * (1 + extra)
    assert plain.fed_tokens > 2.5 * reusing.fed_tokens


class _FedCounter:
    """Wraps a backend to record how many prompt tokens each generate call fed the model."""

    def __init__(self, backend, fed):
        self.backend, self.fed = backend, fed

    def generate(self, prompts, params):
        before = self.backend.fed_tokens
        out = self.backend.generate(prompts, params)
        self.fed.append(self.backend.fed_tokens - before)
        return out


@pytest.mark.slow  # long generations compared
def test_hf_rows_that_finish_early_leave_the_batch_and_keep_their_keys_and_values(tiny, prompts):
    from fic.backends.hf import HFBackend

    model, tokenizer = tiny
    free = _hf(tiny).generate(prompts, GREEDY)
    # Declare tokens that rows write at different steps the end of the turn: greedy replies are
    # then the free ones cut at their first stop id, and rows finish at staggered steps. The
    # longest prompt (first in the batch) finishes first, so later leavers have moved up.
    stops = frozenset({free[2].token_ids[1], free[0].token_ids[3], free[1].token_ids[6]})
    cut = [g.token_ids[:next((i + 1 for i, t in enumerate(g.token_ids) if t in stops), len(g.token_ids))]
           for g in free]
    assert len({len(c) for c in cut}) >= 3 and max(len(c) for c in cut) == GREEDY.max_new_tokens
    plain, reusing = _hf(tiny), HFBackend(model, tokenizer, kv_reuse_mb=64)
    plain.stop_ids = reusing.stop_ids = stops
    for backend in (plain, reusing):
        for prompt, gen, expected in zip(prompts, backend.generate(prompts, GREEDY), cut):
            assert gen.token_ids == expected
            assert gen.logprobs == pytest.approx(_forward_logprobs(model, prompt, expected), abs=1e-4)
    # The second turn reuses what each row had when it left: same replies as a full read.
    extra = tokenizer.encode(NEXT_USER_TURN, add_special_tokens=False)
    nxt = [p + c + extra for p, c in zip(prompts, cut)]
    before = reusing.fed_tokens
    second = reusing.generate(nxt, GREEDY)
    assert reusing.fed_tokens - before == sum(len(n) - len(p) - len(c) + 1 for n, p, c in zip(nxt, prompts, cut))
    for gen, full, prompt in zip(second, plain.generate(nxt, GREEDY), nxt):
        assert gen.token_ids == full.token_ids
        assert gen.logprobs == pytest.approx(_forward_logprobs(model, prompt, gen.token_ids), abs=1e-4)


def test_hf_shared_prefix_is_read_once(tiny):
    from fic.backends.hf import HFBackend
    from fic.core.chat import prompt_ids

    model, tokenizer = tiny
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    batch = [prompt_ids(tokenizer, [system, {"role": "user", "content": q}])
             for q in ("Add 2 and 3.", "What is a prime?", "Name a colour.", "Count to four.")]
    shared = next(i for i in range(len(batch[0])) if len({p[i] for p in batch}) > 1)
    assert shared > 64
    reusing = HFBackend(model, tokenizer, kv_reuse_mb=64)
    with_reuse = reusing.generate(batch, GREEDY)
    assert reusing.fed_tokens == shared + sum(len(p) - shared for p in batch)
    for a, b in zip(_hf(tiny).generate(batch, GREEDY), with_reuse):
        assert a.token_ids == b.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def test_hf_kv_reuse_forgets_when_the_weights_change(tiny, prompts):
    import copy

    from fic.backends.hf import HFBackend

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    reusing = HFBackend(model, tokenizer, kv_reuse_mb=64)
    [(_, first)] = _play_turns(reusing, tokenizer, prompts[:3], 1)
    assert reusing.kv_store.entries
    with torch.no_grad():  # what an optimizer step does: change the weights in place
        for param in model.parameters():
            param.mul_(1.5)
    extra = tokenizer.encode(NEXT_USER_TURN, add_special_tokens=False)
    nxt = [p + g.token_ids + extra for p, g in zip(prompts[:3], first)]
    before = reusing.fed_tokens
    after_step = reusing.generate(nxt, GREEDY)
    assert reusing.fed_tokens - before == sum(len(p) for p in nxt)  # nothing stale was reused
    fresh = HFBackend(model, tokenizer).generate(nxt, GREEDY)
    assert [g.token_ids for g in after_step] == [g.token_ids for g in fresh]


@pytest.mark.slow  # a second model built and generated with
def test_hf_kv_reuse_steps_aside_for_sliding_window_models(tiny_model_dir):
    from transformers import MistralConfig, MistralForCausalLM

    from fic.backends.hf import HFBackend
    from fic.core.model import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                           sliding_window=8, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _sharpen(MistralForCausalLM(config))
    batch = [list(range(100, 130)), list(range(200, 221))]
    reusing = HFBackend(model, tokenizer, kv_reuse_mb=64)
    # A sliding-window layer keeps only its last positions: nothing to splice, so no store.
    history = _play_turns(reusing, tokenizer, batch, 2)
    assert reusing.kv_store is None
    for (_, a), (_, b) in zip(_play_turns(HFBackend(model, tokenizer), tokenizer, batch, 2), history):
        assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_kv_store_matches_the_longest_prefix_within_its_budget():
    from fic.backends.kv_reuse import KVStore

    def kv(n):  # one layer, 1 head, n positions, dim 2: 16 bytes per position for keys + values
        return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]

    store = KVStore(budget_bytes=16 * 10)
    store.put([1, 2, 3], kv(3))
    store.put([1, 2, 9, 9], kv(4))
    assert store.match([1, 2, 9, 9, 5])[1] == 4
    assert store.match([1, 2, 3, 4])[1] == 3
    assert store.match([1, 2, 3])[1] == 2  # one token is always left to feed
    assert store.match([7, 1, 2]) == (None, 0)
    store.put([1] * 20, kv(20))  # over the whole budget: not kept
    assert len(store.entries) == 2 and store.nbytes == 16 * 7
    store.match([1, 2, 3, 4])  # touch [1, 2, 3]: [1, 2, 9, 9] is now the least recently used
    store.put([5, 6, 7, 8, 9], kv(5))
    assert [list(e.tokens) for e in store.entries.values()] == [[1, 2, 3], [5, 6, 7, 8, 9]]
    assert store.nbytes == 16 * 8


def test_prefill_groups_find_the_cheapest_split():
    import itertools
    import random

    from fic.backends.hf import prefill_groups

    def cost(lengths, groups, pass_cost):
        return sum(len(g) * max(lengths[i] for i in g) + pass_cost for g in groups)

    rng = random.Random(0)
    for _ in range(40):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 7))]
        groups = prefill_groups(lengths, 16)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
        best = min(cost(lengths, [order[a:b] for a, b in zip((0,) + cuts, cuts + (len(order),))], 16)
                   for k in range(len(order))
                   for cuts in itertools.combinations(range(1, len(order)), k))
        assert cost(lengths, groups, 16) == best
    assert prefill_groups([64, 30, 29, 28], 16) == [[0], [1, 2, 3]]
    assert prefill_groups([5, 4, 3], 1000) == [[0, 1, 2]]


def test_growing_layer_keeps_every_position_past_its_first_size():
    from fic.backends.hf import GrowingLayer

    layer = GrowingLayer(expected=3)
    chunks = [torch.randn(2, 1, n, 4) for n in (2, 1, 1, 5, 1)]
    for chunk in chunks:
        keys, values = layer.update(chunk, -chunk, 0)
    torch.testing.assert_close(keys, torch.cat(chunks, dim=2))
    torch.testing.assert_close(values, -torch.cat(chunks, dim=2))
    assert layer.get_seq_length() == 10 and 10 <= layer.capacity <= 20


def test_column_major_linears_keep_the_outputs(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from fic.backends.hf import column_major_linears

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 200, 3000, 17]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        column_major_linears(model)
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.t().is_contiguous() for m in linears)
    # The tied output head got its own copy; the embedding still reads contiguous rows.
    assert model.get_input_embeddings().weight.is_contiguous()
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight


# --------------------------------------------------------------------------- function backend

def test_function_backend_scripts_chat_and_token_replies(tiny):
    _, tokenizer = tiny

    seen = []
    chat_only = FunctionBackend(lambda conv: seen.append(conv) or f"turn {len(conv)}")
    [gen] = chat_only.chat([[{"role": "user", "content": "hi"}]], GREEDY)
    assert gen == Generation(token_ids=[], text="turn 1", logprobs=[], finish_reason="stop")
    with pytest.raises(FicError, match="tokenizer"):
        chat_only.generate([[1, 2]], GREEDY)

    scripted = FunctionBackend(lambda prompt: "The answer is 7.", tokenizer=tokenizer)
    [gen] = scripted.generate([tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n")], GREEDY)
    expected = tokenizer.encode("The answer is 7.", add_special_tokens=False) + [end_of_turn_id(tokenizer)]
    assert gen.token_ids == expected and gen.finish_reason == "stop" and gen.text == "The answer is 7."
    [cut] = scripted.generate([[1]], SamplingParams(max_new_tokens=2))
    assert cut.token_ids == expected[:2] and cut.finish_reason == "length"


# --------------------------------------------------------------------------- openai backend

@pytest.fixture
def serve():
    servers = []

    def start(respond):
        servers.append(ChatServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _echo(body, number):
    return 200, chat_reply("echo: " + body["messages"][-1]["content"]), {}, 0


def _openai(server, **kwargs):
    from fic.backends.openai import OpenAIBackend

    return OpenAIBackend("test-model", server.url, kwargs.pop("api_key", None), **kwargs)


def _conv(text):
    return [{"role": "user", "content": text}]


def test_openai_normal_reply_and_request_fields(serve):
    server = serve(lambda body, n: (200, chat_reply("Sure.", "length", [-0.1, -0.2]), {}, 0))
    backend = _openai(server, api_key="sk-test", request_logprobs=True)
    params = SamplingParams(max_new_tokens=33, temperature=0.5, top_p=0.9, seed=7)
    gens = backend.chat([_conv("a"), _conv("b")], params)
    assert gens[0] == Generation(token_ids=[], text="Sure.", logprobs=[-0.1, -0.2], finish_reason="length")
    body = server.bodies[0]
    assert body["model"] == "test-model" and body["max_tokens"] == 33 and body["logprobs"] is True
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert sorted(b["seed"] for b in server.bodies) == [7, 8]  # seed + index: repeats differ
    assert {k.lower(): v for k, v in server.headers[0].items()}["authorization"] == "Bearer sk-test"
    assert backend.tokenizer is None
    with pytest.raises(FicError, match="local backend"):
        backend.generate([[1, 2, 3]], params)


def test_openai_retries_server_errors_then_succeeds(serve):
    def flaky(body, n):
        if n <= 2:
            return 500, {"error": {"message": "overloaded"}}, {}, 0
        return _echo(body, n)

    server = serve(flaky)
    [gen] = _openai(server, max_retries=3).chat([_conv("hello")], GREEDY)
    assert gen.text == "echo: hello" and gen.finish_reason == "stop" and gen.logprobs == []
    assert len(server.bodies) == 3


def test_openai_retries_429_and_gives_up_clearly(serve):
    once = serve(lambda body, n: (429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}, 0)
                 if n == 1 else _echo(body, n))
    assert _openai(once, max_retries=2).chat([_conv("x")], GREEDY)[0].text == "echo: x"
    assert len(once.bodies) == 2

    always = serve(lambda body, n: (429, {"error": {"message": "slow down"}}, {}, 0))
    with pytest.raises(FicError, match=r"gave up after 3 attempt.*429.*slow down"):
        _openai(always, max_retries=2).chat([_conv("x")], GREEDY)
    assert len(always.bodies) == 3


def test_openai_client_error_is_clear_and_not_retried(serve):
    server = serve(lambda body, n: (400, {"error": {"message": "model 'test-model' does not exist"}}, {}, 0))
    with pytest.raises(FicError, match=r"HTTP 400: model 'test-model' does not exist"):
        _openai(server, max_retries=5).chat([_conv("x")], GREEDY)
    assert len(server.bodies) == 1


def test_openai_timeout_is_retried_then_reported(serve):
    server = serve(lambda body, n: (200, chat_reply("late"), {}, 1.0))
    start = time.monotonic()
    with pytest.raises(FicError, match="gave up after 2 attempt"):
        _openai(server, timeout_s=0.2, max_retries=1).chat([_conv("x")], GREEDY)
    assert time.monotonic() - start < 2.0
    assert len(server.bodies) == 2


def test_openai_connection_refused_is_reported(serve):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from fic.backends.openai import OpenAIBackend

    backend = OpenAIBackend("m", f"http://127.0.0.1:{port}/v1", max_retries=1)
    with pytest.raises(FicError, match="gave up after 2 attempt"):
        backend.chat([_conv("x")], GREEDY)


def test_openai_concurrency_limit_and_order(serve):
    server = serve(lambda body, n: (200, chat_reply("echo: " + body["messages"][-1]["content"]), {}, 0.3))
    start = time.monotonic()
    gens = _openai(server, concurrency=4).chat([_conv(str(i)) for i in range(8)], GREEDY)
    elapsed = time.monotonic() - start
    assert [g.text for g in gens] == [f"echo: {i}" for i in range(8)]  # order kept
    assert server.max_in_flight == 4  # overlapping, but never more than the limit
    assert elapsed < 8 * 0.3  # really concurrent


def test_openai_honours_retry_after(serve):
    # 1.5 s asked: more than the SDK's own first backoff (at most 0.5 s), so the wait shows whose it was
    server = serve(lambda body, n: (429, {"error": {"message": "slow down"}}, {"Retry-After": "1.5"}, 0)
                   if n == 1 else _echo(body, n))
    start = time.monotonic()
    [gen] = _openai(server, max_retries=2).chat([_conv("x")], GREEDY)
    assert gen.text == "echo: x" and len(server.bodies) == 2
    assert time.monotonic() - start >= 1.5


def _reasoning_model(body, n):
    """An OpenAI reasoning model: max_tokens and any temperature but 1 are refused, as the API words it."""
    if "max_tokens" in body:
        return 400, {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                               "Use 'max_completion_tokens' instead.", "type": "invalid_request_error",
                               "param": "max_tokens", "code": "unsupported_parameter"}}, {}, 0
    if body.get("temperature", 1) != 1:
        # no `param` here: the refused field is read from the message, as some gateways send only that
        return 400, {"error": {"message": f"Unsupported value: 'temperature' does not support {body['temperature']} "
                               "with this model. Only the default (1) value is supported.",
                               "type": "invalid_request_error", "code": "unsupported_value"}}, {}, 0
    return _echo(body, n)


def test_openai_adapts_to_a_reasoning_model_once(serve, caplog):
    server = serve(_reasoning_model)
    backend = _openai(server, concurrency=1)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, seed=3)
    with caplog.at_level("WARNING"):
        gens = backend.chat([_conv("a"), _conv("b"), _conv("c")], params)
    assert [g.text for g in gens] == ["echo: a", "echo: b", "echo: c"]
    # two refusals on the first conversation, none after: the backend remembers
    assert len(server.bodies) == 2 + 3
    for body in server.bodies[2:]:
        assert body["max_completion_tokens"] == 40 and "max_tokens" not in body and "temperature" not in body
        assert body["top_p"] == 1.0 and "seed" in body  # what the model accepts is still sent
    said = [r.getMessage() for r in caplog.records if "refuses" in r.getMessage()]
    assert len(said) == 2 and "max_tokens" in said[0] and "sent as max_completion_tokens" in said[0]
    assert "temperature" in said[1] and "its own default" in said[1]
    assert backend.chat([_conv("d")], params)[0].text == "echo: d" and len(server.bodies) == 6


def test_openai_refusal_of_another_field_is_an_error_not_a_loop(serve):
    server = serve(lambda body, n: (400, {"error": {"message": "Unsupported parameter: 'messages' is not supported",
                                                    "param": "messages"}}, {}, 0))
    with pytest.raises(FicError, match=r"HTTP 400: Unsupported parameter: 'messages'"):
        _openai(server).chat([_conv("x")], GREEDY)
    assert len(server.bodies) == 1


def test_openai_extra_missing_is_one_clear_line(monkeypatch):
    from fic.backends.openai import OpenAIBackend

    monkeypatch.setitem(sys.modules, "openai", None)  # as if the package were not installed
    with pytest.raises(FicError, match=r'the openai backend \(kind: openai\) needs the openai package: '
                                       r'pip install "fic\[openai\]"'):
        OpenAIBackend("m", "http://127.0.0.1:9/v1")


# --------------------------------------------------------------------------- config and factory

def test_make_backend_rejects_bad_kinds_and_settings(monkeypatch, tmp_path):
    with pytest.raises(FicError, match="unknown backend kind 'nope'"):
        make_backend(BackendConfig(kind="nope", model="m"))
    with pytest.raises(FicError, match=r"field 'kind': expected one of 'hf', 'vllm', 'openai'"):
        load_config(BackendConfig, overrides=["kind=gpt", "model=m"])
    with pytest.raises(FicError, match="model"):
        make_backend(BackendConfig(kind="openai"))
    # A backend file without a model is refused where it is read (`fic shard --sharder-config`); a
    # nested backend section is checked by the config that uses it.
    from fic.cli.data import _backend_from_yaml

    empty = tmp_path / "backend.yaml"
    empty.write_text("kind: openai\n")
    with pytest.raises(FicError, match="missing the model"):
        _backend_from_yaml(str(empty), "--sharder-config")
    with pytest.raises(FicError, match="concurrency"):
        load_config(BackendConfig, overrides=["model=m", "concurrency=0"])
    monkeypatch.delenv("FIC_TEST_KEY", raising=False)
    with pytest.raises(FicError, match="FIC_TEST_KEY"):
        make_backend(BackendConfig(kind="openai", model="gpt-4o-mini", api_key_env="FIC_TEST_KEY"))
    with pytest.raises(FicError, match="base_url"):
        make_backend(BackendConfig(kind="openai", model="m", base_url="localhost:8000/v1"))
    local = make_backend(BackendConfig(kind="openai", model="m", base_url="http://127.0.0.1:9/v1",
                                       api_key_env="FIC_TEST_KEY"))
    assert local.name == "openai" and local.api_key is None


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_missing_is_a_clear_error():
    with pytest.raises(FicError, match=r"pip install 'fic\[vllm\]' on a GPU machine"):
        make_backend(BackendConfig(kind="vllm", model="anything"))


# --------------------------------------------------------------------------- vllm backend

def _vllm_runnable() -> bool:
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


@pytest.mark.skipif(not _vllm_runnable(), reason="needs vllm installed and a CUDA GPU")
def test_vllm_matches_hf_on_the_tiny_model(request):
    folder = request.getfixturevalue("tiny_model_dir")
    from fic.backends.hf import load_hf_backend
    from fic.core.chat import prompt_ids

    vllm_backend = make_backend(BackendConfig(kind="vllm", model=str(folder), dtype="float32",
                                              gpu_memory_utilization=0.3, max_model_len=512))
    hf = load_hf_backend(BackendConfig(kind="hf", model=str(folder), dtype="float32", device="cuda"))
    prompts = [prompt_ids(hf.tokenizer, _conv(t)) for t in ("hi", "what is 2+2?")]
    params = SamplingParams(max_new_tokens=8)
    for v, h in zip(vllm_backend.generate(prompts, params), hf.generate(prompts, params)):
        assert len(v.token_ids) == len(v.logprobs) and v.finish_reason in ("stop", "length")
        # Same raw log-probs as the hf backend, to kernel precision.
        n = min(len(v.token_ids), len(h.token_ids))
        if v.token_ids[:n] == h.token_ids[:n]:
            assert v.logprobs[:n] == pytest.approx(h.logprobs[:n], abs=1e-2)
    sampled = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    assert [g.token_ids for g in vllm_backend.generate(prompts, sampled)] == \
           [g.token_ids for g in vllm_backend.generate(prompts, sampled)]


def test_hf_prefixes_shared_by_some_prompts_are_read_once(tiny):
    """One task in two views shares its (long) system prompt with nothing else; N runs of one
    prompt share everything but the last token. Each shared prefix is read once, shorter first,
    and the replies are those of a full read."""
    from fic.backends.hf import HFBackend
    from fic.backends.kv_reuse import shared_prefixes
    from fic.core.chat import prompt_ids

    model, tokenizer = tiny
    first = {"role": "system", "content": "Tools: rent_car(city: str, days: int). " * 8}
    second = {"role": "system", "content": "Tools: send_money(recipient: str, amount: float). " * 8}
    batch = [prompt_ids(tokenizer, [first, {"role": "user", "content": "Rent a car in Rome for 5 days."}]),
             prompt_ids(tokenizer, [first, {"role": "user", "content": "I need to rent a car."}]),
             prompt_ids(tokenizer, [second, {"role": "user", "content": "Send 20 euros to Ana."}])] + \
        [prompt_ids(tokenizer, [second, {"role": "user", "content": "Pay Bo."}])] * 3
    lcp = next(i for i in range(len(batch[0])) if batch[0][i] != batch[1][i])
    prefixes = shared_prefixes(batch, [0] * len(batch), min_saving=32)
    assert [len(p) for p in prefixes][-1] == len(batch[3]) - 1  # the three runs: all but the last token
    assert any(len(p) == lcp for p in prefixes)
    reusing = HFBackend(model, tokenizer, kv_reuse_mb=64)
    got = reusing.generate(batch, GREEDY)
    second_system = next(i for i in range(len(batch[2])) if batch[2][i] != batch[3][i])
    # Read once each: the first system prompt, the second one, the runs' shared prompt beyond it,
    # every row's own rest; and every row's last prompt token, fed with the first reply step.
    assert reusing.fed_tokens == (lcp + (len(batch[0]) - 1 - lcp) + (len(batch[1]) - 1 - lcp) + second_system
                                  + (len(batch[2]) - 1 - second_system) + (len(batch[3]) - 1 - second_system)
                                  + len(batch))
    assert reusing.fed_tokens < 0.6 * sum(len(p) for p in batch)
    for a, b in zip(_hf(tiny).generate(batch, GREEDY), got):
        assert a.token_ids == b.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
