"""The SFT warm-start corpus: structure of each kind, masks, no leaks, shares, determinism, card."""

import json
import random
import re
from fractions import Fraction
from pathlib import Path

import pytest
from scripted import FunctionBackend

from fic import tasks
from fic.cli.main import main
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.corpus.build import (
    RECOVERY_ACKS,
    SFTDataConfig,
    build_corpus,
    card_paths,
    load_instances,
    make_corpus,
)
from fic.data.views import user_turns
from fic.tasks.deferrals import ACKS, DEFERRALS, GENERIC_ASKS, ask_for

LIC_SAMPLE = Path(__file__).resolve().parents[3] / "shared/data/lost_in_conversation/sample_5_per_task.json"
MATH = tasks.get("math")

# The test's own number reader, independent of fic.tasks.deferrals: digits and common number words.
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                    "thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
WORDS.update({"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
              "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000, "dozen": 12})


def values(text):
    found = {Fraction(m.replace(",", "")) for m in re.findall(r"\d[\d,]*(?:\.\d+)?", text.replace(",", ""))}
    return found | {Fraction(WORDS[w]) for w in re.findall(r"[a-z]+", text.lower()) if w in WORDS}


def config(*overrides, out=None):
    extra = [f"out={out}"] if out else []
    return load_config(SFTDataConfig, None, ["data.source=reasoning-gym:gsm_symbolic", "data.limit=250", *extra, *overrides])


@pytest.fixture(scope="module")
def gym():
    """250 generated problems, sharded by the rule sharder."""
    instances, _ = load_instances(config())
    return instances


@pytest.fixture(scope="module")
def corpus(gym):
    records, _ = make_corpus(gym, config("ask_share=0.5"), progress=False)
    return {r["task_id"]: r for r in records}, {i.task_id: i for i in gym}


def assistant_turns(record):
    return [m for m in record["messages"] if m["role"] == "assistant"]


def test_pools_are_varied_brief_and_hold_no_numbers():
    assert len(set(DEFERRALS)) == len(DEFERRALS) >= 20
    for text in (*DEFERRALS, *GENERIC_ASKS, *ACKS, *RECOVERY_ACKS):
        assert not values(text), text
        assert len(text.split()) <= 12, text


def test_ask_turns_the_next_fact_into_a_question_without_its_number():
    rng = random.Random(0)
    asked = ask_for("she scores 21 points in each game", set(), rng)
    assert "how many points she scores in each game" in asked and "21" not in asked
    assert "how much each pen cost" in ask_for("each pen cost $1.5", set(), rng)
    assert "how many pens you bought" in ask_for("I bought 4 pens.", set(), rng)
    assert ask_for("Robert has a bag of pebbles with 72 inside.", set(), rng).endswith(
        "Robert has a bag of pebbles with how many inside?")
    # Nothing new to ask for, too many numbers, or a number glued to a word: no question.
    assert ask_for("They're twins, so they're all the same size.", set(), rng) is None
    assert ask_for("the lollipops were shared among his 4 friends.", {Fraction(4)}, rng) is None
    assert ask_for("It takes 9 skeins for a shawl, 4 for a hat and 8 for a tunic.", set(), rng) is None
    assert ask_for("a 5-year-old tree produces fruit", set(), rng) is None


def test_each_kind_has_its_structure(corpus):
    records, instances = corpus
    kinds = {r["kind"] for r in records.values()}
    assert kinds == {"deferral", "recovery", "single_turn"}
    for record in records.values():
        instance, messages = instances[record["task_id"]], record["messages"]
        assert messages[0] == {"role": "system", "content": MATH.system_prompt, "train": False}
        roles = [m["role"] for m in messages[1:]]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        users = [m["content"] for m in messages if m["role"] == "user"]
        replies = assistant_turns(record)
        assert len(record["reply_kinds"]) == len(replies)
        assert record["reply_kinds"][-1] == "answer" and replies[-1]["train"]
        assert MATH.score(replies[-1]["content"], instance) == 1.0
        assert all(m["train"] is False for m in messages if m["role"] != "assistant")
        if record["kind"] == "single_turn":
            assert users == user_turns(instance, "full") and replies[-1]["content"] == MATH.gold_reply(instance)
            continue
        assert users == user_turns(instance, "sharded")  # the shards, as `fic eval` plays them
        early = record["reply_kinds"][:-1]
        assert all((kind == "premature") == (not reply["train"]) for kind, reply in zip(early, replies))
        if record["kind"] == "deferral":
            assert set(early) <= {"defer", "ask"}
            assert replies[-1]["content"] == MATH.gold_reply(instance)
        else:
            assert early.count("premature") == 1 and set(early) <= {"defer", "ask", "premature"}
            premature = replies[early.index("premature")]["content"]
            assert "####" in premature and MATH.score(premature, instance) == 0.0
            assert replies[-1]["content"].endswith(MATH.gold_reply(instance))


def check_no_leak(records, instances):
    """No reply before the last shard holds the answer; trained ones hold only numbers already given."""
    checked = 0
    for record in records:
        reference = Fraction(MATH.reference_answer(instances[record["task_id"]]))
        revealed = set()
        for message in record["messages"][1:]:
            if message["role"] == "user":
                revealed |= values(message["content"])
                continue
            if message is record["messages"][-1]:
                break
            assert reference not in values(message["content"]), (record["id"], message["content"])
            if message["train"]:
                assert "####" not in message["content"]
                assert values(message["content"]) <= revealed, (record["id"], message["content"])
            checked += 1
    return checked


def test_no_reply_leaks_the_answer_or_an_unrevealed_number(corpus):
    records, instances = corpus
    assert check_no_leak(records.values(), instances) > 400
    asks = [m["content"] for r in records.values() for m, k in zip(assistant_turns(r), r["reply_kinds"])
            if k == "ask" and m["content"] not in GENERIC_ASKS]
    assert len(asks) > 50 and sum(bool(values(a)) for a in asks) < len(asks)  # specific asks were checked too


def test_no_leak_on_the_lic_math_sample():
    if not LIC_SAMPLE.exists():
        pytest.skip(f"LiC sample not found at {LIC_SAMPLE}")
    cfg = load_config(SFTDataConfig, None, [f"data.source=lic:{LIC_SAMPLE}", "ask_share=1.0", "recovery_share=0.5",
                                            "single_turn_share=0", "conversations_per_instance=40"])
    instances, _ = load_instances(cfg)
    records, stats = make_corpus(instances, cfg, progress=False)
    assert check_no_leak(records, {i.task_id: i for i in instances}) > 500 and stats["ask_specific"] > 50


def test_shares_follow_the_config(gym):
    records, _stats = make_corpus(gym, config("single_turn_share=0.2", "recovery_share=0.3", "ask_share=0.3"),
                                 progress=False)
    kinds = [r["kind"] for r in records]
    assert len(records) == len(gym)
    assert kinds.count("single_turn") == round(0.2 * len(gym)) and kinds.count("recovery") == round(0.3 * len(gym))
    early = [k for r in records for k in r["reply_kinds"] if k in ("defer", "ask")]
    assert 0.24 < early.count("ask") / len(early) < 0.36
    none, _ = make_corpus(gym, config("recovery_share=0", "single_turn_share=0", "ask_share=0"), progress=False)
    assert {k for r in none for k in r["reply_kinds"]} == {"defer", "answer"}


def test_the_corpus_is_deterministic_for_a_seed(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        build_corpus(config("data.limit=60", f"seed={seed}", out=tmp_path / f"{name}.jsonl"), progress=False)
    a, b, c = ((tmp_path / f"{n}.jsonl").read_bytes() for n in "abc")
    assert a == b and a != c


def test_data_card_and_files(tmp_path):
    out = tmp_path / "corpus.sft.jsonl"
    info = build_corpus(config("data.limit=80", "seed=3", out=out), progress=False)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    card_json, card_md = card_paths(out)
    assert card_json.name == "corpus.sft.card.json" and json.loads(card_json.read_text()) == info
    kept = info["sources"][0]["kept"]
    assert info["sources"][0]["spec"] == "reasoning-gym:gsm_symbolic" and info["sources"][0]["loaded"] == 80
    assert kept == 80 - sum(info["sources"][0]["dropped"].values()) >= 72  # a few cannot be sharded
    assert info["conversations"] == len(lines) == kept and info["seed"] == 3
    kinds = {k: sum(r["kind"] == k for r in lines) for k in ("deferral", "recovery", "single_turn", "partial")}
    assert info["conversations_by_kind"] == kinds
    replies = [k for r in lines for k in r["reply_kinds"]]
    for kind in ("defer", "ask", "premature", "answer"):
        assert info["reply_kinds"][kind] == replies.count(kind)
        assert info["reply_kind_shares"][kind] == pytest.approx(replies.count(kind) / len(replies), abs=1e-4)
    assert info["reply_kinds"]["premature"] == kinds["recovery"] and info["reply_kinds"]["answer"] == kept
    assert info["config"]["recovery_share"] == 0.3 and info["mean_user_turns"] > 1
    assert "recovery" in card_md.read_text() and "gsm_symbolic" in card_md.read_text()


def test_a_failed_card_write_leaves_the_old_corpus_and_card_whole(tmp_path, monkeypatch):
    import errno

    from fic.corpus import build

    out = tmp_path / "corpus.sft.jsonl"
    build_corpus(config("data.limit=20", out=out), progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full_disk(info):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(build, "card_markdown", full_disk)  # the last of the three files fails
    with pytest.raises(OSError):
        build_corpus(config("data.limit=30", out=out), progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary, no new corpus
    (tmp_path / out.name).unlink()
    for card in card_paths(out):
        card.unlink()
    with pytest.raises(OSError):
        build_corpus(config("data.limit=30", out=out), progress=False)
    assert list(tmp_path.iterdir()) == []  # never a corpus without its card


def test_the_file_loads_with_datasets(tmp_path):
    import datasets

    out = tmp_path / "c.jsonl"
    info = build_corpus(config("data.limit=40", out=out), progress=False)
    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    assert len(ds) == info["conversations"] > 30 and set(ds.column_names) == {"id", "task_id", "task", "kind", "messages", "reply_kinds"}
    messages = ds.features["messages"]
    inner = messages[0] if isinstance(messages, list) else messages.feature  # datasets 2.x vs 3+
    assert inner["train"].dtype == "bool" and ds[0]["messages"][0]["train"] is False


def test_the_premature_turn_is_out_of_the_loss_mask(corpus, smollm2_tokenizer):
    from fic.core.chat import render_chat

    records, _ = corpus
    record = next(r for r in records.values() if r["kind"] == "recovery" and len(r["reply_kinds"]) >= 3)
    rendered = render_chat(smollm2_tokenizer, record["messages"])
    trained = smollm2_tokenizer.decode([t for t, m in zip(rendered.input_ids, rendered.assistant_mask) if m])
    final = smollm2_tokenizer.decode([t for t, m in zip(rendered.input_ids, rendered.final_mask) if m])
    premature = assistant_turns(record)[record["reply_kinds"].index("premature")]["content"]
    assert premature not in trained and premature in smollm2_tokenizer.decode(rendered.input_ids)
    assert assistant_turns(record)[-1]["content"] in final
    for reply, kind in zip(assistant_turns(record)[:-1], record["reply_kinds"]):
        if kind != "premature":
            assert reply["content"] in trained


def test_model_written_replies_are_checked(gym):
    def writer(messages):  # defers leak a number never said; asks are fine
        return "Noted, 987654 so far." if "goes on" in messages[-1]["content"] or "go on" in messages[-1]["content"] \
            else "Thanks! What is the missing detail?"

    cfg = config("replies.kind=llm", "replies.backend.model=fake", "recovery_share=0", "single_turn_share=0")
    records, stats = make_corpus(gym[:60], cfg, reply_backend=FunctionBackend(writer), progress=False)
    early = [(m["content"], k) for r in records for m, k in zip(assistant_turns(r), r["reply_kinds"]) if k != "answer"]
    assert stats["replies_llm"] == sum(k == "ask" for _, k in early) > 0
    assert stats["replies_llm_rejected"] == sum(k == "defer" for _, k in early) > 0
    assert stats["replies_llm_rejected/holds a value not given yet"] == stats["replies_llm_rejected"]
    assert all("987654" not in text for text, _ in early)
    assert all(text == "Thanks! What is the missing detail?" for text, k in early if k == "ask")


def test_model_rephrased_user_turns_keep_their_numbers(gym):
    def rephraser(messages):
        text = messages[-1]["content"]
        return re.sub(r"\d+", "7777", text) if re.search(r"\d", text) else "so, " + text.lower()

    cfg = config("user.kind=llm", "user.backend.model=fake", "single_turn_share=0")
    records, stats = make_corpus(gym[:60], cfg, user_backend=FunctionBackend(rephraser), progress=False)
    by_id = {i.task_id: i for i in gym}
    for record in records:
        shards = user_turns(by_id[record["task_id"]], "sharded")
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        assert users[0] == shards[0]  # the intent turn is never rephrased
        for said, shard in zip(users[1:], shards[1:]):
            assert said == (shard if re.search(r"\d", shard) else "so, " + shard.lower())
    assert stats["user_rephrased"] > 0 and stats["user_rephrase_rejected"] > 0
    assert stats["user_rephrase_rejected/changes, drops or adds a value"] == stats["user_rephrase_rejected"]


def test_rewrites_that_change_or_drop_information_are_refused():
    from fic.corpus.build import rephrase_problem, reply_problem

    def _valid_rephrase(original, text):
        return rephrase_problem(original, text, MATH) is None

    def _valid_reply(text, kind, edit, max_words):
        return reply_problem(text, kind, edit, max_words) is None

    fact = "A carpenter works for 2 weeks every month and for 6 days every week."
    assert _valid_rephrase(fact, "The carpenter works 2 weeks every month and 6 days every week.")
    assert not _valid_rephrase(fact, "The carpenter works for 6 days a month and for 2 weeks a month.")
    assert not _valid_rephrase(fact, "A carpenter works for 3 weeks every month and for 6 days every week.")
    assert not _valid_rephrase("They're twins, so they're all the same size.",
                               "I'm sorry for the misunderstanding. Please correct the typo.")
    assert _valid_rephrase("They're twins, so they're all the same size.", "they're twins, same size")
    instance = Instance("t", "math", [], {"question": "q", "answer": "#### 104"})
    edit = {"revealed": {Fraction(2)}, "instance": instance}
    assert _valid_reply("Got it. How many skeins does each item take?", "ask", edit, 40)
    assert not _valid_reply('The user\'s message is: "Please correct the typo.', "ask", edit, 40)
    assert not _valid_reply("Noted, so 2 grandchildren. Keep going.", "ask", edit, 40)  # an ask must ask
    assert not _valid_reply("So that is 104 skeins?", "ask", edit, 40)


@pytest.mark.parametrize("override, field", [
    ("surely_not_a_key=1", "surely_not_a_key"),
    ("recovery_share=0.9", "recovery_share"),
    ("ask_share=1.5", "ask_share"),
    ("user.kind=llm", "user.backend.model"),
    ("replies.kind=robot", "replies.kind"),
    ("data.task=poetry", "data.task"),
])
def test_bad_config_is_a_clear_error(override, field):
    with pytest.raises(FicError) as err:
        config(override)
    assert err.value.field == field


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(FicError, match="unknown source"):
        build_corpus(config("data.source=nowhere:x", out=tmp_path / "x.jsonl"), progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a", "task": "math", "question": "q", "answer": "no number"}\n')
    with pytest.raises(FicError, match="answer"):
        build_corpus(config(f"data.source=jsonl:{bad}", out=tmp_path / "x.jsonl"), progress=False)
    assert not (tmp_path / "x.jsonl").exists()


def test_cli_writes_the_corpus_and_reports_bad_input(tmp_path, capsys):
    recipe = Path(__file__).resolve().parents[2] / "recipes/smollm2-135m-instruct/sft-data.yaml"
    out = tmp_path / "cli.sft.jsonl"
    assert main(["sft-data", "--config", str(recipe), "data.limit=30", f"out={out}", "--show", "1"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 30 conversations" in printed and "[system]" in printed
    assert out.exists() and card_paths(out)[0].exists() and card_paths(out)[1].exists()
    assert main(["sft-data", "--config", str(recipe), "single_turn_share=0.9"]) == 2
    assert "single_turn_share + recovery_share" in capsys.readouterr().err


@pytest.mark.parametrize("source,task", [("reasoning-gym:gsm_symbolic", "math"), ("actions-gen:train", "actions")])
def test_partial_single_turn_requests_ask_for_what_is_missing_and_name_no_value_not_given(source, task):
    """A partial request is the first k < N shards in the concat view; its reply asks or waits and
    states no value the request does not hold."""
    from fic import tasks as registry
    from fic.corpus.build import load_instances, make_corpus
    from fic.data.views import partial_instance, user_turns

    cfg = config("data.limit=60", f"data.source={source}", f"data.task={task}", "partial_share=1.0",
                 "single_turn_share=0", "recovery_share=0", "ask_share=0.5")
    instances, _ = load_instances(cfg)
    records, _ = make_corpus(instances, cfg, progress=False)
    by_id = {i.task_id: i for i in instances}
    kinds = set()
    assert records and all(r["kind"] == "partial" for r in records)
    for record in records:
        instance = by_id[record["task_id"]]
        _system, user, reply = record["messages"]
        assert reply["role"] == "assistant" and reply["train"] and not user["train"]
        prefixes = [user_turns(partial_instance(instance, [s.shard_id for s in instance.shards[:k]]), "concat")[0]
                    for k in range(1, len(instance.shards))]
        assert user["content"] in prefixes  # k < N shards: never the whole request
        given = set(registry.get(task).values_in(user["content"], instance))
        assert registry.get(task).leak(reply["content"], given, instance) is None, reply["content"]
        assert registry.get(task).score(reply["content"], instance) == 0.0  # not an answer
        kinds |= set(record["reply_kinds"])
    assert kinds == {"ask", "defer"}


def test_the_shares_of_conversation_kinds_may_not_pass_one():
    with pytest.raises(FicError, match="partial_share must be at most 1"):
        config("single_turn_share=0.5", "recovery_share=0.3", "partial_share=0.3")
