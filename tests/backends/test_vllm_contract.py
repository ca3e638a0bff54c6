"""The vLLM path's contract, with stand-in engine objects (vLLM is GPU-only and not installed here):
the version window checked at start-up, the names and shapes the weight sync pushes, one weight at a
time under ZeRO-3 full fine-tuning, `modules_to_save` refused, and the drift check's trainer forward
on every rank, on a rollout the ranks agreed on."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file

from fic.backends.vllm import SUPPORTED_VLLM, check_version, sync_weights
from fic.core.errors import FicError
from fic.core.model import load_model


def engine(load_weights, generate=None):
    """An object with vLLM's attribute path down to the engine's model (`load_weights`)."""
    model = SimpleNamespace(load_weights=load_weights)
    llm = SimpleNamespace(reset_prefix_cache=lambda: None, generate=generate, llm_engine=SimpleNamespace(
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)))))
    return SimpleNamespace(llm=llm, vllm=SimpleNamespace(SamplingParams=lambda **kw: kw))


def test_versions_outside_the_window_are_refused_in_one_line():
    low, high = SUPPORTED_VLLM
    check_version(low)
    for bad in ("0.10.1", high, "0.19.0", "unknown"):
        with pytest.raises(FicError) as err:
            check_version(bad)
        assert f"vLLM {bad} is installed" in str(err.value) and f"vllm>={low},<{high}" in str(err.value)
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extra = next(line for line in pyproject.read_text().splitlines() if line.startswith("vllm = "))
    assert f'"vllm>={low},<{high}"' in extra  # the extra installs the window the check accepts


def test_full_weights_are_pushed_under_the_checkpoints_names_and_shapes(tiny_model_dir):
    policy = load_model(tiny_model_dir, dtype="float32")
    pushed = {}
    sync_weights(engine(lambda weights: pushed.update({n: tuple(t.shape) for n, t in weights})), policy, [], 0.0,
                 print)
    saved = {n: tuple(t.shape) for n, t in load_file(str(tiny_model_dir / "model.safetensors")).items()}
    assert {n: s for n, s in pushed.items() if n in saved} == saved
    assert set(pushed) - set(saved) <= {"lm_head.weight"}  # tied to the embeddings: the engine re-ties it


def test_zero3_full_fine_tuning_gathers_and_pushes_one_weight_at_a_time(tiny_model_dir, monkeypatch):
    policy = load_model(tiny_model_dir, dtype="float32")
    for p in policy.parameters():
        p.ds_id = 0  # ZeRO-3's mark
    gathered, calls = [], []

    @contextmanager
    def gathered_parameters(params):
        gathered.append(len(params))
        yield

    monkeypatch.setitem(sys.modules, "deepspeed", SimpleNamespace(zero=SimpleNamespace(
        GatheredParameters=gathered_parameters)))
    sync_weights(engine(lambda weights: calls.append([(n, tuple(t.shape)) for n, t in weights])), policy, [], 0.0,
                 print)
    names = [n for n, _ in policy.named_parameters()]
    assert gathered == [1] * len(names) and [c[0][0] for c in calls] == names and all(len(c) == 1 for c in calls)


def test_modules_to_save_are_refused(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(load_model(tiny_model_dir, dtype="float32"),
                            LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    with pytest.raises(FicError, match="cannot push PEFT modules_to_save"):
        sync_weights(engine(lambda weights: list(weights)), policy, [], 0.0, print)


def test_a_rank_without_a_finished_rollout_checks_the_agreed_one(tiny_model_dir):
    """Rank 1 of 2 has no rollout that ended on its end-of-turn token; the main process chose rank
    0's: rank 1 still runs the trainer's forward on it (a ZeRO-3 gather on every rank) and warns."""
    policy = load_model(tiny_model_dir, dtype="float32")
    ids, start = [5, 9, 200, 31, 7, 11], 3
    forwards = []
    policy.register_forward_pre_hook(lambda m, a, k: forwards.append(1), with_kwargs=True)

    class RankOne:
        def gather(self, obj):
            assert obj is None  # nothing of its own to offer

        def share(self, obj):
            return (ids, start)  # what the main process chose

    prompt_logprobs = [None] + [{t: SimpleNamespace(logprob=0.0)} for t in ids[1:]]
    generate = lambda prompts, params, use_tqdm: [SimpleNamespace(prompt_logprobs=prompt_logprobs)]  # noqa: E731
    said = []
    sync_weights(engine(lambda weights: list(weights), generate), policy, [], 0.01, said.append, ranks=RankOne())
    assert forwards == [1] and said and "differs from the trainer's" in said[0]
