"""The SFT recipe: targets, loss normalisation, resume after SIGKILL, saved models, errors, launch configs."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fic.core.config import load_config
from fic.core.errors import FicError
from fic.train_sft import train
from fic.training.data import IGNORE, collate, render_examples, shift_targets
from fic.training.loop import KILL_ENV
from fic.training.losses import TargetLoss, target_counts, window_backward
from fic.training.sft import SFTConfig

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "smollm2-135m-instruct" / "sft.yaml"
LAUNCH = sorted((ROOT / "launch").glob("*.yaml"))


def conversation(i: int) -> list[dict]:
    """A deferral conversation; every third one has its first reply kept out of the loss."""
    return [
        {"role": "system", "content": "You are a helpful assistant.", "train": False},
        {"role": "user", "content": f"I have {i} apples."},
        {"role": "assistant", "content": "Got it. What else?", "train": i % 3 != 0},
        {"role": "user", "content": "I buy 2 more. How many do I have?"},
        {"role": "assistant", "content": f"{i} + 2 = {i + 2}.\n" * (1 + i % 4) + f"#### {i + 2}", "train": True},
    ]


def write_corpus(path: Path, n: int = 16) -> Path:
    records = [{"id": f"c{i}", "task_id": f"t{i}", "task": "math", "kind": "deferral",
                "messages": conversation(i), "reply_kinds": ["defer", "answer"]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus.sft.jsonl")


def settings(model_dir, corpus_path, out, *extra) -> list[str]:
    return [f"model.path={model_dir}", f"data.path={corpus_path}", f"out={out}", "train.micro_batch_size=2",
            "train.grad_accum_steps=2", "optim.lr=1e-3", "optim.warmup_steps=1", "logging.wandb=false",
            "logging.progress=false", *extra]


def run(*overrides) -> dict:
    return train(load_config(SFTConfig, None, list(overrides)))


def losses(out: Path) -> dict[int, float]:
    """Step -> loss from metrics.jsonl (a step logged twice would show as a missing key count)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len({r["step"] for r in records}) == len(records), "a step is logged twice"
    return {r["step"]: r["loss"] for r in records}


def logits(model, ids):
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


# --------------------------------------------------------------------------- targets


def test_targets_are_trained_assistant_tokens_with_end_of_turn(smollm2_tokenizer):
    tok = smollm2_tokenizer
    messages = conversation(3)  # i % 3 == 0: the first reply is context only
    (example,), skipped = render_examples([{"messages": messages}], tok, max_seq_len=4096, progress=False)
    assert skipped == 0
    ids, targets = example.input_ids, example.targets
    assert len(targets) == len(ids) and targets[-1] == IGNORE
    positions = [t for t, y in enumerate(targets) if y != IGNORE]
    assert all(targets[t] == ids[t + 1] for t in positions)  # next-token targets
    # The trained tokens are the final reply and its end-of-turn token, nothing else.
    assert tok.decode([targets[t] for t in positions]) == messages[4]["content"] + "<|im_end|>"
    assert targets[positions[-1]] == tok.convert_tokens_to_ids("<|im_end|>")

    messages[2]["train"] = True
    (example,), _ = render_examples([{"messages": messages}], tok, max_seq_len=4096, progress=False)
    trained = tok.decode([y for y in example.targets if y != IGNORE])
    assert trained == "Got it. What else?<|im_end|>" + messages[4]["content"] + "<|im_end|>"


def test_targets_follow_the_template_not_chatml(smollm2_tokenizer):
    """Another template (role tags, no ChatML headers): targets are still exactly the replies + end-of-turn."""
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = ("{% for m in messages %}{{ '### ' + m['role'] + ':\n' + m['content'] + '<|im_end|>\n' }}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '### assistant:\n' }}{% endif %}")
    messages = conversation(4)
    (example,), _ = render_examples([{"messages": messages}], tok, max_seq_len=4096, progress=False)
    trained = tok.decode([y for y in example.targets if y != IGNORE])
    assert trained == "Got it. What else?<|im_end|>" + messages[4]["content"] + "<|im_end|>"
    assert "assistant:" not in trained and "apples" not in trained


def test_shift_targets_by_hand():
    assert shift_targets([5, 6, 7, 8], [0, 1, 1, 0]) == [6, 7, IGNORE, IGNORE]


# --------------------------------------------------------------------------- loss


@pytest.mark.slow  # several accumulation windows compared
def test_loss_normalised_over_the_accumulation_window(tiny_model_dir, smollm2_tokenizer):
    """Gradient accumulation 3 with uneven target counts equals one full-logits CE over all targets / count."""
    from accelerate import Accelerator

    from fic.core.model import load_model

    records = [{"messages": conversation(i)} for i in (0, 1, 5, 7, 10)]
    examples, _ = render_examples(records, smollm2_tokenizer, max_seq_len=4096, progress=False)
    batches = [collate(part, smollm2_tokenizer.pad_token_id) for part in (examples[:1], examples[1:3], examples[3:])]
    counts = [int((b["targets"] != IGNORE).sum()) for b in batches]
    assert len(set(counts)) == 3  # uneven on purpose

    torch.manual_seed(0)
    model = load_model(tiny_model_dir, dtype="float32").train()
    reference = copy.deepcopy(model)
    accelerator = Accelerator(gradient_accumulation_steps=3)
    loss_model = accelerator.prepare(TargetLoss(model, chunk_tokens=16))
    figures = window_backward(accelerator, loss_model, batches, [target_counts(b) for b in batches], {"ce": 1.0})
    loss = figures["loss"]
    assert figures["n_ce"] == sum(counts)
    assert figures["n_tokens"] == sum(int(b["attention_mask"].sum()) for b in batches)

    total = 0.0
    for b in batches:  # by hand: full logits, summed CE over the same targets, one division at the end
        full = reference(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        total = total + torch.nn.functional.cross_entropy(
            full.flatten(0, 1), b["targets"].flatten(), ignore_index=IGNORE, reduction="sum")
    want = total / sum(counts)
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name


def test_padding_to_a_multiple_changes_the_shape_not_the_loss_or_gradients(tiny_model_dir, smollm2_tokenizer):
    """`train.pad_to_multiple`: the width rounds up to 64 (fewer distinct shapes for oneDNN to keep
    kernels for); the extra positions are masked and carry no target, so the loss and every
    gradient equal the unpadded batch's."""
    from fic.core.model import load_model

    examples, _ = render_examples([{"messages": conversation(i)} for i in (0, 3, 6)], smollm2_tokenizer,
                                  max_seq_len=4096, progress=False)
    plain = collate(examples, smollm2_tokenizer.pad_token_id)
    padded = collate(examples, smollm2_tokenizer.pad_token_id, 64)
    width = plain["input_ids"].shape[1]
    assert width % 64 and padded["input_ids"].shape[1] == -(-width // 64) * 64
    assert int(padded["attention_mask"].sum()) == int(plain["attention_mask"].sum())
    model = load_model(tiny_model_dir, dtype="float32").train()
    twin = copy.deepcopy(model)
    results = []
    for net, batch in ((model, plain), (twin, padded)):
        loss = TargetLoss(net, chunk_tokens=16)(**batch)["ce"]
        loss.backward()
        results.append(loss.item())
    assert results[1] == pytest.approx(results[0], rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name


def test_lm_head_only_sees_target_rows_in_chunks(tiny_model_dir, smollm2_tokenizer):
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").train()
    examples, _ = render_examples([{"messages": conversation(i)} for i in range(4)], smollm2_tokenizer,
                                  max_seq_len=4096, progress=False)
    batch = collate(examples, smollm2_tokenizer.pad_token_id)
    n_targets = int((batch["targets"] != IGNORE).sum())
    rows = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, args, out: rows.append(args[0].shape))
    loss = TargetLoss(model, chunk_tokens=16)(**batch)["ce"]
    hook.remove()
    assert all(len(shape) == 2 and shape[0] <= 16 for shape in rows)  # never [batch, seq, vocab]
    assert sum(shape[0] for shape in rows) == n_targets < batch["input_ids"].numel()
    full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    want = torch.nn.functional.cross_entropy(full.flatten(0, 1), batch["targets"].flatten(),
                                             ignore_index=IGNORE, reduction="sum")
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    loss.backward()  # chunks recomputed in backward: gradients reach the body
    assert model.get_input_embeddings().weight.grad is not None


@pytest.mark.slow  # end to end: two processes
def test_two_ranks_train_exactly_like_one_rank_with_the_same_global_batch(tiny_model_dir, corpus, tmp_path):
    """DDP over 2 CPU processes (gloo), 2 conversations each, equals 1 process with 4: the loss is
    normalised by the target tokens of all ranks, and DDP's gradient averaging is undone."""
    common = ("train.max_steps=3", "checkpoint.every=0", "train.grad_accum_steps=2")
    one = tmp_path / "one"
    run(*settings(tiny_model_dir, corpus, one, *common, "train.micro_batch_size=4"))
    two = tmp_path / "two"
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "fic" / "train_sft.py"),
                           *settings(tiny_model_dir, corpus, two, *common), "train.micro_batch_size=2"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x 2 conversations" in proc.stdout  # really two processes
    records = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    assert [r["target_tokens"] for r in records] == [r["target_tokens"] for r in expected]
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in expected], abs=1e-5)
    assert [r["grad_norm"] for r in records] == pytest.approx([r["grad_norm"] for r in expected], rel=1e-4)


@pytest.mark.slow  # end to end: a run
def test_every_step_logs_the_peak_memory_so_far(tiny_model_dir, corpus, tmp_path):
    """metrics.jsonl carries the process's peak memory at each step (the curves' memory panel): a
    high-water mark, so it never falls."""
    out = tmp_path / "run"
    run(*settings(tiny_model_dir, corpus, out, "train.max_steps=3", "checkpoint.every=0"))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    peaks = [r["peak_memory_mb"] for r in records]
    assert len(peaks) == 3 and peaks == sorted(peaks) and peaks[0] > 0


# --------------------------------------------------------------------------- resume


@pytest.mark.slow  # end to end: a run killed, then resumed
def test_sigkill_then_resume_gives_the_uninterrupted_losses(tiny_model_dir, corpus, tmp_path):
    common = ("train.max_steps=6", "checkpoint.every=2", "checkpoint.keep_last=2")
    whole = tmp_path / "whole"
    run(*settings(tiny_model_dir, corpus, whole, *common))
    expected = losses(whole)
    assert list(expected) == [1, 2, 3, 4, 5, 6]

    killed = tmp_path / "killed"
    env = {**os.environ, KILL_ENV: "3"}
    proc = subprocess.run([sys.executable, str(ROOT / "fic" / "train_sft.py"),
                           *settings(tiny_model_dir, corpus, killed, *common)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [p.name for p in (killed / "checkpoints").iterdir() if (p / "complete").exists()] == ["step-2"]
    assert not (killed / "final").exists()
    assert list(losses(killed)) == [1, 2, 3]  # step 3 ran but was not checkpointed

    result = run(*settings(tiny_model_dir, corpus, killed, *common, "resume=true"))
    assert losses(killed) == pytest.approx(expected, abs=1e-6)
    assert result["steps"] == 6 and (killed / "final" / "config.json").exists()
    # keep_last, the resumed run rotating the killed run's checkpoints (the same folder's marker)
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == [".fic-run", "step-4", "step-6"]


@pytest.mark.slow  # end to end: a run, resumed
def test_lora_resume_restores_adapter_optimizer_and_dropout_rng(tiny_model_dir, corpus, tmp_path):
    common = ("train.max_steps=4", "checkpoint.every=2", "lora.enabled=true", "lora.r=4", "lora.dropout=0.3")
    first = tmp_path / "first"
    run(*settings(tiny_model_dir, corpus, first, *common))
    # A crash after step 3: the step-4 checkpoint and the final model never got written.
    shutil.rmtree(first / "checkpoints" / "step-4")
    shutil.rmtree(first / "final")
    expected = losses(first)
    run(*settings(tiny_model_dir, corpus, first, *common, "resume=true"))
    assert losses(first) == pytest.approx(expected, abs=1e-6)
    # Adapter-only checkpoints: far smaller than the model.
    ckpt = first / "checkpoints" / "step-4" / "model.safetensors"
    assert ckpt.stat().st_size < (tiny_model_dir / "model.safetensors").stat().st_size / 10


@pytest.mark.slow  # end to end: two processes, killed and resumed
def test_lora_on_two_ranks_checkpoints_the_adapter_and_resumes_to_the_same_losses(tiny_model_dir, corpus, tmp_path):
    """Under DDP the prepared module's parameters are named `module.*` while a checkpoint's state is
    not: the adapter-only checkpoint held no tensor at all and the resume refused it."""
    from safetensors.torch import load_file

    common = ("train.max_steps=4", "checkpoint.every=2", "lora.enabled=true", "lora.r=4", "train.micro_batch_size=1",
              "train.grad_accum_steps=1")
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}

    def two_ranks(out: Path, *extra: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(ROOT / "fic" / "train_sft.py"), *settings(tiny_model_dir, corpus, out, *common),
                               *extra], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]

    out = tmp_path / "two"
    two_ranks(out)
    state = load_file(str(out / "checkpoints" / "step-2" / "model.safetensors"))
    assert state and all("lora_" in name for name in state)  # the adapter, and only the adapter
    expected = losses(out)
    shutil.rmtree(out / "checkpoints" / "step-4")  # killed after step 3
    shutil.rmtree(out / "final")
    two_ranks(out, "resume=true")
    assert losses(out) == pytest.approx(expected, abs=1e-6)


# --------------------------------------------------------------------------- saved models


@pytest.mark.slow  # end to end: a run and its saved model
def test_full_fine_tuning_saves_a_loadable_model(tiny_model_dir, corpus, tmp_path):
    from transformers import AutoModelForCausalLM

    from fic.core.model import load_tokenizer

    out = tmp_path / "full"
    result = run(*settings(tiny_model_dir, corpus, out, "train.max_steps=2", "checkpoint.every=0"))
    saved = AutoModelForCausalLM.from_pretrained(out / "final")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.allclose(logits(saved, ids), logits(result["model"], ids), atol=1e-5)
    assert not torch.allclose(logits(saved, ids), logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ids))
    assert load_tokenizer(out / "final").chat_template == load_tokenizer(tiny_model_dir).chat_template
    card = (out / "final" / "README.md").read_text()
    from fic.core.records import file_sha256
    assert file_sha256(corpus) in card and str(corpus) in card and "full fine-tuning" in card
    assert not (out / "checkpoints").exists()


@pytest.mark.parametrize("extra", [
    ["train.max_steps=1", "checkpoint.every=1", "optim.max_grad_norm=0"],  # weights broken, no loss shows it yet
    ["train.max_steps=3", "checkpoint.every=0", "optim.max_grad_norm=0"],  # the loss of step 2 is NaN
    ["train.max_steps=3", "checkpoint.every=0"],                           # so is the gradient norm
])
@pytest.mark.slow  # end to end: runs that diverge
def test_a_diverging_run_stops_with_a_clear_error_and_saves_no_broken_model(tiny_model_dir, corpus, tmp_path, extra):
    # A finite learning rate large enough to turn every weight into inf/NaN in one update.
    out = tmp_path / "diverged"
    with pytest.raises(FicError, match="diverged") as err:
        run(*settings(tiny_model_dir, corpus, out, *extra), "optim.lr=1e38", "optim.warmup_steps=0")
    assert err.value.field == "optim.lr"
    assert not (out / "final").exists()
    assert not list((out / "checkpoints").glob("step-*")) if (out / "checkpoints").exists() else True


def test_a_second_training_run_into_the_same_folder_fails_before_loading_a_model(tiny_model_dir, corpus, tmp_path,
                                                                                   monkeypatch):
    from locks import held_by_another_process

    from fic.training import loop

    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "run"
    with held_by_another_process(out) as pid, \
            pytest.raises(FicError, match=f"another FiC run is writing into this folder \\(process {pid}"):
        run(*settings(tiny_model_dir, corpus, out, "train.max_steps=1"))
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("text, message", [
    ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
    ('{"a": 1', "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_a_damaged_data_card_is_one_line_before_a_model_loads(tiny_model_dir, corpus, tmp_path, monkeypatch,
                                                              text, message):
    from fic.training import loop

    card = corpus.with_suffix(".card.json")
    card.write_bytes(text if isinstance(text, bytes) else text.encode())
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(FicError, match=f"{message}.*build the corpus again") as err:
        run(*settings(tiny_model_dir, corpus, tmp_path / "run", "train.max_steps=1"))
    assert str(card) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # end to end: a run and its merged model
def test_lora_saves_adapter_and_merged_model(tiny_model_dir, corpus, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lora"
    result = run(*settings(tiny_model_dir, corpus, out, "train.max_steps=2", "checkpoint.every=0",
                           "lora.enabled=true", "lora.r=4", "save_merged=true"))
    assert (out / "final" / "adapter_config.json").exists() and not (out / "final" / "model.safetensors").exists()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    want = logits(result["model"], ids)
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out / "final")
    assert torch.allclose(logits(adapter, ids), want, atol=1e-5)
    merged = AutoModelForCausalLM.from_pretrained(out / "final-merged")
    assert torch.allclose(logits(merged, ids), want, atol=1e-4)
    assert "LoRA" in (out / "final" / "README.md").read_text()


# --------------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def _finished_run_base(tiny_model_dir, tmp_path_factory) -> Path:
    from accelerate.state import AcceleratorState, GradientState

    base = tmp_path_factory.mktemp("finished")
    corpus_path = write_corpus(base / "corpus.sft.jsonl")
    run(*settings(tiny_model_dir, corpus_path, base / "run", "train.max_steps=2", "checkpoint.every=1"))
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    shutil.rmtree(base / "run" / "final")
    return base


@pytest.fixture
def finished_run(_finished_run_base, tiny_model_dir, tmp_path) -> tuple[Path, list[str]]:
    """A copy of a 2-step run with checkpoints at steps 1 and 2 and no final model (killed while saving it)."""
    shutil.copytree(_finished_run_base, tmp_path / "copy")
    out, corpus_path = tmp_path / "copy" / "run", tmp_path / "copy" / "corpus.sft.jsonl"
    return out, settings(tiny_model_dir, corpus_path, out, "train.max_steps=2", "checkpoint.every=1")


def test_resume_without_checkpoints_is_a_clear_error(tiny_model_dir, corpus, tmp_path):
    with pytest.raises(FicError, match="no complete checkpoint"):
        run(*settings(tiny_model_dir, corpus, tmp_path / "empty", "resume=true"))
    (tmp_path / "partial" / "checkpoints" / "step-3").mkdir(parents=True)  # no `complete` marker
    with pytest.raises(FicError, match="only incomplete ones: step-3"):
        run(*settings(tiny_model_dir, corpus, tmp_path / "partial", "resume=true"))


@pytest.mark.slow  # end to end: a finished run (module fixture), then damaged
def test_damaged_checkpoints_are_clear_errors(finished_run, capsys):
    out, args = finished_run
    newest = out / "checkpoints" / "step-2"
    (newest / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(FicError, match="step-2.*damaged"):
        run(*args, "resume=true")
    (newest / "trainer_state.json").write_text("{not json")
    with pytest.raises(FicError, match="step-2.*damaged"):
        run(*args, "resume=true")
    # Without its marker the damaged one is skipped, the run says so and resumes from step 1.
    (newest / "complete").unlink()
    assert run(*args, "resume=true")["steps"] == 2
    assert "passing over step-2 (incomplete: no `complete` marker); resuming from step-1" in capsys.readouterr().out
    assert list(losses(out)) == [1, 2]


@pytest.mark.slow  # end to end: a finished run, resumed
def test_resume_refuses_changed_settings_and_data(finished_run):
    out, args = finished_run
    with pytest.raises(FicError, match="train.micro_batch_size"):
        run(*args, "resume=true", "train.micro_batch_size=3")
    write_corpus(out.parent / "corpus.sft.jsonl", n=15)
    with pytest.raises(FicError, match="data file contents"):
        run(*args, "resume=true")


@pytest.mark.slow  # end to end: a finished run, run again
def test_new_run_refuses_to_overwrite_a_run(finished_run):
    _out, args = finished_run
    with pytest.raises(FicError, match="resume=true"):
        run(*args)


@pytest.mark.parametrize("override, message", [
    ("train.micro_batch_size=0", "train.micro_batch_size"),
    ("optim.schedule=triangle", "optim.schedule"),
    ("save_merged=true", "save_merged"),
    ("optim.betas=[0.9]", "optim.betas"),
    ("no_such_key=1", "no_such_key"),
])
def test_bad_settings_exit_2_with_one_line(override, message, capsys):
    from fic.train_sft import main

    assert main([override]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_bad_corpus_and_model_are_clear_errors(tiny_model_dir, corpus, tmp_path):
    with pytest.raises(FicError, match="not found"):
        run(*settings(tiny_model_dir, tmp_path / "missing.jsonl", tmp_path / "o1"))
    with pytest.raises(FicError, match="model folder"):
        run(*settings(tmp_path / "no-model", corpus, tmp_path / "o2"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": conversation(1)}) + "\n" + json.dumps({"messages": "hi"}) + "\n")
    with pytest.raises(FicError, match="record 2.*messages"):
        run(*settings(tiny_model_dir, bad, tmp_path / "o3"))
    only_users = tmp_path / "users.jsonl"
    only_users.write_text(json.dumps({"messages": conversation(1)[:2]}) + "\n")
    with pytest.raises(FicError, match="record 1.*no trained assistant tokens"):
        run(*settings(tiny_model_dir, only_users, tmp_path / "o4"))
    with pytest.raises(FicError, match="longer than data.max_seq_len"):
        run(*settings(tiny_model_dir, corpus, tmp_path / "o5", "data.max_seq_len=8"))


# --------------------------------------------------------------------------- CLI, recipe, launch configs


@pytest.mark.slow  # end to end: the recipe
def test_fic_train_sft_runs_the_recipe_end_to_end(tiny_model_dir, corpus, tmp_path, monkeypatch):
    from fic.cli.main import main

    monkeypatch.setenv("WANDB_MODE", "disabled")  # the wandb code path runs, nothing is written
    out = tmp_path / "cli"
    code = main(["train", "sft", "--config", str(RECIPE), f"model.path={tiny_model_dir}", f"data.path={corpus}",
                 f"out={out}", "train.max_steps=2", "train.micro_batch_size=2", "train.grad_accum_steps=1",
                 "logging.progress=false"])
    assert code == 0
    assert list(losses(out)) == [1, 2]
    assert (out / "final" / "model.safetensors").exists() and (out / "final" / "README.md").exists()
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["path"] == str(corpus)


def test_launch_configs_parse_with_the_intended_settings():
    from accelerate.commands.config.config_args import load_config_from_file

    names = {p.stem for p in LAUNCH}
    assert {"accelerate_single", "accelerate_multi_gpu", "deepspeed_zero2", "deepspeed_zero3"} <= names
    for path in LAUNCH:
        config = load_config_from_file(str(path))  # every launch YAML parses
        raw = yaml.safe_load(path.read_text())
        # The recipe owns accumulation and clipping; a launch config that set them would override it.
        assert "gradient_accumulation_steps" not in raw.get("deepspeed_config", {})
        assert "gradient_clipping" not in raw.get("deepspeed_config", {})
        if path.stem not in ("accelerate_single", "accelerate_multi_gpu", "deepspeed_zero2", "deepspeed_zero3"):
            continue
        assert config.mixed_precision == "bf16"
        kind = str(config.distributed_type).split(".")[-1]
        if path.stem.startswith("deepspeed"):
            stage = int(path.stem[-1])
            assert kind == "DEEPSPEED" and config.deepspeed_config["zero_stage"] == stage
            assert config.deepspeed_config["offload_optimizer_device"] == "none"
            if stage == 3:
                assert config.deepspeed_config["zero3_save_16bit_model"] is True
                assert config.deepspeed_config["zero3_init_flag"] is True
        else:
            assert kind == {"accelerate_single": "NO", "accelerate_multi_gpu": "MULTI_GPU"}[path.stem]


@pytest.mark.slow  # the benchmark
def test_bench_sft_times_fic_and_trl_on_the_same_batches(tiny_model_dir):
    import argparse

    from fic.bench import sft as bench_sft

    parser = argparse.ArgumentParser()
    bench_sft.add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_model_dir), "--steps", "2", "--warmup", "0",
                              "--micro-batch-size", "2", "--memory-tokens", "64"])
    figures = bench_sft.measure(args)
    assert figures["target_tokens_per_step"] > 0
    assert figures["ratio"] == pytest.approx(figures["fic_target_tokens_per_s"] / figures["trl_target_tokens_per_s"])
    assert "fp32_ratio" not in figures  # the tests' CPU has no fast bf16: FiC runs in float32 already
    # Half of the 64 tokens are targets: FiC builds logits for those rows only.
    assert figures["memory_targets"] == 32
    assert figures["fic_largest_logits_mb"] * 2 == pytest.approx(figures["full_largest_logits_mb"])
    assert figures["fic_saved_mb"] < figures["full_logits_saved_mb"]


@pytest.mark.slow  # the benchmark
def test_bench_sft_json_is_one_object_on_stdout_with_the_roofline(tiny_model_dir, capsys):
    from fic.cli.main import main

    assert main(["bench", "sft", "--json", "--model", str(tiny_model_dir), "--steps", "1", "--warmup", "0",
                 "--micro-batch-size", "2", "--memory-tokens", "0"]) == 0
    figures = json.loads(capsys.readouterr().out)  # TRL's own {'train_runtime': ...} line goes to stderr
    assert figures["precision"] == "fp32"  # the tests' CPU has no fast bf16 (FIC_CPU_FLAGS)
    assert figures["matmul_peak_tflops"] > 0 and 0 < figures["fic_roofline_share"]
    assert figures["matmul_peak_dtype"] == "float32"  # no fast bf16 here: the ceiling is what auto computes in
    assert figures["fic_tflops"] == pytest.approx(figures["fic_roofline_share"] * figures["matmul_peak_tflops"])


@pytest.mark.parametrize("precision, resolved", [("auto", "bf16"), ("bf16_copy", "bf16_copy")])
def test_bench_sft_puts_the_ratios_against_trl_and_float32_in_one_object_where_bf16_is_fast(
        tiny_model_dir, capsys, monkeypatch, precision, resolved):
    """FiC at its precision and in float32, and TRL at bf16, in one process (each prepared under
    its own precision) and in one JSON object."""
    from fic.cli.main import main

    monkeypatch.setenv("FIC_CPU_FLAGS", "avx512_bf16")
    assert main(["bench", "sft", "--json", "--model", str(tiny_model_dir), "--steps", "1", "--warmup", "0",
                 "--micro-batch-size", "2", "--memory-tokens", "0", "--precision", precision, "--also", "bf16"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["precision"] == resolved and figures["trl_precision"] == "bf16"
    assert figures["also_precision"] == "bf16" and figures["also_ratio"] == pytest.approx(
        figures["fic_target_tokens_per_s"] / figures["also_target_tokens_per_s"])
    assert figures["fp32_ratio"] == pytest.approx(figures["fic_target_tokens_per_s"]
                                                  / figures["fic_fp32_target_tokens_per_s"])
    assert figures["ratio"] == pytest.approx(figures["fic_target_tokens_per_s"] / figures["trl_target_tokens_per_s"])
    assert 0 < figures["fic_roofline_share"] and figures["matmul_peak_dtype"] == "bfloat16"


def test_the_rooflines_product_shrinks_only_where_one_would_outlast_its_budget():
    from fic.bench.roofline import product_size

    assert product_size(250e9, 2048, 0.25) == 2048  # AMX's bf16 rate: 2048^3 x 2 in 0.07 s
    small = product_size(1.3e9, 2048, 0.25)  # bf16 emulated without AVX-512 BF16 (measured 1.3 GFLOP/s)
    assert small % 64 == 0 and 2 * small ** 3 / 1.3e9 <= 0.25 < 2 * (small + 64) ** 3 / 1.3e9
    assert product_size(1e3, 2048, 0.25) == 256  # never under the probe's own size


def test_roofline_counts_the_body_attention_and_the_head_on_target_rows_only():
    from fic.bench.roofline import forward_flops, train_flops

    dims = {"body_params": 1000, "layers": 2, "hidden": 8, "vocab": 50}
    assert forward_flops(dims, [3, 5], head_rows=4) == 2 * 1000 * 8 + 2 * 2 * 8 * (9 + 25) + 2 * 8 * 50 * 4
    assert train_flops(dims, [3, 5], 4) == 3 * forward_flops(dims, [3, 5], 4)


@pytest.mark.slow  # end to end: a run
def test_auto_precision_trains_in_bf16_autocast_over_float32_weights_where_bf16_is_fast(
        tiny_model_dir, corpus, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    from fic.cli.main import main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("FIC_CPU_FLAGS", "avx512_bf16")
    out = tmp_path / "bf16"
    assert main(["train", "sft", "--config", str(RECIPE), f"model.path={tiny_model_dir}", f"data.path={corpus}",
                 f"out={out}", "train.max_steps=2", "train.micro_batch_size=2", "logging.progress=false"]) == 0
    assert "float32 master weights, bfloat16 autocast (a CPU with avx512_bf16" in capsys.readouterr().out
    assert all(math.isfinite(v) for v in losses(out).values())
    weights = load_file(str(out / "final" / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.float32}  # master weights saved as they train


def test_length_buckets_read_every_record_once_an_epoch_with_less_padding():
    from fic.training.data import DataOrder

    lengths = [int(x) for x in np.random.default_rng(0).integers(20, 400, size=96)]

    def padding(order):
        batches = [order.micro_batch(k) for k in range(12)]
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches), batches

    plain, _plain_batches = padding(DataOrder(96, 8, 1, 0, seed=3, shuffle=True))
    bucketed, batches = padding(DataOrder(96, 8, 1, 0, seed=3, shuffle=True, lengths=lengths, bucket=4))
    assert sorted(i for b in batches for i in b) == list(range(96))  # one epoch: every record once
    assert bucketed < plain / 3
    again = DataOrder(96, 8, 1, 0, seed=3, shuffle=True, lengths=lengths, bucket=4)
    assert [again.micro_batch(k) for k in range(12)] == batches  # a function of the seed: resumable


@pytest.mark.slow  # several full passes compared
def test_padding_changes_neither_the_loss_nor_the_gradients(tiny_model_dir, smollm2_tokenizer):
    """What bucketing relies on: a conversation padded to a longer one's length trains exactly as
    it does alone (the attention mask and the target-only loss ignore padding)."""
    from fic.core.model import load_model
    from fic.training.data import collate, render_examples
    from fic.training.losses import TargetLoss

    records = [json.loads(line) for line in write_corpus(Path(tempfile.mkdtemp()) / "c.jsonl").read_text()
               .splitlines()[:2]]
    examples, _ = render_examples(records, smollm2_tokenizer, max_seq_len=4096, progress=False)
    assert len(examples[0].input_ids) != len(examples[1].input_ids)
    model = load_model(tiny_model_dir, dtype="float32").double()
    loss = TargetLoss(model, 7)

    def run(groups):
        model.zero_grad()
        total = sum(loss(**collate(g, smollm2_tokenizer.pad_token_id))["ce"] for g in groups)
        total.backward()
        return total.item(), [p.grad.clone() for p in model.parameters()]

    together, alone = run([examples[:2]]), run([examples[:1], examples[1:2]])
    assert together[0] == pytest.approx(alone[0], rel=1e-10)
    assert all(torch.allclose(a, b, rtol=1e-8, atol=1e-12) for a, b in zip(together[1], alone[1]))


def test_the_plateau_rule_reads_the_curve_after_its_best():
    from fic.training.sft import plateau

    assert not plateau([10, 20, 30], patience=2, min_delta=2)  # still rising
    assert plateau([10, 20, 30, 31, 30.5], patience=2, min_delta=2)  # two scores without +2 over 30
    assert not plateau([10, 20, 30, 31, 33], patience=2, min_delta=2)  # 33 is a gain of 3
    assert not plateau([10, 11], patience=2, min_delta=2)  # too short to tell
    assert plateau([0.9, 0.5, 0.49, 0.5], patience=2, min_delta=0.05, higher_is_better=False)


def test_sft_stops_where_its_scripted_dev_curve_flattens(tiny_model_dir, corpus, tmp_path, monkeypatch):
    """dev.every=2 on a scripted dev probe (10, 20, 30, 31, 30.5 at steps 0-8): the run stops at
    step 8 of its cap of 20, saves the model trained so far, and records the curve, the rule and
    the stop in metrics.jsonl, dev_curve.json, curves.png's dev panel and the model card."""
    import fic.train_sft as recipe

    scripted = iter([10.0, 20.0, 30.0, 31.0, 30.5, 99.0])
    seen = []

    def probe(model, tokenizer, data, views, *, max_new_tokens, batch_size, out, prefix):
        seen.append(out.name)
        return {f"{prefix}sharded_P": next(scripted), f"{prefix}sharded_premature_answer_rate": 0.5}

    monkeypatch.setattr(recipe, "evaluate_live", probe)
    out = tmp_path / "run"
    result = run(*settings(tiny_model_dir, corpus, out, "train.max_steps=20", "checkpoint.every=0", "dev.every=2",
                           "dev.data.source=reasoning-gym:gsm_symbolic", "dev.patience=2", "dev.min_delta=2"))
    assert result["steps"] == 8 and seen == [f"step-{k}" for k in (0, 2, 4, 6, 8)]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(9))
    assert [r["dev_sharded_P"] for r in records if "dev_sharded_P" in r] == [10.0, 20.0, 30.0, 31.0, 30.5]
    plateau = json.loads((out / "dev_curve.json").read_text())
    assert plateau["stopped_at"] == 8 and plateau["reason"] == "plateau" and len(plateau["curve"]) == 5
    assert (out / "final" / "config.json").exists() and (out / "curves.png").exists()
    assert "Dev curve (sharded_P on 32 dev instances): 10.0 (step 0)" in (out / "final" / "README.md").read_text()


@pytest.mark.parametrize("override, message", [
    ("dev.every=2", "dev.data.source"),
    ("dev.every=2 dev.data.source=reasoning-gym:gsm_symbolic dev.metric=full_P", "dev.metric"),
    ("dev.every=2 dev.data.source=reasoning-gym:gsm_symbolic dev.metric=sharded_score", "dev.metric"),
])
def test_a_dev_curve_that_cannot_be_read_is_refused_at_load_time(override, message):
    with pytest.raises(FicError) as err:
        load_config(SFTConfig, None, ["train.max_steps=4", *override.split()])
    assert err.value.field == message


def test_the_profile_splits_a_step_by_kind_of_work(tiny_model_dir):
    """`fic bench sft --profile`: one step's operator time by kind; the shares add up to 1 and the
    matrix products are told apart by shape (the tiny model: intermediate 128, its vocabulary)."""
    import argparse

    from fic.bench import sft as bench_sft
    from fic.bench.profile import category

    dims = {"vocab": 49152, "intermediate": 1536}
    assert category("aten::mm", [[8, 576], [576, 1536]], dims) == "MLP"
    assert category("aten::mm", [[8, 576], [49152, 576]], dims) == "LM head"
    assert category("aten::addmm", [[192], [8, 576], [576, 192]], dims) == "attention projections"
    assert category("aten::_fused_adamw_", [], dims) == "optimizer"
    assert category("aten::_to_copy", [[8, 576]], dims) == "casts and copies"
    parser = argparse.ArgumentParser()
    bench_sft.add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_model_dir), "--steps", "1", "--warmup", "0", "--micro-batch-size",
                              "2", "--memory-tokens", "0", "--skip-trl", "--profile", "--set",
                              "train.pad_to_multiple=64"])
    figures = bench_sft.measure(args)
    shares = {k: v for k, v in figures.items() if k.startswith("profile_share_")}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    assert shares["profile_share_MLP"] > 0 and shares["profile_share_LM_head"] > 0
    assert shares["profile_share_attention_projections"] > 0 and shares["profile_share_optimizer"] > 0
    assert 0 < figures["padding_share"] < 1  # widths padded to 64


def test_a_run_that_fails_before_it_trains_leaves_no_new_output_folder(tiny_model_dir, corpus, tmp_path, capsys):
    """The folder is made (and locked) before the corpus is read; a corpus none of whose records
    fit is one line, and the new folder goes again. One that existed stays."""
    from fic.train_sft import main

    out = tmp_path / "new" / "run"
    assert main([f"model.path={tiny_model_dir}", f"data.path={corpus}", f"out={out}", "data.max_seq_len=8",
                 "train.max_steps=1", "logging.wandb=false"]) == 2
    assert "none of the" in capsys.readouterr().err and not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main([f"model.path={tiny_model_dir}", f"data.path={corpus}", f"out={kept}", "data.max_seq_len=8",
                 "train.max_steps=1", "logging.wandb=false"]) == 2
    assert kept.is_dir()
