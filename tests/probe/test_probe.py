"""`fic probe`: the role switch on three chat templates, perturbations, the judges, the
statistics, and a miniature run end to end on the tiny random model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from scripted import FunctionBackend
from templates import LLAMA3, QWEN25

from fic import tasks
from fic.core.chat import TemplateError, render_chat
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.seeding import derive_seed
from fic.core.stats import sign_test, wilson_interval
from fic.probe.judge import LABELS, LLMJudge, parse_judgement, rule_judge
from fic.probe.report import clustered_rate
from fic.probe.run import (
    ORIGINAL,
    ProbeConfig,
    explicit_question,
    mark_changed,
    probe,
    probe_messages,
    probe_prompt_ids,
    shown_replies,
    truncate,
)

QUERY = ("Ara plays basketball for 4 years. Each year she plays 40 games and scores 21 points per game. "
         "What is her total score over the four years?")
REPLY = "Each year Ara scores 40 * 21 = 840 points. Over 4 years that is 840 * 4 = 3360 points.\n#### 3360"
CUT_REPLY = "Each year Ara scores 40 * 21 = 840 points. Over 4 years that is"

SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
QWEN_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"


@pytest.fixture(scope="module")
def templates(smollm2_tokenizer):
    """name -> tokenizer: SmolLM2's own ChatML, a Llama-3-style and a Qwen-2.5-style template."""
    llama = copy.deepcopy(smollm2_tokenizer)
    llama.chat_template = LLAMA3
    llama.add_tokens(["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                     special_tokens=True)
    llama.bos_token, llama.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    qwen = copy.deepcopy(smollm2_tokenizer)
    qwen.chat_template = QWEN25
    return {"smollm2": smollm2_tokenizer, "llama3": llama, "qwen25": qwen}


def chatml(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def llama(role: str, text: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n{text}<|eot_id|>"


def expected_text(name: str, messages: list[dict], opens: str) -> str:
    """The template's text for `messages` followed by the opening of an `opens` turn."""
    if name == "llama3":
        body = "".join(llama(m["role"], m["content"]) for m in messages)
        return "<|begin_of_text|>" + body + f"<|start_header_id|>{opens}<|end_header_id|>\n"
    default = "" if messages[0]["role"] == "system" else SMOL_SYSTEM if name == "smollm2" else QWEN_SYSTEM
    return default + "".join(chatml(m["role"], m["content"]) for m in messages) + f"<|im_start|>{opens}\n"


# --------------------------------------------------------------------------- the role switch

@pytest.mark.parametrize("name", ["smollm2", "llama3", "qwen25"])
def test_user_turn_switch_opens_a_user_turn(templates, name):
    tokenizer = templates[name]
    messages = probe_messages("user_turn", QUERY, REPLY)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    ids = probe_prompt_ids(tokenizer, "user_turn", messages)
    assert tokenizer.decode(ids) == expected_text(name, messages, "user")
    # The model continues exactly where a real user message would start.
    with_user = render_chat(tokenizer, messages + [{"role": "user", "content": "Why 840?"}]).input_ids
    assert with_user[:len(ids)] == ids
    assert tokenizer.decode(with_user[len(ids):]).startswith("Why 840?")


@pytest.mark.parametrize("name", ["smollm2", "llama3", "qwen25"])
def test_user_turn_switch_keeps_a_system_prompt_when_asked(templates, name):
    tokenizer = templates[name]
    messages = probe_messages("user_turn", QUERY, REPLY, system="Solve step by step.")
    assert messages[0] == {"role": "system", "content": "Solve step by step."}
    ids = probe_prompt_ids(tokenizer, "user_turn", messages)
    assert tokenizer.decode(ids) == expected_text(name, messages, "user")


@pytest.mark.parametrize("name", ["smollm2", "llama3", "qwen25"])
def test_swap_roles_switch_renders_the_history_with_roles_swapped(templates, name):
    tokenizer = templates[name]
    messages = probe_messages("swap_roles", QUERY, REPLY, instruction="You are the user now.")
    assert messages == [{"role": "system", "content": "You are the user now."},
                        {"role": "assistant", "content": QUERY}, {"role": "user", "content": REPLY}]
    ids = probe_prompt_ids(tokenizer, "swap_roles", messages)
    assert tokenizer.decode(ids) == expected_text(name, messages, "assistant")


@pytest.mark.parametrize("name", ["smollm2", "llama3", "qwen25"])
def test_instruct_switch_asks_the_assistant_for_the_users_next_message(templates, name):
    tokenizer = templates[name]
    messages = probe_messages("instruct", QUERY, REPLY)
    (message,) = messages
    assert message["role"] == "user"
    # The transcript keeps both turns in order, then the request.
    body = message["content"]
    assert body.index(f"[user]\n{QUERY}") < body.index(f"[assistant]\n{REPLY}") < body.index("Write the next message")
    ids = probe_prompt_ids(tokenizer, "instruct", messages)
    assert tokenizer.decode(ids) == expected_text(name, messages, "assistant")


def test_user_turn_switch_refuses_a_template_that_rewrites_user_text(smollm2_tokenizer):
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.chat_template = QWEN25.replace("message['content']", "message['content'] | upper")
    with pytest.raises(TemplateError, match="start of a user turn"):
        probe_prompt_ids(tokenizer, "user_turn", probe_messages("user_turn", QUERY, REPLY))


def test_user_turn_switch_on_an_openai_model_is_a_config_error():
    with pytest.raises(FicError, match="switch.*swap_roles or instruct"):
        load_config(ProbeConfig, overrides=["model.kind=openai", "model.model=gpt-x", "switch=user_turn"])
    cfg = load_config(ProbeConfig, overrides=["model.kind=openai", "model.model=gpt-x", "switch=swap_roles"])
    assert cfg.switch == "swap_roles" and cfg.data.source == ["reasoning-gym:gsm_symbolic"]


@pytest.mark.parametrize("override, field", [
    ("perturbations=[truncate,shuffle]", "perturbations[1]"),
    ("temperatures=[]", "temperatures"),
    ("temperatures=[1.0,1.0]", "temperatures"),
    ("truncate_fraction=1.0", "truncate_fraction"),
    ("judge.kind=llm", "judge.backend.model"),
])
def test_bad_probe_settings_name_their_key(override, field):
    with pytest.raises(FicError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_config(ProbeConfig, overrides=["model.model=m", override])


# --------------------------------------------------------------------------- perturbations

@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9])
def test_truncate_keeps_that_share_of_the_reply_tokens(smollm2_tokenizer, fraction):
    ids = smollm2_tokenizer.encode(REPLY, add_special_tokens=False)
    cut = truncate(REPLY, fraction, smollm2_tokenizer)
    assert smollm2_tokenizer.encode(cut, add_special_tokens=False) == ids[:int(len(ids) * fraction)]
    assert REPLY.startswith(cut) and len(cut) < len(REPLY)


def test_truncate_without_a_tokenizer_cuts_words_and_keeps_at_least_one():
    assert truncate("one two three four five six", 0.5) == "one two three"
    assert truncate("alone", 0.5) == "alone"
    assert truncate("", 0.5) == ""


def test_explicit_question_appends_the_question_as_the_last_paragraph():
    shown = explicit_question(REPLY + "\n", "Does that make sense?")
    assert shown == REPLY + "\n\nDoes that make sense?"


def test_shown_replies_apply_every_configured_perturbation(smollm2_tokenizer):
    cfg = load_config(ProbeConfig, overrides=["model.model=m", "truncate_fraction=0.5"])
    shown = shown_replies(REPLY, cfg, "src", "task-1", smollm2_tokenizer)
    assert list(shown) == [ORIGINAL, "truncate", "explicit_question"]
    assert shown[ORIGINAL] == REPLY
    assert shown["truncate"] == truncate(REPLY, 0.5, smollm2_tokenizer)
    question = shown["explicit_question"].split("\n\n")[-1]
    assert question in cfg.explicit_questions and shown["explicit_question"] == explicit_question(REPLY, question)
    # The question is picked per instance (the same instance always gets the same one) ...
    assert shown_replies(REPLY, cfg, "src", "task-1", smollm2_tokenizer) == shown
    picked = {shown_replies(REPLY, cfg, "src", f"task-{i}")["explicit_question"].split("\n\n")[-1]
              for i in range(40)}
    assert len(picked) > 1  # ... and varies across instances
    only_truncate = load_config(ProbeConfig, overrides=["model.model=m", "perturbations=[truncate]"])
    assert list(shown_replies(REPLY, only_truncate, "src", "t")) == [ORIGINAL, "truncate"]


def test_changed_compares_each_perturbed_turn_with_the_unperturbed_one_of_its_draw():
    def turn(condition, temperature, sample, text):
        return {"dataset": "d", "task_id": "t", "condition": condition, "temperature": temperature,
                "sample": sample, "user_turn": text}

    records = [turn(ORIGINAL, 1.0, 0, "Why 840?"), turn(ORIGINAL, 1.0, 1, "Thanks"),
               turn("truncate", 1.0, 0, "Why  840?\n"), turn("truncate", 1.0, 1, "Why 840?")]
    mark_changed(records)
    assert [r["changed"] for r in records] == [None, None, False, True]


# --------------------------------------------------------------------------- the rule judge

# Three or more hand-written user turns per label, after QUERY and REPLY (or the cut-off reply).
HAND_LABELLED = {
    "genuine_follow_up": [
        (REPLY, "Why did you multiply 840 by 4 at the end?"),
        (REPLY, "Hmm, I think she only played 3 of those years, so shouldn't it be 2520?"),
        (CUT_REPLY, "It looks like your message got cut off. What is the total?"),
        (REPLY, "Nice, and how many points is that per month if the season lasts 8 months?"),
    ],
    "restates_query": [
        (REPLY, "Ara plays basketball for 4 years, 40 games a year, 21 points per game. What is her total score "
                "over the four years?"),
        (REPLY, "What is Ara's total score over the four years?"),
        (REPLY, "How many points did Ara score in total across the 4 years of basketball?"),
        (REPLY, "What is the answer to this question: what is Ara's total score over four years?"),
    ],
    "repeats_reply": [
        (REPLY, "Each year Ara scores 40 * 21 = 840 points, and over 4 years that is 840 * 4 = 3360 points."),
        (REPLY, "So the answer is 3360 points."),
        (REPLY, "Over 4 years that is 3360 points in total.\n#### 3360"),
    ],
    "meta_planning": [
        (REPLY, "Let me think about what the user would ask next. They might want to check the multiplication."),
        (REPLY, "The user wants to know whether the answer is right, so I should ask about the second step."),
        (REPLY, "Okay, so first I need to figure out what to say as the user here."),
    ],
    "malformed": [
        (REPLY, ""),
        (REPLY, "User: what is 40 times 21?\nAssistant: 840.\nUser: thanks"),
        (REPLY, "and then and then and then and then and then and then"),
        (REPLY, "}}]] ;; )) == **"),
    ],
    "new_question": [
        (REPLY, "What is the capital of France?"),
        (REPLY, "Can you help me with another problem? A train leaves at 3 pm going 60 miles per hour."),
        (REPLY, "A farmer has 12 cows and buys 7 more each week. How many cows does he have after 5 weeks?"),
        (REPLY, "A bat and a ball together cost $1.10. The bat costs $1.00 more than the ball. How much does the "
                "ball cost?"),
    ],
    "brief_filler": [
        (REPLY, "Thanks!"),
        (REPLY, "Ok, got it."),
        (REPLY, "Great, that makes sense. Thank you so much!"),
    ],
    "other": [
        (REPLY, "I used to play basketball in high school too."),
        (REPLY, "My favourite team is the Chicago Bulls."),
        (REPLY, "It is raining here today and I am bored."),
    ],
}
CASES = [(label, reply, turn) for label, items in HAND_LABELLED.items() for reply, turn in items]


def test_hand_labelled_set_covers_every_label_three_times():
    assert set(HAND_LABELLED) == set(LABELS)
    assert all(len(items) >= 3 for items in HAND_LABELLED.values()) and len(CASES) >= 24


@pytest.mark.parametrize("label, reply, turn", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_judge_labels_hand_written_user_turns(label, reply, turn):
    assert rule_judge(QUERY, reply, turn) == label


# --------------------------------------------------------------------------- the LLM judge

@pytest.mark.parametrize("text, label", [
    ('{"label": "genuine_follow_up", "reason": "asks about a step"}', "genuine_follow_up"),
    ('Sure! ```json\n{"label": "Restates Query"}\n``` hope that helps', "restates_query"),
    ('{"label": "new-question", "reason": "off topic"}', "new_question"),
    ('{"reason": "x", "label": " brief filler. "}', "brief_filler"),
    ("The label is meta_planning.", "meta_planning"),
    ("malformed", "malformed"),
    ('["other"]', "other"),  # not the object asked for, but it names one label and nothing else
])
def test_judge_parser_accepts_usable_answers(text, label):
    assert parse_judgement(text) == label


@pytest.mark.parametrize("text, reason", [
    ("", "empty"),
    ('{"label": "genuine_follo', "no JSON object"),
    ('{"label": "very good"}', "unknown label"),
    ('{"label": 3}', "no 'label' string"),
    ('{"verdict": "other"}', "no 'label' string"),
    ('{"label": ["other", "malformed"]}', "no 'label' string"),
    ("It is either restates_query or repeats_reply.", "several labels named"),
    ("I cannot decide.", "not exactly one label"),
])
def test_judge_parser_rejects_malformed_answers_with_a_reason(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_judgement(text)


def test_llm_judge_retries_with_the_error_then_falls_back_to_the_rule_label():
    seen = []

    def judge_model(messages):
        seen.append(messages)
        turn = messages[1]["content"].split("to judge:\n<<<\n")[1].split("\n>>>")[0]
        if turn == "Why did you multiply 840 by 4?":
            # Garbage first; after being told what was wrong, a valid answer.
            return '{"label": "genuine_follow_up"}' if len(messages) > 2 else "I think it's good"
        return "no idea"  # never usable

    judge = LLMJudge(FunctionBackend(judge_model), "scripted-judge", retries=2)
    items = [(QUERY, REPLY, "Why did you multiply 840 by 4?"), (QUERY, REPLY, "Thanks!"), (QUERY, REPLY, "  ")]
    labels = judge.judge(items)
    assert labels[0] == ("genuine_follow_up", "valid after 1 retry")
    label, note = labels[1]
    assert label == rule_judge(QUERY, REPLY, "Thanks!") == "brief_filler"
    assert note.startswith("rule label used: 3 answers unusable")
    assert labels[2] == ("malformed", None)  # an empty turn never reaches the model
    retry = next(m for m in seen if len(m) > 2)
    assert retry[2] == {"role": "assistant", "content": "I think it's good"}
    assert "could not be used" in retry[3]["content"] and "genuine_follow_up" in retry[3]["content"]
    assert sum(len(m) == 6 for m in seen) == 1  # "Thanks!" was asked three times in all


# --------------------------------------------------------------------------- statistics

def test_wilson_interval_matches_known_values():
    low, high = wilson_interval(0, 20)
    assert low == 0.0 and high == pytest.approx(0.16113, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.23659, abs=1e-4), pytest.approx(0.76341, abs=1e-4))


def test_clustered_rate_counts_agreeing_samples_of_an_instance_once():
    # Four identical samples per instance carry the information of one sample per instance.
    clustered = clustered_rate([[1] * 4] * 5 + [[0] * 4] * 15)
    single = clustered_rate([[1]] * 5 + [[0]] * 15)
    assert clustered["rate"] == single["rate"] == 0.25
    assert (clustered["low"], clustered["high"]) == pytest.approx((single["low"], single["high"]))
    assert clustered["design_effect"] == pytest.approx(4.0)
    # Independent-looking samples (each instance half and half) are not penalised.
    mixed = clustered_rate([[1, 0, 1, 0]] * 20)
    assert mixed["design_effect"] == 1.0 and mixed["n"] == 80
    none = clustered_rate([[0, 0, 0]] * 10)
    assert none["rate"] == 0.0 and none["high"] == pytest.approx(wilson_interval(0, 10)[1])


def test_sign_test_is_exact():
    result = sign_test([1] * 8 + [-1] * 2 + [0] * 5)
    assert (result["better"], result["worse"], result["tied"]) == (8, 2, 5)
    assert result["p_value"] == pytest.approx(2 * (1 + 10 + 45) / 1024)
    assert sign_test([0, 0])["p_value"] == 1.0
    assert sign_test([0.5] * 6)["p_value"] == pytest.approx(2 / 64)


# --------------------------------------------------------------------------- end to end

INSTANCES = [
    {"task_id": "ara", "task": "math", "question": QUERY, "answer": "40*21*4 = 3360\n#### 3360"},
    {"task_id": "tom", "task": "math", "question": "Tom has 4 marbles and gets 3 more. How many does he have?",
     "answer": "4+3 = 7\n#### 7"},
]


def tiny_probe_config(folder: Path, model_dir: Path, *extra: str) -> ProbeConfig:
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in INSTANCES))
    return load_config(ProbeConfig, overrides=[
        f"model.model={model_dir}", "model.device=cpu", "model.kv_reuse_mb=0", f"data.source=jsonl:{data}",
        "temperatures=[0.0,1.0]", "samples=2", "max_new_tokens=8", "replies.max_new_tokens=12",
        f"out={folder / 'probe'}", *extra])


def generations_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "generations.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_model_dir):
    """A miniature probe of the tiny random model: 2 instances, greedy and T=1 (2 samples), both
    perturbations, the rule judge."""
    folder = tmp_path_factory.mktemp("probe")
    cfg = tiny_probe_config(folder, tiny_model_dir)
    return folder, cfg, probe(cfg, progress=False)


@pytest.mark.slow  # end to end: a probe run (module fixture)
def test_miniature_probe_writes_its_report(first_run, smollm2_tokenizer):
    _folder, cfg, metrics = first_run
    out = Path(cfg.out)
    for name in ("report.md", "metrics.json", "generations.jsonl", "replies.jsonl", "config.yaml",
                 "followup_vs_temperature.png", "labels.png"):
        assert (out / name).stat().st_size > 0, name
    generations = generations_of(out)
    # 2 instances x 3 conditions x (1 greedy + 2 samples at T=1).
    assert len(generations) == 2 * 3 * 3
    assert {g["label"] for g in generations} <= set(LABELS)
    replies = {r["task_id"]: r["reply"] for r in map(json.loads, (out / "replies.jsonl").read_text().splitlines())}
    for g in generations:
        assert g["seed"] == (None if g["temperature"] == 0 else derive_seed(0, "probe", 1.0, g["sample"], 0))
        assert (g["changed"] is None) == (g["condition"] == ORIGINAL)
        # The model saw the perturbation the record names (the tiny model shares SmolLM2's tokenizer).
        reply = replies[g["task_id"]]
        shown = {ORIGINAL: reply, "truncate": truncate(reply, 0.5, smollm2_tokenizer)}
        if g["condition"] == "explicit_question":
            assert g["reply_shown"].startswith(reply.rstrip() + "\n\n")
            assert g["reply_shown"].split("\n\n")[-1] in cfg.explicit_questions
        else:
            assert g["reply_shown"] == shown[g["condition"]]
    cells = metrics["datasets"][cfg.data.source[0]]["cells"]
    assert {(c["condition"], c["temperature"]) for c in cells} == {
        (c, t) for c in (ORIGINAL, "truncate", "explicit_question") for t in (0.0, 1.0)}
    assert all(c["follow_up"]["n"] == (2 if c["temperature"] == 0 else 4) for c in cells)
    assert metrics["datasets"][cfg.data.source[0]]["accuracy"]["n"] == 2
    assert json.loads((out / "metrics.json").read_text())["judge"]["kind"] == "rule"
    report = (out / "report.md").read_text()
    assert "judge: rule (offline heuristics" in report and "Wilson" in report
    assert "| explicit_question | 1 |" in report


@pytest.mark.slow  # end to end: two probe runs
def test_a_second_checkpoint_is_paired_with_the_first(first_run, tiny_model_dir):
    folder, cfg, _ = first_run
    out = Path(cfg.out)
    # A second "checkpoint" (the same tiny model, replies read from the first run) against the
    # first as baseline: same instances and samples, so every pair matches.
    second = tiny_probe_config(folder, tiny_model_dir, f"baseline={out}", f"out={folder / 'probe2'}",
                               f"replies.path={out / 'replies.jsonl'}")
    compared = probe(second, progress=False)
    rows = compared["comparison"]["follow_up"]
    assert len(rows) == 6 and all(r["instances"] == 2 for r in rows)
    # Same model, same replies, same seeds: the same turns, so no difference anywhere.
    assert [g["user_turn"] for g in generations_of(folder / "probe2")] == [g["user_turn"] for g in generations_of(out)]
    assert all(r["difference"] == 0 and r["p_value"] == 1.0 for r in rows)
    assert "## Against the baseline checkpoint" in (folder / "probe2" / "report.md").read_text()

    changed = tiny_probe_config(folder, tiny_model_dir, f"baseline={out}", "samples=3", f"out={folder / 'p3'}")
    with pytest.raises(FicError, match="samples: 2 there, 3 here"):
        probe(changed, progress=False)


@pytest.mark.slow  # end to end: a probe run (module fixture)
def test_samples_are_separate_draws_and_greedy_is_one(first_run):
    _, cfg, _ = first_run
    generations = generations_of(Path(cfg.out))
    by_draw = {}
    for g in generations:
        by_draw.setdefault((g["task_id"], g["condition"], g["temperature"]), []).append(g)
    for (task_id, condition, temperature), draws in by_draw.items():
        assert sorted(g["sample"] for g in draws) == ([0] if temperature == 0 else [0, 1])
        if temperature > 0:  # two seeds, two different samples (the tiny model samples noise)
            assert draws[0]["seed"] != draws[1]["seed"] and draws[0]["user_turn"] != draws[1]["user_turn"]


def test_replies_file_without_an_instance_is_an_error(tmp_path, tiny_model_dir):
    replies = tmp_path / "replies.jsonl"
    replies.write_text(json.dumps({"task_id": "ara", "reply": "3360"}) + "\n")
    cfg = tiny_probe_config(tmp_path, tiny_model_dir, f"replies.path={replies}")
    with pytest.raises(FicError, match="no reply for task_id 'tom'"):
        probe(cfg, progress=False)


def test_cli_runs_the_probe(tmp_path, tiny_model_dir, capsys):
    from fic.cli.main import main

    cfg = tiny_probe_config(tmp_path, tiny_model_dir)
    code = main(["probe", f"model.model={tiny_model_dir}", "model.device=cpu", f"data.source={cfg.data.source[0]}", "data.limit=1",
                 "temperatures=[0.0]", "max_new_tokens=4", "replies.max_new_tokens=4", f"out={cfg.out}", "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| genuine follow-ups [95% CI]" in printed and f"report: {cfg.out}/report.md" in printed
    assert main(["probe", "model.model=m", "perturbations=[shuffle]"]) == 2


@pytest.mark.slow  # end to end: a probe run
def test_llm_judge_run_states_the_judge_and_its_fallbacks(tmp_path, tiny_model_dir):
    # The tiny random model as judge never answers with a label, so every label falls back.
    cfg = tiny_probe_config(tmp_path, tiny_model_dir, "data.limit=1", "temperatures=[1.0]", "samples=1", "judge.kind=llm",
                            f"judge.backend.model={tiny_model_dir}", "judge.backend.device=cpu",
                            "judge.backend.kv_reuse_mb=0", "judge.retries=1", "judge.max_new_tokens=4")
    metrics = probe(cfg, progress=False)
    assert metrics["judge"]["kind"] == "llm" and metrics["judge"]["labelled"] == 3
    notes = [g["judge_note"] for g in generations_of(Path(cfg.out)) if g["user_turn"].strip()]
    assert notes and metrics["judge"]["fallbacks"] == len(notes)
    assert all(note.startswith("rule label used: 2 answers unusable") for note in notes)
    report = (Path(cfg.out) / "report.md").read_text()
    assert f"judge: llm ({tiny_model_dir}, JSON answers, 1 retries, then the rule label)" in report


def test_each_source_is_its_own_dataset_even_with_shared_task_ids(tmp_path, tiny_model_dir):
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(INSTANCES[0]) + "\n")
    sources = [f"jsonl:{tmp_path / 'a.jsonl'}", f"jsonl:{tmp_path / 'b.jsonl'}"]
    cfg = tiny_probe_config(tmp_path, tiny_model_dir, f"data.source=[{sources[0]}, {sources[1]}]", "temperatures=[0.0]",
                            "perturbations=[truncate]", "max_new_tokens=4", "replies.max_new_tokens=4")
    metrics = probe(cfg, progress=False)
    assert list(metrics["datasets"]) == sources
    assert all(len(figures["cells"]) == 2 and figures["accuracy"]["n"] == 1 for figures in metrics["datasets"].values())
    generations = generations_of(Path(cfg.out))
    assert sorted((g["dataset"], g["condition"]) for g in generations) == sorted(
        (s, c) for s in sources for c in (ORIGINAL, "truncate"))
    assert all(g["changed"] is not None for g in generations if g["condition"] == "truncate")


def test_replies_file_matches_by_source_then_by_a_unique_task_id(tmp_path):
    from fic.core.instance import Instance
    from fic.probe.run import _replies_from_file

    path = tmp_path / "replies.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"dataset": "old-name", "task_id": "ara", "reply": "3360", "finish_reason": "length"},
        {"dataset": "src-a", "task_id": "tom", "reply": "7 (a)"},
        {"dataset": "src-b", "task_id": "tom", "reply": "7 (b)"}]))
    ara, tom = Instance("ara", "math", []), Instance("tom", "math", [])
    got = _replies_from_file(str(path), [("src-a", ara), ("src-a", tom), ("src-b", tom)])
    assert got == {("src-a", "ara"): ("3360", "length"), ("src-a", "tom"): ("7 (a)", "stop"),
                   ("src-b", "tom"): ("7 (b)", "stop")}
    with pytest.raises(FicError, match="no reply for task_id 'tom' of src-c"):
        _replies_from_file(str(path), [("src-c", tom)])  # two candidates, neither from src-c
    path.write_text(json.dumps({"task_id": "ara", "reply": 3360}) + "\n")
    with pytest.raises(FicError, match=r"record 1: field 'reply': expected the reply as text"):
        _replies_from_file(str(path), [("src-a", ara)])


def test_single_turn_replies_see_the_instances_own_system_prompt():
    """An actions instance's tools live in its system prompt: without them the demo's model scored
    0 of 20 in the probe against 65% in `fic eval`."""
    from fic.data.actions_gen import generate
    from fic.data.sources import read_instance
    from fic.probe.run import single_turn_replies

    instance = read_instance(generate("test", 1, seed=0)[0])
    seen = []

    def model(messages):
        seen.append(messages[0]["content"])
        return tasks.get("actions").reference_answer(instance)

    cfg = load_config(ProbeConfig, None, ["data.task=actions", "model.model=scripted"])
    (record,) = single_turn_replies(cfg, FunctionBackend(model), [("gen", instance)], None, progress=False)
    tool = instance.fields["function"][0]["name"]
    assert tool in seen[0] and tool in record["system"]
    assert record["score"] == 1.0


def test_a_saved_user_turn_of_the_wrong_type_is_refused_at_resume_before_any_model_call(tmp_path, tiny_model_dir,
                                                                                       monkeypatch):
    """A hand-edited user_turns.jsonl (a string call number) was a traceback, or a silent remake."""
    from fic.probe import run

    cfg = tiny_probe_config(tmp_path, tiny_model_dir)
    out = Path(cfg.out)
    out.mkdir()
    run.check_resume(out, cfg)
    good = {"call": 0, "dataset": "d", "task_id": "ara", "condition": ORIGINAL, "temperature": 0.0, "sample": 0,
            "seed": None, "reply_shown": "r", "user_turn": "u"}
    (out / run.TURNS_NAME).write_text(json.dumps(good) + "\n" + json.dumps({**good, "call": "3"}) + "\n")
    monkeypatch.setattr(run, "make_backend", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(FicError) as err:
        probe(cfg, progress=False)
    assert str(err.value) == (f"{out / run.TURNS_NAME}: line 2: field 'call': expected a call number, got '3'; this "
                              "saved user turn cannot be resumed (delete the line to make it again, or use another out=)")
    (out / run.TURNS_NAME).write_text(json.dumps({**good, "user_turn": 7}) + "\n")
    with pytest.raises(FicError, match="line 1: field 'user_turn': expected a string, got 7"):
        probe(cfg, progress=False)
