"""`prompts: lic`: every task renders Lost in Conversation's prompts verbatim (issue 19, item 10),
and FiC's own wording stays the default."""

from __future__ import annotations

import json

import pytest

from fic import tasks
from fic.conversation import lic_prompts
from fic.conversation.classify import classifier_prompt, parse_label
from fic.conversation.simulator import Conversation
from fic.conversation.users import user_prompt
from fic.core.errors import FicError
from fic.core.instance import Instance, Shard
from fic.data.views import SINGLE_TURN_VIEWS, VIEWS, render_view, system_message, user_turns
from fic.tasks import Task
from fic.tasks.lic_prompts import fill


def shards(*texts, **extra):
    return [Shard(i + 1, text, dict(extra.get(str(i + 1), {}))) for i, text in enumerate(texts)]


ARA = Instance("ara", "math", shards("How many points did Ara score?", "She played 4 years.",
                                     "She played 40 games a year.", "She scored 21 points a game."),
               {"question": "Ara played 4 years, 40 games a year, 21 points a game. How many points?",
                "answer": "#### 3360"})
SCHEMA = "CREATE TABLE singer (singer_id int, name text, country text, age int);"
SINGERS = Instance("db", "database", shards("I need singer names.", "Only from France.", "Sorted by age."),
                   {"db_id": "concert_singer", "schema_sql": SCHEMA, "reference_sql": "SELECT name FROM singer",
                    "fully_specified_question": "Names of French singers by age."})
TOOLS = [{"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "dict", "properties": {"city": {"type": "string", "description": "The city."}}, "required": ["city"]}}]
WEATHER = Instance("act", "actions", shards("What's the weather?", "In Paris."),
                   {"function": TOOLS, "fully_specified_question": [[{"role": "user", "content": "Weather in Paris?"}]],
                    "reference_answer": [{"get_weather": {"city": ["Paris"]}}]})
HUMANEVAL = Instance("he", "code", shards("Write add(a, b).", "It returns a + b."),
                     {"prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "metadata": {"func_name": "add"},
                      "test": "def check(c): assert c(1, 2) == 3", "source": "humaneval"})
LCB = Instance("lcb", "code", shards("Read two numbers.", "Print their sum."),
               {"question_content": "Sum two numbers.", "starter_code": "", "metadata": {"func_name": "main"},
                "public_test_cases": "[]", "source": "lcb_easy"})
GERMAN = Instance("tr", "translation", shards("Erster Teil.", "Zweiter Teil."),
                  {"document_de": "Erster Teil. Zweiter Teil.", "document_en": "First part. Second part."})
TABLE = Instance("d2t", "data2text", shards("<table>t</table>", "Examples: x."),
                 {"table_highlighted_html": "<table>t</table>", "fewshot_descriptions": "x.",
                  "metadata": {"page": "P"}, "references": ["A table."]})
DOCS = Instance("sum", "summary", shards("", "", **{"1": {"doc_idxs": [1]}, "2": {"doc_idxs": [2]}}),
                {"topic": "T", "query": "Q?", "domain": "news", "insights": [{"insight_id": "i", "insight": "x"}],
                 "insightid2ref_citations": {"i": [1]},
                 "documents": [{"document_index": 1, "document_text": "One."},
                               {"document_index": 2, "document_text": "Two."}]})
EVERY_TASK = [ARA, SINGERS, WEATHER, HUMANEVAL, LCB, GERMAN, TABLE, DOCS]


def test_math_under_lic_has_lics_system_prompt_and_q_a_frame_and_fic_is_unchanged():
    lic = render_view(ARA, "full", prompts="lic")
    assert lic["system"] == "As an expert problem solver solve step by step the following mathematical questions."
    assert lic["user_turns"] == [f"Q: {ARA.fields['question']}\nA:"]
    (concat,) = user_turns(ARA, "concat", prompts="lic")
    assert concat == "Q: " + "".join(f"- {s.shard}\n" for s in ARA.shards) + "\nA:"  # LiC's concat, newline kept
    fic = render_view(ARA, "full")
    assert fic["system"] == tasks.get("math").system_prompt and fic["user_turns"] == [ARA.fields["question"]]
    assert user_turns(ARA, "concat") == ["\n".join(f"- {s.shard}" for s in ARA.shards)]
    assert user_turns(ARA, "sharded", prompts="lic") == user_turns(ARA, "sharded") == ARA.shard_texts


def test_database_under_lic_puts_the_schema_in_lics_frames_and_concat_considers_all():
    (concat,) = user_turns(SINGERS, "concat", prompts="lic")
    assert "The user query is:\nConsider all the following:\n- I need singer names.\n- Only from France.\n" \
           "- Sorted by age.\n\n\nRules:\n" in concat  # LiC's list keeps its last newline
    assert concat.startswith("You must generate the valid SQL query") and SCHEMA in concat
    (full,) = user_turns(SINGERS, "full", prompts="lic")
    assert "The user query is:\nNames of French singers by age.\n" in full
    assert system_message(SINGERS, "lic")["content"].startswith("You are helping a user write SQL queries")
    assert system_message(SINGERS, "lic")["content"].endswith("following:\n        \n" + SCHEMA)
    assert "Consider all the following" not in user_turns(SINGERS, "concat")[0]


def test_shuffle_concat_under_lic_shuffles_every_shard_fic_keeps_the_intent_first():
    six = Instance("six", "math", shards(*(f"Fact number {i} is here." for i in range(1, 7))),
                   {"question": "q", "answer": "#### 1"})
    firsts = {prompts: {user_turns(six, "shuffle-concat", seed=seed, prompts=prompts)[0].split("\n")[0]
                        for seed in range(20)} for prompts in ("fic", "lic")}
    assert firsts["fic"] == {"- Fact number 1 is here."}
    assert len(firsts["lic"]) > 1 and all(first.startswith("Q: - Fact number") for first in firsts["lic"])


def test_lic_wording_of_actions_code_and_the_text_tasks():
    assert system_message(WEATHER, "lic")["content"].endswith("you can invoke.\n\n" + str(TOOLS))  # Python's repr
    assert user_turns(WEATHER, "full", prompts="lic") == ["Weather in Paris?"]
    assert user_turns(WEATHER, "concat", prompts="lic") == ["- What's the weather?\n- In Paris.\n"]
    code_system = system_message(HUMANEVAL, "lic")["content"]
    assert code_system.startswith("You are an expert Python programmer") and code_system == \
        system_message(LCB, "lic")["content"]
    (full,) = user_turns(HUMANEVAL, "full", prompts="lic")
    assert "Instruction:\n\nComplete the following incomplete function signature:\n```python\ndef add(a, b):" in full
    assert user_turns(HUMANEVAL, "concat", prompts="lic")[0].split("Instruction:\n\n")[1].startswith(
        "Write add(a, b).\n- It returns a + b.\n\n\nRules:")
    assert "### Format: You will use the following starter code" in user_turns(LCB, "full", prompts="lic")[0]
    assert "```python\n# YOUR CODE HERE\n```" in user_turns(LCB, "concat", prompts="lic")[0]
    first, second = user_turns(GERMAN, "sharded", prompts="lic")
    assert first.startswith("You are translating a document from German to English that is being transcribed live")
    assert second == "I have received the latest chunk of the document. Please translate the entire document so " \
                     "far.\n\nChunk 2:\n\nZweiter Teil."
    assert "Document Chunk 2:\nZweiter Teil.\n\n" in user_turns(GERMAN, "concat", prompts="lic")[0]
    (hints,) = user_turns(TABLE, "shuffle-concat", seed=1, prompts="lic")
    assert "Hint 1:\n<table>t</table>\n\n" in hints and "Hint 2:\nExamples: x.\n\n" in hints  # hints keep their ids
    sent = user_turns(DOCS, "sharded", prompts="lic")
    assert sent[0].startswith("You are given 2 news articles") and "Document 1:\nOne." in sent[0]
    assert sent[1].startswith("I have found a few additional documents") and "Document 2:\nTwo." in sent[1]
    assert system_message(DOCS, "lic")["content"].startswith("You are a professional document analyst")


def test_recap_and_snowball_under_lic_are_lics_turns():
    recap = user_turns(ARA, "recap", prompts="lic")[-1]
    assert recap == ("Just to recapitulate, the entire task is:\n\n" + user_turns(ARA, "concat", prompts="lic")[0]
                     + "\n\nNow please complete the task correctly taking all the information into account.")
    third = user_turns(ARA, "snowball", prompts="lic")[2]
    assert third == f"Just to reiterate,\n- {ARA.shards[0].shard}\n- {ARA.shards[1].shard}\n\nAlso,\n\n" \
                    f"{ARA.shards[2].shard}\n"


@pytest.mark.parametrize("instance", EVERY_TASK, ids=lambda i: i.task_id)
def test_every_task_renders_every_view_in_both_styles(instance):
    for prompts in ("fic", "lic"):
        for view in VIEWS:
            record = render_view(instance, view, seed=3, prompts=prompts)
            assert record["system"] and all(isinstance(t, str) and t for t in record["user_turns"]), (prompts, view)
            assert len(record["user_turns"]) == (1 if view in SINGLE_TURN_VIEWS else len(instance.shards)
                                                 + (view == "recap"))
        assert render_view(instance, "full", prompts="lic") != render_view(instance, "full"), instance.task
    with pytest.raises(FicError, match="expected one of fic, lic"):
        render_view(instance, "full", prompts="paper")


class OldStyleTask(Task):
    """A task written before prompt styles: its full_prompt takes no `prompts`."""

    name = "old-style"

    def full_prompt(self, instance):
        return "the question"


def test_a_task_without_prompt_styles_is_refused_when_registered():
    with pytest.raises(ValueError, match="'old-style': full_prompt must take `prompts`"):
        tasks.register(OldStyleTask())
    assert "old-style" not in tasks.names()


def conversation_after_turn_one(prompts):
    conv = Conversation(ARA, "sharded", prompts=prompts)
    conv.messages += [{"role": "user", "content": ARA.shards[0].shard},
                      {"role": "assistant", "content": "How many years did she play?"}]
    conv.revealed = [1]
    return conv


def test_the_llm_user_and_classifier_get_lics_own_prompts_under_lic():
    conv = conversation_after_turn_one("lic")
    (user,) = user_prompt(conv)
    later = [s.to_dict() for s in ARA.shards[1:]]
    assert user["role"] == "user" and user["content"] == fill(
        lic_prompts.USER_AGENT, CONVERSATION_SO_FAR=f"[user] {ARA.shards[0].shard}\n\n[assistant] How many years did "
        "she play?", SHARDS_REVEALED="[]", SHARDS_NOT_REVEALED=json.dumps(later))
    (labelling,) = classifier_prompt(conv)
    assert labelling["content"].startswith("You are reviewing a multi-turn conversation")
    assert "[[" not in labelling["content"] and json.dumps(later) in labelling["content"]
    assert labelling["content"].endswith("Conversation's last turn:\n[assistant] How many years did she play?")
    assert lic_prompts.ANSWER_DESCRIPTIONS["math"] in labelling["content"]
    assert parse_label('{"response_type": "clarification"}') == "clarification"  # LiC's answer key
    fic = conversation_after_turn_one("fic")
    assert user_prompt(fic)[0]["role"] == "system" and classifier_prompt(fic)[0]["role"] == "system"
