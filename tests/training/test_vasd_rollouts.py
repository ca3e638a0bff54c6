"""VASD's rollout engine (`fic.training.vasd.rollouts`): keys and values forgotten after every
update, the bf16 decoding copy refreshed from the float32 masters, and the vLLM weight sync
checked against a stand-in engine (names, merged adapters, an untouched base)."""

from __future__ import annotations

import copy

import pytest
import torch

from fic.core.chat import prompt_ids
from fic.core.config import load_config
from fic.core.generation import SamplingParams
from fic.training.vasd.config import VASDConfig


def test_rollout_keys_and_values_are_forgotten_after_a_fused_optimizer_step(tiny_model_dir, smollm2_tokenizer):
    """Fused AdamW changes weights without bumping version counters, so the backend's own check
    cannot see the step: VASD calls weights_changed(), and the next rollout then matches a fresh
    backend's, where stale keys and values would not."""
    from fic.backends.hf import HFBackend
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32")
    backend = HFBackend(model, smollm2_tokenizer, kv_reuse_mb=64)
    prompt = [prompt_ids(smollm2_tokenizer, [{"role": "user", "content": "Ara played for 4 years."}])]
    greedy = SamplingParams(max_new_tokens=4)
    backend.generate(prompt, greedy)
    assert backend.kv_store.entries
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    versions = [p._version for p in model.parameters()]
    optimizer.step()
    assert [p._version for p in model.parameters()] == versions  # invisible to the version check
    backend.weights_changed()
    assert not backend.kv_store.entries
    again = backend.generate(prompt, greedy)[0]
    fresh = HFBackend(model, smollm2_tokenizer).generate(prompt, greedy)[0]
    assert again.token_ids == fresh.token_ids and again.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)


def test_the_held_out_play_leaves_no_keys_and_values_for_the_rollouts(tiny_model_dir, smollm2_tokenizer):
    """The held-out rollouts share prefixes (the system turn) with the training rollouts after them;
    reusing their keys and values, computed in another batch, rounds otherwise in bfloat16 than a
    fresh prefill would, so the measuring would change what training samples. They are dropped."""
    from fic.backends.hf import HFBackend
    from fic.core.model import load_model
    from fic.training.vasd.inputs import multi_turn_instances
    from fic.training.vasd.rollouts import play_greedy

    cfg = load_config(VASDConfig, None, ["model.path=unused", "train.max_steps=1", "anchor.share=0",
                                         "data.source=reasoning-gym:gsm_symbolic", "rollout.max_new_tokens=4",
                                         "dev.every=1", "dev.data.source=reasoning-gym:gsm_symbolic",
                                         "dev.data.limit=2"])
    backend = HFBackend(load_model(tiny_model_dir, dtype="float32"), smollm2_tokenizer, kv_reuse_mb=64)
    stored = []
    put = backend.kv_store.put
    backend.kv_store.put = lambda tokens, kv: (stored.append(len(tokens)), put(tokens, kv))[1]
    convs = play_greedy(cfg, multi_turn_instances(cfg.dev.data, "dev.data"), backend)
    assert len(convs) == 2 and all(conv.turns for conv in convs)
    assert stored and not backend.kv_store.entries  # kept between its turns, gone once it is over


def test_weight_sync_hands_the_engine_merged_lora_weights_under_its_own_names(tiny_model_dir):
    """vLLM is GPU-only; a stand-in engine with vLLM's attribute path and `load_weights` checks
    the part FiC owns: names without PEFT's prefixes, adapters merged into what the engine gets
    (not into the trainer's weights), the prefix cache reset."""
    from peft import LoraConfig, get_peft_model

    from fic.backends.vllm import sync_weights
    from fic.core.model import load_model

    policy = get_peft_model(load_model(tiny_model_dir, dtype="float32"),
                            LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    engine_model = load_model(tiny_model_dir, dtype="float32")

    def load_weights(weights):
        state = dict(weights)
        assert set(state) == set(engine_model.state_dict())
        engine_model.load_state_dict(state, strict=False)

    resets = []
    backend = stand_in_engine(load_weights, lambda: resets.append(1))
    ids = torch.tensor([[5, 9, 200, 31, 7]])
    with torch.no_grad():
        adapted = policy(input_ids=ids).logits
    sync_weights(backend, policy, [], 0.0, print)
    with torch.no_grad():
        assert torch.allclose(engine_model(input_ids=ids).logits, adapted, atol=1e-5)
        assert torch.allclose(policy(input_ids=ids).logits, adapted, atol=1e-6)  # the trainer's model as it was
    assert resets == [1]


def stand_in_engine(load_weights, reset=lambda: None):
    """An object with vLLM's attribute path down to the engine's model (`load_weights`)."""
    from types import SimpleNamespace

    model = SimpleNamespace(load_weights=load_weights)
    return SimpleNamespace(llm=SimpleNamespace(reset_prefix_cache=reset, llm_engine=SimpleNamespace(
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=SimpleNamespace(
            model_runner=SimpleNamespace(model=model)))))))


def test_weight_sync_never_moves_the_trainers_bf16_base(tiny_model_dir):
    """merge_adapter() then unmerge_adapter() on a bf16 base is W + d - d, not exact: the frozen
    teacher (adapters off), the student's base and final-merged drifted a little at every sync.
    The synced weights are merged out of place: after 100 syncs the base is bit-identical, and
    each synced weight is base + scale * B @ A in float32 cast once, i.e. merge_and_unload's
    within one bf16 rounding."""
    from peft import LoraConfig, get_peft_model

    from fic.backends.vllm import sync_weights
    from fic.core.model import load_model

    policy = get_peft_model(load_model(tiny_model_dir, dtype="bfloat16"),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                       lora_dropout=0.0))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    received = []
    backend = stand_in_engine(lambda weights: received.append(dict(weights)))
    for _ in range(100):
        sync_weights(backend, policy, [], 0.0, print)
    synced = received[-1]
    for name, p in policy.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base[name]), name
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(synced) == set(merged)
    lora_weights = 0
    for module_name, module in policy.named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            key = f"{module_name}.base_layer.weight".removeprefix("base_model.model.").replace(".base_layer", "")
            w = module.base_layer.weight
            exact = w.float() + module.get_delta_weight("default").float()
            assert synced[key].dtype == torch.bfloat16 and torch.equal(synced[key], exact.to(torch.bfloat16)), key
            ulp = torch.finfo(torch.bfloat16).eps * merged[key].float().abs()
            assert torch.all((synced[key].float() - merged[key].float()).abs() <= ulp), key
            assert not torch.equal(synced[key], w)  # the adapter is in it
            lora_weights += 1
    assert lora_weights == 3 * 2  # q_proj, v_proj and down_proj of both layers
    for key in set(synced) - {k for k in synced if any(t in k for t in ("q_proj.w", "v_proj.w", "down_proj.w"))}:
        assert torch.equal(synced[key], merged[key]), key


def test_bf16_rollouts_run_on_a_decoding_copy_refreshed_after_every_step(tiny_model_dir, smollm2_tokenizer):
    from fic.core.model import load_model
    from fic.training.vasd.rollouts import make_rollout_backend, sync_rollout_backend

    cfg = load_config(VASDConfig, None, ["anchor.share=0", "train.max_steps=1"])
    policy = load_model(tiny_model_dir, dtype="float32")
    same, none = make_rollout_backend(cfg, policy, smollm2_tokenizer, torch.float32)
    assert same.model is policy and none is None  # float32 compute: the policy itself plays
    backend, masters = make_rollout_backend(cfg, policy, smollm2_tokenizer, torch.bfloat16)
    copy_model = backend.model
    assert copy_model is not policy and {p.dtype for p in copy_model.parameters()} == {torch.bfloat16}
    q_proj = copy_model.model.layers[0].self_attn.q_proj.weight
    assert q_proj.stride(0) == 1  # column-major: the fast small-batch product path
    with torch.no_grad():  # an optimizer step moves the float32 masters
        for p in policy.parameters():
            p.add_(0.01)
    sync_rollout_backend(backend, policy, cfg, [], print, masters=masters)
    for name, param in copy_model.named_parameters():
        assert torch.equal(param, masters[name].detach().to(torch.bfloat16)), name
    assert copy_model.model.layers[0].self_attn.q_proj.weight.stride(0) == 1
