"""Chat rendering: masks, the prefix rules and token-in/token-out continuation.

Runs on the real SmolLM2 ChatML template and on Llama-3-style and Qwen-style templates
written here, installed on copies of the SmolLM2 tokenizer.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest
from templates import COUNTING, DROPS_ASSISTANT, LLAMA3, LLAMA3_REAL, NO_END_OF_TURN, QWEN3_THINK, QWEN25, THINK_PROMPT

from fic.core.chat import (
    PROBE_CONVERSATION,
    Rendered,
    TemplateError,
    check_template,
    continue_ids,
    end_of_turn_ids,
    format_masks,
    prompt_ids,
    render_chat,
)
from fic.core.errors import FicError

GOOD = ("smollm2", "llama3", "qwen25")
END_OF_TURN_TEXT = {"smollm2": "<|im_end|>", "llama3": "<|eot_id|>", "qwen25": "<|im_end|>"}

CONVERSATION = [
    {"role": "system", "content": "You solve problems step by step."},
    {"role": "user", "content": "Tom has 4 marbles."},
    {"role": "assistant", "content": "Noted. What should I compute?"},
    {"role": "user", "content": "He gets 3 more."},
    {"role": "assistant", "content": "Premature guess: 4.", "train": False},
    {"role": "user", "content": "How many marbles does he have now?"},
    {"role": "assistant", "content": "He has 4 + 3 = 7 marbles."},
]


@pytest.fixture(scope="module")
def tokenizers(smollm2_tokenizer):
    """name -> tokenizer with that chat template (copies; the session tokenizer stays as is)."""
    def with_template(template: str | None):
        tokenizer = copy.deepcopy(smollm2_tokenizer)
        if template is not None:
            tokenizer.chat_template = template
        return tokenizer

    def llama3_like(template: str):
        tokenizer = with_template(template)
        tokenizer.add_tokens(["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                             special_tokens=True)
        tokenizer.bos_token, tokenizer.eos_token = "<|begin_of_text|>", "<|eot_id|>"
        return tokenizer

    return {"smollm2": with_template(None), "llama3": llama3_like(LLAMA3), "llama3_real": llama3_like(LLAMA3_REAL),
            "qwen25": with_template(QWEN25),
            "qwen3_think": with_template(QWEN3_THINK), "counting": with_template(COUNTING),
            "think_prompt": with_template(THINK_PROMPT), "no_end_of_turn": with_template(NO_END_OF_TURN),
            "drops_assistant": with_template(DROPS_ASSISTANT)}


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of ones."""
    out, start = [], None
    for k, bit in enumerate(mask + [0]):
        if bit and start is None:
            start = k
        elif not bit and start is not None:
            out.append((start, k))
            start = None
    return out


def decoded_runs(tokenizer, rendered: Rendered, mask: list[int]) -> list[str]:
    return [tokenizer.decode(rendered.input_ids[a:b]) for a, b in runs(mask)]


@pytest.mark.parametrize("name", GOOD)
def test_masks_cover_assistant_content_and_end_of_turn(tokenizers, name):
    tokenizer, eot = tokenizers[name], END_OF_TURN_TEXT[name]
    rendered = render_chat(tokenizer, CONVERSATION)
    assert len(rendered.input_ids) == len(rendered.assistant_mask) == len(rendered.final_mask)
    # The ids are the template text tokenised once, without extra special tokens.
    text = tokenizer.apply_chat_template([{k: v for k, v in m.items() if k != "train"} for m in CONVERSATION],
                                         tokenize=False)
    assert rendered.input_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert decoded_runs(tokenizer, rendered, rendered.assistant_mask) == [
        "Noted. What should I compute?" + eot, "He has 4 + 3 = 7 marbles." + eot]
    assert decoded_runs(tokenizer, rendered, rendered.final_mask) == ["He has 4 + 3 = 7 marbles." + eot]
    # The untrained turn is still in the context.
    assert "Premature guess: 4." + eot in tokenizer.decode(rendered.input_ids)


def test_llama3_template_has_a_single_bos(tokenizers):
    tokenizer = tokenizers["llama3"]
    ids = render_chat(tokenizer, CONVERSATION).input_ids
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1


@pytest.mark.parametrize("name", GOOD)
def test_masks_start_where_generation_starts(tokenizers, name):
    """The model generates after prompt_ids(messages[:i]); each assistant mask starts right there."""
    tokenizer = tokenizers[name]
    rendered = render_chat(tokenizer, CONVERSATION)
    starts = {}  # message index -> where the model starts generating that turn
    for i, message in enumerate(CONVERSATION):
        if message["role"] == "assistant":
            prompt = prompt_ids(tokenizer, CONVERSATION[:i])
            assert rendered.input_ids[:len(prompt)] == prompt
            starts[i] = len(prompt)
    assert [a for a, _ in runs(rendered.assistant_mask)] == [starts[2], starts[6]]  # message 4 is train: false
    assert [a for a, _ in runs(rendered.final_mask)] == [starts[6]]


@pytest.mark.parametrize("name", GOOD)
@pytest.mark.parametrize("cut_off", [False, True])
def test_continue_ids_equals_rendering_the_text(tokenizers, name, cut_off):
    """Simulate a conversation turn by turn from 'generated' ids; the result must be the
    ids of the text conversation. A reply cut off before its end-of-turn token is closed
    the way the template closes it."""
    tokenizer, eot = tokenizers[name], END_OF_TURN_TEXT[name]
    eot_id = tokenizer.convert_tokens_to_ids(eot)
    conversation = [*CONVERSATION[:4], {"role": "assistant", "content": "So 7."}, CONVERSATION[5]]
    ids = prompt_ids(tokenizer, conversation[:2])
    messages = conversation[:2]
    for i in (2, 4):
        reply = tokenizer(conversation[i]["content"], add_special_tokens=False)["input_ids"]
        ids = ids + reply + ([] if cut_off else [eot_id])
        messages = messages + [conversation[i]]
        before = len(ids)
        ids = continue_ids(tokenizer, messages, ids, [conversation[i + 1]])
        messages = messages + [conversation[i + 1]]
        if name == "smollm2" and not cut_off:  # ChatML writes "\n" after <|im_end|>: it belongs to the delta
            assert tokenizer.decode(ids[before:before + 2]) == "\n<|im_start|>"
    assert ids == prompt_ids(tokenizer, conversation)


def test_no_assistant_turn_gives_empty_masks(tokenizers):
    rendered = render_chat(tokenizers["smollm2"], CONVERSATION[:2])
    assert rendered.input_ids and not any(rendered.assistant_mask) and not any(rendered.final_mask)


def test_bad_train_flags_are_user_errors(tokenizers):
    tokenizer = tokenizers["smollm2"]
    with pytest.raises(FicError, match=r"final assistant turn \(message 5\) has train: false"):
        render_chat(tokenizer, CONVERSATION[:5])
    with pytest.raises(FicError, match="nothing to train"):
        render_chat(tokenizer, [*CONVERSATION[:2], {**CONVERSATION[2], "train": False}])
    with pytest.raises(FicError, match="'train' must be true or false"):
        render_chat(tokenizer, [*CONVERSATION[:2], {**CONVERSATION[2], "train": "no"}])


def test_think_stripping_template_breaks_the_prefix_rule(tokenizers):
    tokenizer = tokenizers["qwen3_think"]
    thinking = [CONVERSATION[1], {"role": "assistant", "content": "<think>\nWait for the question.\n</think>\n\nOK."},
                CONVERSATION[3], {"role": "assistant", "content": "7."}]
    with pytest.raises(TemplateError, match=r"prefix rule at message 2 \(assistant\).*<think>") as err:
        render_chat(tokenizer, thinking)
    assert "later messages change" in str(err.value)
    # Without a think block nothing is rewritten, so the same template renders fine.
    plain = [thinking[0], {"role": "assistant", "content": "OK."}, *thinking[2:]]
    assert sum(render_chat(tokenizer, plain).final_mask) > 0
    problems = check_template(tokenizer)
    assert len(problems) == 1 and "prefix rule" in problems[0]


def test_template_that_counts_messages_breaks_the_prefix_rule(tokenizers):
    with pytest.raises(TemplateError, match="changes earlier text: .*Conversation of"):
        render_chat(tokenizers["counting"], CONVERSATION)
    assert check_template(tokenizers["counting"])
    with pytest.raises(TemplateError, match="prefix rule"):
        continue_ids(tokenizers["counting"], CONVERSATION[:3], [1, 2, 3], CONVERSATION[3:4])


def test_generation_prompt_must_match_the_rendered_turn(tokenizers):
    with pytest.raises(TemplateError, match="generation prompt is not how the template starts this turn"):
        render_chat(tokenizers["think_prompt"], CONVERSATION)


def test_tokens_merging_across_the_turn_boundary_are_detected(tokenizers):
    with pytest.raises(TemplateError, match="text is a prefix but the tokens are not"):
        render_chat(tokenizers["llama3_real"], CONVERSATION)


def test_assistant_turn_without_end_of_turn_token_is_rejected(tokenizers):
    with pytest.raises(TemplateError, match=r"message 3 \(assistant\) without an end-of-turn token.*<\|im_end\|>"
                                            r".*never learns to stop"):
        render_chat(tokenizers["no_end_of_turn"], CONVERSATION)
    assert "end-of-turn" in check_template(tokenizers["no_end_of_turn"])[0]


def test_assistant_turn_rendered_as_nothing_is_rejected(tokenizers):
    with pytest.raises(TemplateError, match="as no tokens at all.*mask would be empty"):
        render_chat(tokenizers["drops_assistant"], CONVERSATION)


@pytest.mark.parametrize("name", GOOD)
def test_check_template_accepts_good_templates(tokenizers, name):
    assert check_template(tokenizers[name]) == []


def test_check_template_without_template(tokenizers):
    tokenizer = copy.deepcopy(tokenizers["smollm2"])
    tokenizer.chat_template = None
    assert "no chat template" in check_template(tokenizer)[0]
    with pytest.raises(TemplateError, match="cannot render"):
        render_chat(tokenizer, CONVERSATION)


def test_end_of_turn_ids(tokenizers):
    smol, llama3 = tokenizers["smollm2"], tokenizers["llama3"]
    assert end_of_turn_ids(smol) == {smol.convert_tokens_to_ids("<|im_end|>"),
                                     smol.convert_tokens_to_ids("<|endoftext|>")}
    assert llama3.convert_tokens_to_ids("<|eot_id|>") in end_of_turn_ids(llama3)

    class GenerationConfig:
        eos_token_id: ClassVar[list] = [7, 8]  # a list, as transformers' configs hold several ids
    assert {7, 8} <= end_of_turn_ids(smol, GenerationConfig())


def test_format_masks(tokenizers):
    tokenizer = tokenizers["smollm2"]
    rendered = render_chat(tokenizer, PROBE_CONVERSATION)
    text = format_masks(tokenizer, rendered, width=60)
    lines = text.splitlines()
    assert lines[0].startswith(f"{len(rendered.input_ids)} tokens: {sum(rendered.assistant_mask)} in the "
                               f"assistant mask, {sum(rendered.final_mask)} in the final mask")
    body = lines[2:]
    assert all(len(line) <= 60 for line in body)
    assert "[F]     7 | She has 5 apples.<|im_end|>" in body
    assert "[A]       | What would you like to know?<|im_end|>" in body
    assert "[ ]     1 | \\n" in body  # the newline after the final <|im_end|> is not trained
    assert any(line.startswith("[ ]") and "Alice has 3 apples." in line for line in body)
    # Every token is shown exactly once: the runs' counts add up.
    assert sum(int(line[4:9]) for line in body if line[4:9].strip()) == len(rendered.input_ids)


def test_continue_ids_ignores_how_a_noisy_reply_would_retokenise(smollm2_tokenizer):
    """A generated reply whose text starts with the newline the template already ends with would
    break the prefix rule if its text were rendered; continuing only uses its ids."""
    from fic.core.chat import continue_ids, end_of_turn_ids, prompt_ids

    tok = smollm2_tokenizer
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]
    reply_ids = tok("\n\nHello there", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = prompt_ids(tok, opening) + reply_ids
    messages = opening + [{"role": "assistant", "content": "\n\nHello there"}]
    follow_up = {"role": "user", "content": "And then?"}
    continued = continue_ids(tok, messages, ids, [follow_up])
    assert continued[:len(ids)] == ids
    assert reply_ids[-1] in end_of_turn_ids(tok)
    # What follows the reply is exactly what the template writes between turns.
    clean = opening + [{"role": "assistant", "content": "Hello there"}]
    clean_ids = prompt_ids(tok, opening) + tok("Hello there", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert continued[len(ids):] == continue_ids(tok, clean, clean_ids, [follow_up])[len(clean_ids):]


# --------------------------------------------------------------------------- a template is bounded code

def test_a_template_that_loops_is_stopped_at_the_time_bound_naming_its_folder(tokenizers, monkeypatch):
    import time

    from fic.core import chat

    monkeypatch.setattr(chat, "RENDER_SECONDS", 0.5)
    tokenizer = copy.deepcopy(tokenizers["smollm2"])
    tokenizer.chat_template = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                               "{{ messages[0]['content'] }}")
    began = time.monotonic()
    with pytest.raises(TemplateError, match="did not render a conversation of 7 messages within 0.5 s") as err:
        render_chat(tokenizer, CONVERSATION)
    assert time.monotonic() - began < 5  # ran until killed before
    assert err.value.path == tokenizer.name_or_path and err.value.path
    assert render_chat(tokenizers["smollm2"], CONVERSATION).input_ids  # the timer is gone: the next render is plain


def test_a_template_whose_output_is_over_the_bound_is_refused_before_the_tokenizer_reads_it(tokenizers, monkeypatch):
    from fic.core import chat

    monkeypatch.setattr(chat, "MAX_RENDER_CHARS", 10_000)
    tokenizer = copy.deepcopy(tokenizers["smollm2"])
    tokenizer.chat_template = "{% for i in range(1000) %}{{ 'x' * 100 }}{% endfor %}"
    monkeypatch.setattr(type(tokenizer), "__call__", lambda *a, **k: pytest.fail("the tokenizer read it"))
    with pytest.raises(TemplateError, match="as 100,000 characters, more than the 10,000 FiC reads") as err:
        render_chat(tokenizer, CONVERSATION)
    assert err.value.path == tokenizer.name_or_path


def model_with_template(source: Path, folder: Path, template: str) -> Path:
    """A copy of the model folder `source` whose chat template is `template`."""
    shutil.copytree(source, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


RECURSES = "{% macro f(x) %}{{ f(x) }}{% endmacro %}"
CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


@pytest.mark.parametrize("template,message", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "did not render a conversation of 1 messages within 0.5 s (a loop that does not end?)"),
    ("{{ 'x' * 3000000000 }}", "took more than 1,024 MiB of memory to render a conversation of 1 messages"),
    ("{{ messages[0]['role'][0] * 70000000 }}", "rendered a conversation of 1 messages as 70,000,000 characters, more than the "
                             "67,108,864 FiC reads"),
    (RECURSES + "{{ f(1) }}", "cannot render this conversation: maximum recursion depth"),
    ("{% for m in messages %}", "is not valid Jinja (line 1: "),
], ids=["nested-loops", "3-GB-string", "output-past-the-bound", "recursive-macro", "no-parse"])
def test_a_broken_template_is_one_line_naming_the_model_folder_before_any_record(template, message, tiny_model_dir,
                                                                                  tmp_path, capsys, monkeypatch):
    import resource
    import time

    from fic.cli.main import main
    from fic.core import chat

    if "range" in template:  # the loop's case, without waiting the full bound
        monkeypatch.setattr(chat, "RENDER_SECONDS", 0.5)
    folder = model_with_template(tiny_model_dir, tmp_path / "model", template)
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    began = time.monotonic()
    assert main(["masks", "--model", str(folder), "--data", str(data)]) == 2
    assert time.monotonic() - began < 30  # each ran until killed, or crashed the tokenizer, before
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fic masks: error: {folder}: the chat template {message}") and len(err.splitlines()) == 1
    assert str(data) not in err  # the template is at fault, whatever the record
    # the bounds are given back: the process may allocate and be interrupted as before
    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY and len("y" * (1 << 30)) == 1 << 30
    assert chat.signal.getitimer(chat.signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_template_that_recurses_on_some_records_names_the_model_folder_and_the_record(tiny_model_dir, tmp_path,
                                                                                         capsys):
    from fic.cli.main import main

    folder = model_with_template(tiny_model_dir, tmp_path / "model",
                                 RECURSES + "{% if messages | length > 2 %}{{ f(1) }}{% endif %}" + CHATML)
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    assert main(["masks", "--model", str(folder), "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fic masks: error: {folder}: the chat template cannot render this conversation")
    assert err.endswith(f"(rendering record 1 of {data})") and len(err.splitlines()) == 1
