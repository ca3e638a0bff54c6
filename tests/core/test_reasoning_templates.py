"""Chat templates that rewrite history (Qwen3, Qwen3.5) train through a training variant
(`fic.core.templates`): the real templates (tests/chat_templates) on a tiny random Qwen3 with a
Qwen-style tokenizer, through `fic masks`, one SFT step and one VASD step, the masks covering only
the assistant's own tokens; what no variant fixes is refused with both reasons."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
import torch
from templates import COUNTING

from fic.cli.main import main
from fic.core import templates as training_templates
from fic.core.chat import check_template, render_chat
from fic.core.errors import FicError
from fic.core.model import load_template_checked_tokenizer, load_tokenizer
from fic.core.optional import installed

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests" / "chat_templates"
RECIPES = ROOT / "recipes" / "smollm2-135m-instruct"
# Qwen2's pre-tokenizer (Qwen3 and Qwen3.5 use it): newlines are their own pieces, so "\n\n" before a
# word stays one token, as the real Qwen tokenizer has it (GPT-2's rule splits it there).
QWEN_PRE_TOKENIZER = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                                           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}

CONVERSATION = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Ann has 3 pens."},
    {"role": "assistant", "content": "Noted. What else?"},
    {"role": "user", "content": "She buys 2 more. How many does she have?"},
    {"role": "assistant", "content": "3 + 2 = 5\n#### 5"},
]

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture(scope="module")
def qwen_tokenizer_dir(tmp_path_factory, smollm2_dir) -> Path:
    """SmolLM2's vocabulary behind Qwen2's pre-tokenizer, with Qwen's <think> and </think> (added,
    not special, as Qwen3's tokenizer has them) and no chat template yet."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads((smollm2_dir / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = QWEN_PRE_TOKENIZER
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")
    tokenizer.add_tokens(["<think>", "</think>"])
    out = tmp_path_factory.mktemp("qwen-tokenizer")
    tokenizer.save_pretrained(out)
    return out


def tiny_qwen3(folder: Path, tokenizer_dir: Path, template: str) -> Path:
    """A tiny random Qwen3 (hidden 64, 2 layers) with the Qwen-style tokenizer and `template`."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.chat_template = template
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5_nothink", "qwen3_5_think"])
def qwen_model(request, tmp_path_factory, qwen_tokenizer_dir) -> tuple[str, Path]:
    name = request.param
    folder = tmp_path_factory.mktemp(f"tiny-{name}")
    return name, tiny_qwen3(folder, qwen_tokenizer_dir, (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"))


def saved_template(folder: Path) -> str:
    """The chat template a model folder holds (chat_template.jinja, or tokenizer_config.json's)."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    return json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]


def assistant_spans(tokenizer, rendered) -> list[str]:
    """The text of each run of masked tokens."""
    spans, current = [], []
    for token, bit in zip(rendered.input_ids, rendered.assistant_mask):
        if bit:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current)), current.clear()
    if current:
        spans.append(tokenizer.decode(current))
    return spans


# --------------------------------------------------------------------------- the variant

def test_the_real_templates_break_the_prefix_rule_as_they_are(qwen_model):
    from transformers import AutoTokenizer

    _, folder = qwen_model
    own = AutoTokenizer.from_pretrained(folder)
    problem = check_template(own)[0]
    assert "breaks the prefix rule" in problem


def test_fics_variant_is_adopted_and_says_why(qwen_model):
    name, folder = qwen_model
    tokenizer = load_tokenizer(folder)
    note = training_templates.template_note(tokenizer)
    assert note.startswith("chat template: FiC's training variant (every assistant turn rendered as the last one is")
    assert "because the model's own breaks FiC's rules: chat template breaks the prefix rule" in note
    assert ("thinking off" in note) == (name == "qwen3_5_think")  # thinking on by default: its prompt opens <think>
    assert check_template(tokenizer) == []
    assert saved_template(folder) == (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")  # in memory only


def test_the_masks_cover_only_the_assistants_own_tokens(qwen_model):
    name, folder = qwen_model
    tokenizer = load_tokenizer(folder)
    rendered = render_chat(tokenizer, CONVERSATION)
    # each reply as the model writes it after its generation prompt, and its end-of-turn token: nothing else
    think = "<think>\n\n</think>\n\n" if name == "qwen3" else ""  # Qwen3.5's prompt writes the closed block itself
    assert assistant_spans(tokenizer, rendered) == [f"{think}Noted. What else?<|im_end|>",
                                                    f"{think}3 + 2 = 5\n#### 5<|im_end|>"]
    text = tokenizer.decode(rendered.input_ids)
    for message in CONVERSATION[:2] + CONVERSATION[3:4]:
        assert message["content"] in text
    # the earlier reply keeps its reasoning block once a user speaks after it
    reasoning = [*CONVERSATION[:2], {"role": "assistant", "content": "<think>\nNo question yet.\n</think>\n\nNoted."},
                 *CONVERSATION[3:]]
    if name != "qwen3":  # thinking off: a reply with reasoning is not one this model writes, and is refused
        with pytest.raises(FicError, match="generation prompt is not how the template starts"):
            render_chat(tokenizer, reasoning)
    else:
        assert "No question yet." in assistant_spans(tokenizer, render_chat(tokenizer, reasoning))[0]


def test_fic_masks_shows_the_variant_and_the_assistant_spans(qwen_model, tmp_path, capsys):
    _, folder = qwen_model
    data = tmp_path / "c.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    assert main(["masks", "--model", str(folder), "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fic masks: chat template: FiC's training variant (")
    trained = "".join(found.group(1) for line in out.splitlines() if (found := re.match(r"\[[AF]\] [ \d]{5} \| (.*)", line)))
    assert "Noted. What else?<|im_end|>" in trained and "#### 5<|im_end|>" in trained
    for context in ("Ann has 3 pens", "She buys 2 more", "careful assistant", "<|im_start|>"):
        assert context not in trained


def test_what_no_variant_fixes_is_refused_with_both_reasons(tmp_path, smollm2_dir):
    folder = tmp_path / "counting"
    folder.mkdir()
    for path in smollm2_dir.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens_map")):
            (folder / path.name).write_bytes(path.read_bytes())
    (folder / "chat_template.jinja").write_text(COUNTING)
    (folder / "config.json").write_text("{}")
    with pytest.raises(FicError) as caught:
        load_template_checked_tokenizer(folder)
    message = str(caught.value)
    assert "the chat template cannot be trained on: chat template breaks the prefix rule" in message
    assert "no training variant for it" in message or "neither FiC nor TRL has a training variant for it" in message
    assert training_templates.template_note(load_tokenizer(folder)) is None  # the evaluation keeps the own template


@pytest.mark.skipif(not installed("trl"), reason="TRL's training templates need trl")
def test_trls_training_template_is_the_fallback_checked_by_the_same_rules(qwen_model, monkeypatch):
    name, folder = qwen_model
    monkeypatch.setattr(training_templates, "fic_variants", lambda template: [])
    tokenizer = load_tokenizer(folder)
    note = training_templates.template_note(tokenizer)
    if name == "qwen3_5_think":  # TRL keeps thinking on: a reply without reasoning cannot follow its prompt
        assert note is None
        problems = training_templates.template_problems(tokenizer)
        assert "TRL's variant" in problems[1] and "fails too" in problems[1]
    else:
        assert note.startswith("chat template: TRL's training variant (TRL's training template for the family")
        assert check_template(tokenizer) == []


def test_a_template_that_keeps_the_rules_is_left_alone(smollm2_tokenizer):
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    assert training_templates.adopt_training_template(tokenizer) is None
    assert tokenizer.chat_template == smollm2_tokenizer.chat_template


# --------------------------------------------------------------------------- training on it

@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c.sft.jsonl"
    assert main(["sft-data", "data.source=actions-gen:train", "data.task=actions", "data.limit=6",
                 "exclude.sources=[]", f"out={path}"]) == 0
    return path


@pytest.mark.slow  # one SFT step and one VASD step per template, on a tiny model
def test_one_sft_step_and_one_vasd_step_train_on_the_variant(qwen_model, corpus, tmp_path, capsys):
    _, folder = qwen_model
    sft = tmp_path / "sft"
    assert main(["train", "sft", "--config", str(RECIPES / "sft.yaml"), f"model.path={folder}", f"data.path={corpus}",
                 f"out={sft}", "train.max_steps=1", "train.micro_batch_size=2", "train.grad_accum_steps=1",
                 "logging.progress=false", "logging.wandb=false", "dev.every=0"]) == 0
    out = capsys.readouterr().out
    start = next(line for line in out.splitlines() if line.startswith("fic train sft: "))
    assert "; chat template: FiC's training variant (" in start
    loss = json.loads((sft / "metrics.jsonl").read_text().splitlines()[-1])["loss"]
    assert math.isfinite(loss)
    # the trained model keeps its folder's own template; loading it adopts the same variant again
    assert saved_template(sft / "final") == saved_template(folder)

    vasd = tmp_path / "vasd"
    assert main(["train", "vasd", "--config", str(RECIPES / "vasd.yaml"), f"model.path={sft / 'final'}",
                 "data.source=actions-gen:train", "data.task=actions", "data.limit=4", "exclude.sources=[]",
                 f"regularizer.anchor_path={corpus}", f"out={vasd}", "train.max_steps=1", "train.micro_batch_size=2",
                 "train.grad_accum_steps=1", "rollout.max_new_tokens=8", "loss.keep_truncated=true",
                 "logging.progress=false", "logging.wandb=false", "logging.samples_every=0"]) == 0
    out = capsys.readouterr().out
    start = next(line for line in out.splitlines() if line.startswith("fic train vasd: "))
    assert "; chat template: FiC's training variant (" in start
    figures = json.loads((vasd / "metrics.jsonl").read_text().splitlines()[-1])
    assert figures["step"] == 1 and math.isfinite(figures["loss"])
    assert (vasd / "final" / "config.json").is_file()
