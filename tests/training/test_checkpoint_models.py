"""Every checkpoint is also a Hugging Face folder: `step-N/model/` loads with
`AutoModelForCausalLM.from_pretrained` (the adapter for LoRA, with peft) and `fic eval
model.model=OUT/checkpoints/step-N` evaluates it, so step 1 compares with step 2 without a
script; resuming from such a checkpoint still gives the uninterrupted run's losses."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from fic.backends import make_backend
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.generation import BackendConfig
from fic.core.model import check_model_folder
from fic.evaluation.evaluate import EvalConfig, evaluate
from fic.train_sft import train
from fic.training.sft import SFTConfig

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def write_corpus(path, n=8):
    records = [{"id": f"c{i}", "task_id": f"t{i}", "task": "math", "kind": "deferral", "reply_kinds": ["defer", "answer"],
                "messages": [{"role": "user", "content": f"I have {i} apples.", "train": False},
                             {"role": "assistant", "content": "Got it. What else?", "train": True},
                             {"role": "user", "content": "I buy 2 more. How many?", "train": False},
                             {"role": "assistant", "content": f"{i} + 2 = {i + 2}\n#### {i + 2}", "train": True}]}
               for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run(model_dir, corpus, out, *extra):
    return train(load_config(SFTConfig, None, [
        f"model.path={model_dir}", f"data.path={corpus}", f"out={out}", "train.micro_batch_size=2",
        "optim.lr=1e-3", "optim.warmup_steps=0", "logging.wandb=false", "logging.progress=false",
        "train.max_steps=2", "checkpoint.every=1", "checkpoint.keep_last=2", *extra]))


def logits(model, ids):
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


@pytest.mark.slow  # end to end: a training run, then an evaluation of its checkpoint
def test_every_checkpoint_loads_as_a_model_and_fic_eval_takes_it(tiny_model_dir, tmp_path):
    out = tmp_path / "sft"
    result = run(tiny_model_dir, write_corpus(tmp_path / "c.jsonl"), out)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    step1 = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step-1" / "model")
    step2 = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step-2" / "model")
    # the last checkpoint is the final model; the one before differs from it and from the start
    assert torch.allclose(logits(step2, ids), logits(result["model"], ids), atol=1e-5)
    assert not torch.allclose(logits(step1, ids), logits(step2, ids))
    assert not torch.allclose(logits(step1, ids), logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ids))
    assert "step 1" in (out / "checkpoints" / "step-1" / "model" / "README.md").read_text()

    # `fic eval model.model=.../checkpoints/step-1`: the checkpoint stands for its model/ folder
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"question": "Ann has 2 apples. Ben gives her 3 more apples. How many apples does "
                                "Ann have?", "answer": "#### 5"}) + "\n")
    cfg = load_config(EvalConfig, None, [f"model.model={out / 'checkpoints' / 'step-1'}", "model.device=cpu",
                                         f"data.source=jsonl:{data}", "views=[full]", "max_new_tokens=4",
                                         f"out={tmp_path / 'eval-step-1'}"])
    assert evaluate(cfg, progress=False)["conversations"] == 1
    backend = make_backend(cfg.model)
    assert torch.allclose(logits(backend.model, ids), logits(step1, ids), atol=1e-5)


@pytest.mark.slow  # end to end: a LoRA training run
def test_a_lora_checkpoint_holds_its_adapter_which_loads_over_its_base(tiny_model_dir, tmp_path):
    out = tmp_path / "lora"
    result = run(tiny_model_dir, write_corpus(tmp_path / "c.jsonl"), out, "lora.enabled=true", "lora.r=4")
    folder = out / "checkpoints" / "step-2" / "model"
    assert (folder / "adapter_config.json").is_file() and not (folder / "model.safetensors").exists()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    loaded = AutoModelForCausalLM.from_pretrained(folder)  # transformers' peft integration: base + adapter
    assert torch.allclose(logits(loaded, ids), logits(result["model"], ids), atol=1e-5)
    backend = make_backend(BackendConfig(model=str(out / "checkpoints" / "step-2"), device="cpu"))
    assert torch.allclose(logits(backend.model, ids), logits(result["model"], ids), atol=1e-5)
    with pytest.raises(FicError, match="is a LoRA adapter, not a whole model"):
        check_model_folder(out / "checkpoints" / "step-2")  # training from it needs the merged model


@pytest.mark.slow  # end to end: a training run
def test_a_checkpoint_without_its_model_folder_says_what_it_is(tiny_model_dir, tmp_path):
    out = tmp_path / "lean"
    run(tiny_model_dir, write_corpus(tmp_path / "c.jsonl"), out, "checkpoint.model_folder=false")
    step = out / "checkpoints" / "step-1"
    assert (step / "complete").is_file() and not (step / "model").exists()
    with pytest.raises(FicError, match="a training checkpoint without model/"):
        check_model_folder(step)
    with pytest.raises(FicError, match=r"a training run into .*missing writes it"):
        check_model_folder(tmp_path / "missing" / "final")


def disk(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("extra", [[], ["lora.enabled=true", "lora.r=4"]], ids=["full", "lora"])
def test_the_start_line_states_each_checkpoints_disk_and_save_only_model_keeps_the_model_alone(
        tiny_model_dir, tmp_path, extra):
    from fic.training.checkpoints import checkpoint_sizes, find_resume, saving_clause

    corpus = write_corpus(tmp_path / "c.jsonl")
    settings = [f"model.path={tiny_model_dir}", f"data.path={corpus}", "logging.wandb=false", *extra]
    full = load_config(SFTConfig, None, [*settings, f"out={tmp_path / 'full'}"])
    only = load_config(SFTConfig, None, [*settings, f"out={tmp_path / 'only'}", "checkpoint.save_only_model=true"])
    expected, expected_only = checkpoint_sizes(full), checkpoint_sizes(only)
    assert f"each checkpoint about {expected['total'] / 1e9:.2f} GB on disk" in saving_clause(full)
    assert f"each checkpoint about {expected_only['total'] / 1e9:.2f} GB on disk (the model only" in saving_clause(only)

    run(tiny_model_dir, corpus, tmp_path / "full", *extra, "train.max_steps=1")
    run(tiny_model_dir, corpus, tmp_path / "only", *extra, "train.max_steps=1", "checkpoint.save_only_model=true")
    written, written_only = (tmp_path / "full/checkpoints/step-1"), (tmp_path / "only/checkpoints/step-1")
    tokenizer = disk(tiny_model_dir) - sum(p.stat().st_size for p in tiny_model_dir.glob("model*.safetensors"))
    # the estimate counts tensors; the files add the tokenizer, JSON and headers
    assert expected["total"] <= disk(written) <= expected["total"] + tokenizer + 200_000
    assert expected_only["total"] <= disk(written_only) <= expected_only["total"] + tokenizer + 100_000
    assert disk(written_only) - tokenizer < (disk(written) - tokenizer) / 2
    assert sorted(p.name for p in written_only.iterdir()) == [".fic-run", "complete", "model", "trainer_state.json"]
    assert AutoModelForCausalLM.from_pretrained(written_only / "model") if not extra else (
        (written_only / "model" / "adapter_config.json").is_file())
    with pytest.raises(FicError, match="holds the model only") as err:
        find_resume(tmp_path / "only")
    assert err.value.field == "resume"
    find_resume(tmp_path / "full")


def test_save_only_model_needs_the_model_folder():
    with pytest.raises(FicError, match="needs checkpoint.model_folder=true"):
        load_config(SFTConfig, None, ["logging.wandb=false", "checkpoint.save_only_model=true",
                                      "checkpoint.model_folder=false"])
