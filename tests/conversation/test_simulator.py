"""The lockstep simulator, user simulators and reply classifiers, on scripted backends."""

from __future__ import annotations

import json
import re

import pytest
from scripted import FunctionBackend

from fic.conversation.classify import LLMClassifier, RuleClassifier, parse_label
from fic.conversation.labels import rule_label
from fic.conversation.simulator import Conversation, make_conversations, play
from fic.conversation.users import LLMUser, VerbatimUser, parse_user_reply
from fic.core.chat import render_chat
from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.core.instance import Instance, Shard
from fic.data.views import RECAP_HEADER, SNOWBALL_HEADER, VIEWS, user_turns

PARAMS = SamplingParams(max_new_tokens=64)
SHARDS = ["How many points did Ara score in total?", "Ara played for 4 years.",
          "She played 40 games every year.", "She scored 21 points in each game."]


def ara(task_id="ara"):
    return Instance(task_id, "math", [Shard(i + 1, text) for i, text in enumerate(SHARDS)],
                    {"question": "Ara played 4 years, 40 games a year, 21 points a game. How many points in total?",
                     "answer": "40*4*21 = 3360\n#### 3360"})


class Scripted(FunctionBackend):
    """A token-level scripted assistant that counts calls and prompts per call."""

    def __init__(self, fn, tokenizer):
        super().__init__(fn, tokenizer)
        self.calls = []

    def generate(self, prompts, params):
        self.calls.append(len(prompts))
        return super().generate(prompts, params)


def waits_for_all(prompt: str) -> str:
    """Answers 3360 once the last shard is in the prompt, otherwise asks to go on."""
    return "So 4 * 40 * 21 = 3360.\n#### 3360" if "21 points" in prompt else "Got it, please go on."


def test_verbatim_turns_are_the_views_turns_and_ids_match_the_text(smollm2_tokenizer):
    assistant = Scripted(lambda prompt: "Okay, noted.", smollm2_tokenizer)
    convs = make_conversations([ara()], VIEWS, runs=1)
    play(convs, assistant, VerbatimUser(), RuleClassifier(), PARAMS, stop_at_correct=True)
    for conv in convs:
        assert [t.user for t in conv.turns] == user_turns(conv.instance, conv.view, seed=conv.view_seed), conv.view
        assert conv.stop_reason == "last_turn" and conv.score() == 0.0
        # Token-in/token-out: the ids the assistant saw and produced are the rendering of the text.
        rendered = render_chat(smollm2_tokenizer, conv.messages).input_ids
        assert rendered[:len(conv.ids)] == conv.ids and len(rendered) - len(conv.ids) <= 1
    sharded = next(c for c in convs if c.view == "sharded")
    assert [t.shard_ids for t in sharded.turns] == [[1], [2], [3], [4]]
    recap = next(c for c in convs if c.view == "recap")
    assert recap.turns[-1].user.startswith(RECAP_HEADER) and recap.turns[-1].shard_ids == []
    assert all(s in recap.turns[-1].user for s in SHARDS)
    snowball = next(c for c in convs if c.view == "snowball")
    assert snowball.turns[2].user == f"{SNOWBALL_HEADER}\n- {SHARDS[0]}\n- {SHARDS[1]}\n\n{SHARDS[2]}"
    # The assistant is never told it is in a multi-turn conversation: system prompt is the task's own.
    assert sharded.messages[0]["content"] == sharded.task.system_prompt


def test_lockstep_costs_one_call_per_turn_and_stops_at_the_first_correct_answer(smollm2_tokenizer):
    assistant = Scripted(waits_for_all, smollm2_tokenizer)
    convs = make_conversations([ara(f"a{i}") for i in range(8)], ["full", "sharded"], runs=2)
    finished = []
    play(convs, assistant, VerbatimUser(), RuleClassifier(), PARAMS, on_finish=finished.append)
    # 32 conversations; the sharded ones have 4 turns: 4 calls, the first with all 32.
    assert assistant.calls == [32, 16, 16, 16]
    assert len(finished) == 32 and len({c.key for c in finished}) == 32
    for conv in convs:
        assert conv.stop_reason == "correct" and conv.score() == 1.0
        if conv.view == "sharded":
            assert [t.label for t in conv.turns] == ["discussion"] * 3 + ["answer_attempt"]
            assert conv.turns[-1].answer == "3360" and conv.turns[-1].score == 1.0
            assert conv.turns[0].score is None and conv.turns[0].answer is None  # not an attempt: unscored
    record = convs[-1].to_record()
    assert record["premature_answer"] is False and record["first_answer_turn"] == 3
    assert record["generated_tokens"] == sum(t["reply_tokens"] for t in record["turns"]) > 0
    # Chunks: batch_size 5 splits every step into chunks of at most 5 prompts.
    chunked = Scripted(waits_for_all, smollm2_tokenizer)
    play(make_conversations([ara(f"b{i}") for i in range(3)], ["sharded"], runs=2), chunked, VerbatimUser(),
         RuleClassifier(), PARAMS, batch_size=5)
    assert chunked.calls == [5, 1] * 4


def test_premature_answers_and_playing_every_turn(smollm2_tokenizer):
    answers = iter(["#### 3360", "Maybe #### 12", "Let me think.", "#### 7"])
    assistant = Scripted(lambda prompt: next(answers), smollm2_tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], runs=1)
    play([conv], assistant, VerbatimUser(), RuleClassifier(), PARAMS, stop_at_correct=False)
    assert len(conv.turns) == 4 and conv.stop_reason == "last_turn"
    assert [t.score for t in conv.turns] == [1.0, 0.0, None, 0.0]
    assert conv.score() == 0.0  # the last answer attempt counts when every turn is played
    record = conv.to_record()
    assert record["premature_answer"] is True and record["first_answer_turn"] == 0
    # The same replies with stop_at_correct: the first (lucky) correct answer ends it.
    answers = iter(["#### 3360"])
    (again,) = make_conversations([ara()], ["sharded"], runs=1)
    play([again], Scripted(lambda prompt: next(answers), smollm2_tokenizer), VerbatimUser(), RuleClassifier(),
         PARAMS)
    assert len(again.turns) == 1 and again.stop_reason == "correct" and again.to_record()["premature_answer"]


def test_recaps_and_partial_results_are_not_answers_and_do_not_end_a_conversation(smollm2_tokenizer):
    # Issue 19, item 8: an intermediate value that happens to equal the reference used to end the
    # conversation as correct. Here the reference is 160 (games), which the assistant reaches as a
    # partial result while asking for more; only its final answer may be scored.
    games = Instance("games", "math", [Shard(i + 1, text) for i, text in enumerate(SHARDS)],
                     {"question": "q", "answer": "4*40 = 160\n#### 160"})
    replies = iter(["How many years did she play?", "Got it: 4 years.",
                    "Okay, so she played 4 * 40 = 160 games. What else?", "So she played 160 games in total."])
    (conv,) = make_conversations([games], ["sharded"], runs=1)
    play([conv], Scripted(lambda prompt: next(replies), smollm2_tokenizer), VerbatimUser(), RuleClassifier(), PARAMS)
    assert [t.label for t in conv.turns] == ["clarification", "discussion", "discussion", "answer_attempt"]
    assert [t.score for t in conv.turns] == [None, None, None, 1.0]
    record = conv.to_record()
    assert record["first_answer_turn"] == 3 and record["premature_answer"] is False

def test_max_context_ends_a_conversation_without_an_unanswered_turn(smollm2_tokenizer):
    assistant = Scripted(lambda prompt: "word " * 30, smollm2_tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], runs=1)
    play([conv], assistant, VerbatimUser(), RuleClassifier(), PARAMS, max_context=150)
    assert conv.stop_reason == "context_full" and 0 < len(conv.turns) < 4
    assert all(t.reply for t in conv.turns) and conv.messages[-1]["role"] == "assistant"


# --------------------------------------------------------------------------- LLM user simulator

def _conv_after_turn_one():
    conv = Conversation(ara(), "sharded")
    conv.revealed = [1]
    conv.turns = [object()]  # the simulator is asked from turn 2 on
    conv.messages += [{"role": "user", "content": SHARDS[0]}, {"role": "assistant", "content": "How long?"}]
    return conv


@pytest.mark.parametrize("reply, reason", [
    ("Sure! I'll reveal the years.", "no JSON object"),
    ('{"response": "played 4 years", "shard_id": 1}', "already revealed"),
    ('{"response": "played 4 years", "shard_id": 9}', "does not exist"),
    ('{"response": "", "shard_id": 2}', "'response' missing"),
    ('{"response": "she played a few years", "shard_id": 2}', "drops value(s) 4"),
    ('{"response": "she played 4 years", "shard_id": "two"}', "not an integer"),
    ('{"response": "she played 4 years", "shard_id": true}', "not an integer"),
    ('[{"response": "x"}]', "'shard_id' is not an integer"),
])
def test_user_reply_parser_rejects_malformed_output(reply, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_user_reply(reply, _conv_after_turn_one())


def test_user_reply_parser_accepts_json_inside_chatter_and_fences():
    reply = 'Here you go:\n```json\n{"response": "oh and each game she got 21 pts", "shard_id": "4"}\n```'
    assert parse_user_reply(reply, _conv_after_turn_one()) == ("oh and each game she got 21 pts", 4)


def test_llm_user_follows_valid_choices_and_falls_back_on_bad_ones(smollm2_tokenizer):
    seen_prompts = []

    def user_model(messages):
        seen_prompts.append(messages)
        body = messages[-1]["content"]
        if "shard 4:" in body and "Shards not revealed yet (pick at most one; -1 for none):\n- shard 2" in body:
            return json.dumps({"response": "btw she got 21 points per game", "shard_id": 4})
        return "I refuse to use JSON"

    assistant = Scripted(lambda prompt: "Okay.", smollm2_tokenizer)
    user = LLMUser(FunctionBackend(user_model), temperature=0.0)
    (conv,) = make_conversations([ara()], ["sharded"], runs=1)
    play([conv], assistant, user, RuleClassifier(), PARAMS)
    assert [t.shard_ids for t in conv.turns] == [[1], [4], [2], [3]]  # the model picked 4, then fallbacks
    assert conv.turns[1].user == "btw she got 21 points per game" and conv.turns[1].user_note is None
    assert conv.turns[2].user == SHARDS[1] and "fallback to verbatim" in conv.turns[2].user_note
    assert len(seen_prompts) == 3  # turn 1 is shard 1 verbatim: no user-model call
    assert "[assistant] Okay." in seen_prompts[0][-1]["content"]
    assert "I don't know" in seen_prompts[0][0]["content"]


# --------------------------------------------------------------------------- classifiers

@pytest.mark.parametrize("reply, label", [
    ("", "missing"),
    ("   ", "missing"),
    ("I'm sorry, but I can't help with that.", "refuse"),
    ("Let's compute: 4 * 40 = 160 games, 160 * 21 = 3360.\n#### 3360", "answer_attempt"),
    ("The answer is \\boxed{3360}.", "answer_attempt"),
    ("She played 160 games, so she scored 3360 points in total.", "answer_attempt"),
    ("She scored 3360 points. Let me know if you need anything else!", "answer_attempt"),
    ("So the total is 3360. Anything else?", "answer_attempt"),
    ("How many games did she play each year?", "clarification"),
    ("Thanks! How many games per year? And how many points per game?", "interrogation"),
    ("It depends on the number of games: if she played 40 games, 3360; if 30 games, 2520.", "hedge"),
    ("To find the total, we need the number of games and the points per game.", "discussion"),
])
def test_rule_classifier(reply, label):
    assert rule_label(reply) == label


def test_rule_classifier_does_not_take_a_parroted_shard_for_an_answer():
    said = ["how many lollipops did Ray's friends get?", "Ray started with 25 lollipops.",
            "he decided to keep 5 lollipops for himself."]
    assert rule_label("He decided to keep 5 lollipops for himself.", said) == "discussion"
    assert rule_label("Ray started with 25 lollipops.", said) == "discussion"
    # Same words as the question, but a number the user never gave there: a (wrong) answer.
    assert rule_label("Ray's friends got 2 lollipops.", said) == "answer_attempt"
    assert rule_label("So each friend got 5 lollipops.", said) == "answer_attempt"
    assert rule_label("He decided to keep 5 lollipops for himself.\n#### 5", said) == "answer_attempt"


@pytest.mark.parametrize("text, label", [
    ('{"label": "clarification"}', "clarification"),
    ('Sure. ```{"label": "Answer_Attempt"}```', "answer_attempt"),
    ("The reply is a hedge.", "hedge"),
])
def test_classifier_parser_accepts(text, label):
    assert parse_label(text) == label


@pytest.mark.parametrize("text", ['{"label": "question"}', "clarification or discussion", "", '{"lab": 1}'])
def test_classifier_parser_rejects(text):
    with pytest.raises(ValueError):
        parse_label(text)


def test_llm_classifier_falls_back_to_the_rule_label():
    convs = []
    for reply in ["#### 3360", "#### 3360", "", "How many?"]:
        conv = Conversation(ara(), "sharded")
        conv.messages += [{"role": "user", "content": SHARDS[0]}, {"role": "assistant", "content": reply}]
        convs.append(conv)
    # The batch asks the model about all four; the empty reply is labelled missing whatever it says.
    outputs = iter(['{"label": "discussion"}', "no idea", "unused", '{"label": "answer_attempt"}'])
    classifier = LLMClassifier(FunctionBackend(lambda messages: next(outputs)))
    labels = classifier.classify(convs)
    assert labels[0] == ("discussion", None)
    assert labels[1][0] == "answer_attempt" and "rule label used" in labels[1][1]
    assert labels[2] == ("missing", None)
    assert labels[3] == ("answer_attempt", None)


@pytest.mark.slow  # the benchmark
def test_bench_rollout_plays_both_ways_and_reports_what_reuse_saves(tiny_model_dir):
    import argparse

    from fic.bench import rollout as bench_rollout

    parser = argparse.ArgumentParser()
    bench_rollout.add_arguments(parser)

    def measure(*extra):
        return bench_rollout.measure(parser.parse_args(
            ["--model", str(tiny_model_dir), "--conversations", "4", "--turns", "2",
             "--max-new-tokens", "4", "--dtype", "float32", *extra]))

    reusing, rereading = measure(), measure("--kv-reuse-mb", "0")
    for figures in (reusing, rereading):
        assert figures["conversations"] == 4 and figures["turns"] == 8
        assert figures["ratio"] == pytest.approx(
            figures["lockstep_conversations_per_s"] / figures["one_at_a_time_conversations_per_s"])
        assert 0 <= figures["same_replies"] <= 1
    assert reusing["kv_reuse"] and not rereading["kv_reuse"]
    # Without reuse both ways read every turn's whole prompt; with it, the second turn reads
    # only what is new, and the batch reads the shared system prompt once.
    assert reusing["lockstep_prompt_tokens_fed"] < 0.75 * rereading["lockstep_prompt_tokens_fed"]
    assert reusing["one_at_a_time_prompt_tokens_fed"] < 0.75 * rereading["one_at_a_time_prompt_tokens_fed"]
    with pytest.raises(FicError, match="--kv-reuse-mb"):
        measure("--kv-reuse-mb", "-1")


# --------------------------------------------------------------------------- LiC protocol details

class NoClassifierForSingleTurn(RuleClassifier):
    """The rule classifier, refusing to label a single-turn reply (LiC never classifies them)."""

    def classify(self, conversations):
        assert all(c.view == "sharded" for c in conversations), [c.view for c in conversations]
        return super().classify(conversations)


def test_single_turn_replies_are_scored_whatever_they_look_like(smollm2_tokenizer):
    # A correct answer closing with a courtesy question looks like a clarification to a classifier.
    reply = "She scored 3360 points in total. Does that match what you expected, or should I recheck a step?"
    assert rule_label(reply) == "clarification"
    assistant = Scripted(lambda prompt: reply, smollm2_tokenizer)
    convs = make_conversations([ara()], ["full", "concat", "shuffle-concat", "sharded"], runs=1)
    play(convs, assistant, VerbatimUser(), NoClassifierForSingleTurn(), PARAMS)
    by_view = {c.view: c for c in convs}
    for view in ("full", "concat", "shuffle-concat"):
        (turn,) = by_view[view].turns
        assert turn.label == "not_classified" and turn.answer == "3360" and turn.score == 1.0, view
        assert by_view[view].score() == 1.0
    # In the sharded view the classifier decides; this reply is not an answer attempt there.
    sharded = by_view["sharded"]
    assert all(t.label == "clarification" and t.score is None for t in sharded.turns) and sharded.score() == 0.0


def test_every_run_of_shuffle_concat_draws_its_own_order(smollm2_tokenizer):
    six = Instance("six", "math", [Shard(i + 1, f"Fact number {i + 1} is here.") for i in range(6)],
                   {"question": "q", "answer": "#### 1"})
    convs = make_conversations([six], ["shuffle-concat"], runs=8, view_seed=3)
    orders = {c.run: user_turns(six, "shuffle-concat", seed=c.view_seed)[0] for c in convs}
    assert len(set(orders.values())) > 1
    # The order depends only on (seed, run): a resumed run draws the same one.
    again = make_conversations([six], ["shuffle-concat"], runs=8, view_seed=3, skip={("six", "shuffle-concat", 0)})
    assert all(orders[c.run] == user_turns(six, "shuffle-concat", seed=c.view_seed)[0] for c in again)
    play(convs, Scripted(lambda prompt: "ok", smollm2_tokenizer), VerbatimUser(), RuleClassifier(), PARAMS)
    assert {c.run: c.turns[0].user for c in convs} == orders


def test_the_llm_user_may_reveal_nothing_and_turns_stay_bounded(smollm2_tokenizer):
    user = LLMUser(FunctionBackend(lambda messages: json.dumps({"response": "No idea, sorry.", "shard_id": -1})))
    assistant = Scripted(lambda prompt: "What else do I need to know?", smollm2_tokenizer)
    (conv,) = make_conversations([ara()], ["sharded"], runs=1, max_idle_turns=2)
    play([conv], assistant, user, RuleClassifier(), PARAMS)
    # Two turns reveal nothing (LiC's shard id -1); then the bound makes the user go on verbatim.
    assert [t.shard_ids for t in conv.turns] == [[1], [], [], [2], [3], [4]]
    assert [t.user for t in conv.turns[1:3]] == ["No idea, sorry."] * 2
    assert all(t.user_note is None for t in conv.turns[:3])
    assert all("max_idle_turns=2" in t.user_note for t in conv.turns[3:])
    assert conv.stop_reason == "last_turn" and conv.to_record()["num_turns"] == 6
    # A recap conversation still ends with its recap turn after every shard.
    (recap,) = make_conversations([ara()], ["recap"], runs=1, max_idle_turns=1)
    play([recap], assistant, user, RuleClassifier(), PARAMS)
    assert [t.shard_ids for t in recap.turns] == [[1], [], [2], [3], [4], []]
    assert recap.turns[-1].user.startswith(RECAP_HEADER)


def test_user_replies_that_give_away_hidden_shards_are_refused():
    conv = _conv_after_turn_one()
    assert parse_user_reply('{"response": "I don\'t know, sorry", "shard_id": -1}', conv) == ("I don't know, sorry", -1)
    with pytest.raises(ValueError, match=r"gives away value\(s\) 40 of shard\(s\) 3"):
        parse_user_reply('{"response": "she played 4 years, 40 games each", "shard_id": 2}', conv)
    with pytest.raises(ValueError, match=r"gives away value\(s\) 21 of shard\(s\) 4"):
        parse_user_reply('{"response": "no idea, but she scored 21 a game", "shard_id": -1}', conv)
    # A value already revealed (or of the shard being revealed) may be repeated.
    conv.revealed = [1, 3]
    assert parse_user_reply('{"response": "4 years of 40 games", "shard_id": 2}', conv)[1] == 2
    # The LLM user falls back to the verbatim shard and says why.
    leaky = LLMUser(FunctionBackend(lambda messages: '{"response": "4 years, 21 points a game", "shard_id": 2}'))
    (turn,) = leaky.next_turns([_conv_after_turn_one()])
    assert turn.text == SHARDS[1] and "gives away" in turn.note


@pytest.mark.parametrize("reply, label", [
    # Asking before answering is not an answer attempt, whatever words it uses.
    ("Before I give the final answer, could you tell me how many games she played each year?", "clarification"),
    # A vague question asks for nothing in particular: discussion (LiC).
    ("What else do I need to know?", "discussion"),
    ("Got it. Could you share more details?", "discussion"),
    ("Thanks! How many points did she score in each game?", "clarification"),
    # LiC's clarification is short: a long reply that ends in a question is discussion.
    ("Let me think about this. " * 22 + "How many games did she play each year?", "discussion"),
    ("The final answer is 3360. Let me know if you need more.", "answer_attempt"),
])
def test_rule_labels_follow_lic_definitions(reply, label):
    assert rule_label(reply) == label


def test_a_parroted_shard_before_a_question_is_no_answer():
    said = ["How many points did Ara score in total?", "Ara played 40 games every year."]
    assert rule_label("Ara played 40 games every year. How many points did she score per game?", said) \
        == "clarification"


def test_the_llm_classifier_sees_the_full_task_specification():
    from fic.conversation.classify import classifier_prompt

    conv = _conv_after_turn_one()
    system, user = classifier_prompt(conv)
    assert ara().fields["question"] in user["content"]
    assert SHARDS[0] in user["content"] and "How long?" in user["content"]
    assert "under 100 words" in system["content"] and "vague" in system["content"]
