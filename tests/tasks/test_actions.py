"""The `actions` task: reading calls, BFCL's AST match, the task's hooks
(values, leaks, labels, asks, premature calls), the SFT corpus and the simulator on actions."""

import copy
import json
import random
import re
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
from actions_instances import late_optional_instance
from scripted import FunctionBackend

from fic import tasks
from fic.conversation.classify import RuleClassifier
from fic.conversation.labels import reply_label
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.core.instance import Instance
from fic.corpus.build import SFTDataConfig, load_instances, make_corpus
from fic.data.sources import load_source, read_instance
from fic.data.views import VIEWS, render_view, system_message, user_turns
from fic.tasks.calls import find_calls, format_calls, parse_calls

LIC_SAMPLE = Path(__file__).resolve().parents[3] / "shared/data/lost_in_conversation/sample_5_per_task.json"
needs_lic = pytest.mark.skipif(not LIC_SAMPLE.exists(), reason="../shared (LiC sample data) is not present")
ACTIONS = tasks.get("actions")


def tool(name, properties, required):
    return {"name": name, "description": f"{name} tool.",
            "parameters": {"type": "dict", "properties": properties, "required": required}}


FUNCTIONS = [
    tool("get_weather", {"city": {"type": "string", "description": "The city."},
                         "unit": {"type": "string", "description": "The unit.", "enum": ["celsius", "fahrenheit"]},
                         "days": {"type": "integer", "description": "Days ahead."}}, ["city"]),
    tool("book_flight", {"origin": {"type": "string", "description": "The departure city."},
                         "destination": {"type": "string", "description": "The arrival city."},
                         "date": {"type": "string", "description": "The date."},
                         "passengers": {"type": "integer", "description": "The number of passengers."},
                         "price": {"type": "float", "description": "The price."}},
         ["origin", "destination", "date"]),
    tool("make_histogram", {"data": {"type": "array", "items": {"type": "integer"}, "description": "The data."},
                            "bins": {"type": "integer", "description": "The bins."}}, ["data", "bins"]),
    tool("send_message", {"to": {"type": "string", "description": "The contact."},
                          "text": {"type": "string", "description": "The text."}}, ["to", "text"]),
    tool("set_config", {"options": {"type": "dict", "description": "The options."}}, ["options"]),
    tool("add_people", {"people": {"type": "array", "items": {"type": "dict"}, "description": "The people."}},
         ["people"]),
    tool("toggle", {"flag": {"type": "boolean", "description": "The flag."}}, ["flag"]),
]
WEATHER = [{"get_weather": {"city": ["Paris", "Paris, France"], "unit": ["celsius", ""], "days": [""]}}]
FLIGHT = [{"book_flight": {"origin": ["Paris"], "destination": ["Tokyo"], "date": ["2025-03-14"],
                           "passengers": [2], "price": [450.0, ""]}}]
HISTOGRAMS = [{"make_histogram": {"data": [[1, 2, 3]], "bins": [5]}},
              {"make_histogram": {"data": [[7, 8]], "bins": [4]}}]
MESSAGE = [{"send_message": {"to": ["Bo"], "text": ["Running late, sorry!"]}}]
QUOTED = [{"send_message": {"to": ["Bo"], "text": ["It's fine, \"really\" (soon) [ok]"]}}]
CONFIG = [{"set_config": {"options": [{"mode": ["fast"], "level": [2, ""]}]}}]
PEOPLE = [{"add_people": {"people": [[{"name": ["Ann"], "age": [30]}, {"name": ["Bo"], "age": [41]}]]}}]
TOGGLE = [{"toggle": {"flag": [True]}}]
GOOD_FLIGHT = 'book_flight(origin="Paris", destination="Tokyo", date="2025-03-14", passengers=2'


def instance(reference, task_id="t"):
    return Instance(task_id, "actions", [], {"function": FUNCTIONS, "reference_answer": reference,
                                             "fully_specified_question": [[{"role": "user", "content": "q"}]]})


SCORER_CASES = [
    # (reply, reference, expected score)
    ('[get_weather(city="Paris")]', WEATHER, 1),
    ("[get_weather(city='Paris', unit='celsius')]", WEATHER, 1),
    ('get_weather(city="Paris")', WEATHER, 1),                                   # a bare call
    ('Sure! Here you go: [get_weather(city="Paris")] Anything else?', WEATHER, 1),  # text around the call
    ('```python\n[get_weather(city="Paris")]\n```', WEATHER, 1),                # a code fence
    ('```\nget_weather(city="Paris")\n```', WEATHER, 1),
    ('[get_weather(city="paris,  FRANCE")]', WEATHER, 1),                       # BFCL's string normalisation
    ('[get_weather(city=Paris)]', WEATHER, 1),                                  # a bare name reads as its text
    ('[get_weather(city="Paris", days=3)]', WEATHER, 0),                        # accepted only as left out
    ('[get_weather()]', WEATHER, 0),                                            # a required parameter missing
    ('[get_weather(city="Paris", country="FR")]', WEATHER, 0),                  # a parameter the schema lacks
    ('[get_forecast(city="Paris")]', WEATHER, 0),                               # the wrong function
    ('[get_weather("Paris")]', WEATHER, 0),                                     # positional arguments
    ('[get_weather(city="London")]', WEATHER, 0),
    ('[get_weather(city="Paris", unit="kelvin")]', WEATHER, 0),                 # a wrong optional value
    ('[get_weather(city="Paris"), get_weather(city="Paris")]', WEATHER, 0),     # one call too many
    ("I'm sorry, I can't look that up.", WEATHER, 0),                          # not Python at all
    ('get_weather: city=Paris', WEATHER, 0),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', WEATHER, 0),    # JSON is not the asked format
    ('[get_weather(city="Paris"', WEATHER, 0),                                  # never closed
    ('I would call get_weather(city="London"), but you said Paris: [get_weather(city="Paris")]', WEATHER, 1),
    ('[get_weather(city=lookup(name="Paris"))]', WEATHER, 0),                   # a nested call is no string
    (f"[{GOOD_FLIGHT}, price=450)]", FLIGHT, 1),                                # an int accepted for a float
    (f"[{GOOD_FLIGHT}, price=450.0)]", FLIGHT, 1),
    (f"[{GOOD_FLIGHT})]", FLIGHT, 1),                                           # optional "" left out
    ('[book_flight(passengers=2, date="2025-03-14", destination="Tokyo", origin="Paris")]', FLIGHT, 1),
    ('[book_flight(origin="Paris", destination="Tokyo", date="2025/03/14", passengers=2)]', FLIGHT, 1),
    ('[book_flight(origin="Paris", destination="Tokyo", date="2025-03-14")]', FLIGHT, 0),  # passengers required
    ('[book_flight(origin="Paris", destination="Tokyo", date="2025-03-14", passengers=2.0)]', FLIGHT, 0),
    ('[book_flight(origin="Paris", destination="Tokyo", date="2025-03-14", passengers="2")]', FLIGHT, 0),
    ('[book_flight(origin="Paris", destination="Tokyo", date="2025-03-14", passengers=True)]', FLIGHT, 0),
    ('[book_flight(origin="Tokyo", destination="Paris", date="2025-03-14", passengers=2)]', FLIGHT, 0),
    (f"[{GOOD_FLIGHT}, price=400+50)]", FLIGHT, 0),                             # never evaluated
    (f"[{GOOD_FLIGHT}, price=-450.0)]", FLIGHT, 0),
    ('[make_histogram(data=[7, 8], bins=4), make_histogram(data=[1, 2, 3], bins=5)]', HISTOGRAMS, 1),  # any order
    ('make_histogram(data=[1, 2, 3], bins=5)\nmake_histogram(data=[7, 8], bins=4)', HISTOGRAMS, 1),  # one a line
    ('[make_histogram(data=[1, 2, 3], bins=5), make_histogram(data=[7, 8], bins=5)]', HISTOGRAMS, 0),
    ('[make_histogram(data=[3, 2, 1], bins=5), make_histogram(data=[7, 8], bins=4)]', HISTOGRAMS, 0),  # list order
    ('[make_histogram(data=["1", "2", "3"], bins=5), make_histogram(data=[7, 8], bins=4)]', HISTOGRAMS, 0),
    ('[make_histogram(data=[1, 2, 3], bins=5)]', HISTOGRAMS, 0),               # one call missing
    ('[send_message(to="Bo", text="Running late, sorry!")]', MESSAGE, 1),      # a comma inside a string
    ('[send_message(to="Bo", text="running late sorry!")]', MESSAGE, 1),       # case, commas, spaces ignored
    ('[send_message(to="Bo", text="Running late, sorry")]', MESSAGE, 0),       # "!" is not
    ('[send_message(to="Bo", text="Running early, sorry!")]', MESSAGE, 0),
    ("""[send_message(to="Bo", text='It\\'s fine, "really" (soon) [ok]')]""", QUOTED, 1),  # quotes, brackets
    ('[set_config(options={"mode": "fast", "level": 2})]', CONFIG, 1),
    ('[set_config(options={"mode": "fast"})]', CONFIG, 1),                      # a dict key that may be left out
    ('[set_config(options={"mode": "slow"})]', CONFIG, 0),
    ('[set_config(options={"mode": "fast", "extra": 1})]', CONFIG, 0),
    ('[add_people(people=[{"name": "Ann", "age": 30}, {"name": "Bo", "age": 41}])]', PEOPLE, 1),
    ('[add_people(people=[{"name": "Bo", "age": 41}, {"name": "Ann", "age": 30}])]', PEOPLE, 0),
    ('[toggle(flag=True)]', TOGGLE, 1),
    ('[toggle(flag=1)]', TOGGLE, 0),
    ('[toggle(flag="True")]', TOGGLE, 0),
]


@pytest.mark.parametrize("reply, reference, expected", SCORER_CASES)
def test_ast_scorer(reply, reference, expected):
    assert ACTIONS.score(reply, instance(reference)) == expected


def test_calls_are_read_without_running_anything(tmp_path):
    target = tmp_path / "created"
    reply = f'[get_weather(city=open("{target}", "w"), days=__import__("os").system("touch {target}"))]'
    calls = find_calls(reply)
    assert calls is not None and calls[0].name == "get_weather"
    assert calls[0].args["city"] == f'open(\'{target}\', \'w\')'  # its source text, never its value
    assert not target.exists()
    assert ACTIONS.score(reply, instance(WEATHER)) == 0


def test_the_outer_call_is_read_and_nested_calls_become_values():
    calls = find_calls('[get_weather(city=lookup(name="Paris"), unit=pick("c"))]')
    assert [c.name for c in calls] == ["get_weather"]
    assert calls[0].args == {"city": {"lookup": {"name": "Paris"}}, "unit": 'pick(\'c\')'}
    assert find_calls("This is (just prose) with parentheses.") is None
    assert find_calls("def get_weather(city='Paris'):\n    pass") is None  # a definition calls nothing
    assert find_calls("") is None


@pytest.mark.parametrize("reply", [
    '[get_weather(city="' + "a" * 1_000_000 + '")]',                 # a one-megabyte string
    "[make_histogram(data=[" + "1, " * 50_000 + "1], bins=5)]",        # a huge list
    "[f(a=" + "[" * 100_000 + "]" * 100_000 + ")]",                    # deep nesting
    "[f(a=" + "9" * 10_000 + ")]",                                     # an integer of 10,000 digits
    "f(" * 20_000,                                                     # never closed, many starts
    "word(" * 2_000 + ")" * 2_000,
])
def test_huge_or_hostile_replies_are_refused_at_once(reply):
    start = time.perf_counter()
    assert find_calls(reply) is None
    assert ACTIONS.score(reply, instance(WEATHER)) == 0
    # A guard against a stalled evaluation (the caps bound the work), not a speed figure.
    assert time.perf_counter() - start < 2.0


def test_format_calls_round_trips():
    text = '[send_message(to="Bo", text="It\'s \\"fine\\", ok"), toggle(flag=False), f(a=[1, -2.5], b={"k": None})]'
    calls = parse_calls(text)
    assert parse_calls(format_calls(calls)) == calls


# ---------------------------------------------------------------------------- LiC's actions sample

@needs_lic
def test_lic_actions_instances_load_render_and_their_references_score():
    instances = load_source(f"lic:{LIC_SAMPLE}", "actions")
    assert len(instances) == 5
    for inst in instances:
        gold = ACTIONS.gold_reply(inst)
        assert ACTIONS.score(gold, inst) == 1.0, inst.task_id
        assert ACTIONS.extract_answer(f"Sure:\n```python\n{gold}\n```") == gold
        system = system_message(inst)["content"]
        assert all(json.dumps(f["name"]) in system for f in inst.fields["function"])
        for view in VIEWS:
            record = render_view(inst, view, seed=1)
            assert record["system"] == system and record["user_turns"], view
        assert user_turns(inst, "full") == [inst.fields["fully_specified_question"][0][0]["content"]]


@needs_lic
def test_lic_actions_score_zero_with_one_wrong_argument():
    for inst in load_source(f"lic:{LIC_SAMPLE}", "actions"):
        calls = find_calls(ACTIONS.gold_reply(inst))
        param, value = next(iter(calls[-1].args.items()))
        calls[-1].args[param] = value + 1 if isinstance(value, (int, float)) else (
            [v + 1 for v in value] if isinstance(value, list) else "Nowhere")
        assert ACTIONS.score(format_calls(calls), inst) == 0.0, inst.task_id


def test_bad_actions_records_are_clear_errors(tmp_path):
    good = {"task_id": "a", "task": "actions", "function": FUNCTIONS, "reference_answer": WEATHER,
            "fully_specified_question": [[{"role": "user", "content": "Weather in Paris?"}]],
            "shards": [{"shard_id": 1, "shard": "Weather?"}, {"shard_id": 2, "shard": "In Paris."}]}
    cases = [({"reference_answer": [{"nope": {"city": ["Paris"]}}]}, "reference_answer[0]"),
             ({"reference_answer": [{"get_weather": {"city": "Paris"}}]}, "reference_answer[0]"),
             ({"function": []}, "function"),
             ({"function": [{"name": "x"}]}, "function[0].parameters"),
             ({"fully_specified_question": "Weather in Paris?"}, "fully_specified_question")]
    for change, field in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps({**good, **change}) + "\n")
        with pytest.raises(FicError) as err:
            load_source(f"jsonl:{path}", "actions")
        assert err.value.field == field and err.value.record == 1 and str(path) in str(err.value)


# ---------------------------------------------------------------------------- the task's hooks

@pytest.fixture(scope="module")
def flight():
    return instance(FLIGHT)


def test_values_in_names_reference_values_and_numbers(flight):
    found = ACTIONS.values_in("Flying from PARIS to tokyo with 2 bags", flight)
    assert found["paris"] == 1 and found["tokyo"] == 1 and 2 in found
    assert "paris" not in ACTIONS.values_in("The parish fair", flight)
    assert ACTIONS.values_in("From Paris with 2 bags") == Counter({Fraction(2): 1})  # no instance: numbers only


def test_leak_allows_given_values_only_and_never_a_call(flight):
    revealed = set(ACTIONS.values_in("I'm flying from Paris with 2 passengers.", flight))
    assert ACTIONS.leak("Got it, from Paris for 2 people. Where to?", revealed, flight) is None
    assert "tokyo" in ACTIONS.leak("Is it Tokyo?", revealed, flight)
    assert "2025" in ACTIONS.leak("Flying on 2025-03-14?", revealed, flight)
    assert ACTIONS.leak('[book_flight(origin="Paris")]', revealed, flight) == "holds a function call"
    assert ACTIONS.leak("I'll run book_flight( once I know more", revealed, flight) == "holds a function call"
    assert ACTIONS.mask_values("From Paris to Tokyo on 2025-03-14", revealed, flight) == "From Paris to ___ on ___"


@pytest.mark.parametrize("reply, label", [
    ('[book_flight(origin="Paris", destination="Tokyo", date="2025-03-14")]', "answer_attempt"),
    ('Here is the call:\n```python\nbook_flight(origin="Paris")\n```', "answer_attempt"),
    ("Which date would you like to fly?", "clarification"),
    ("Where are you flying to? And on which date?", "interrogation"),
    ("So you are flying from Paris on 2025-03-14.", "discussion"),  # a date in prose commits to no call
    ("Should I use book_flight()?", "clarification"),
    ("[get_time()]", "answer_attempt"),                                 # a call list, if argument-free
    ("You can use the `len()` function for that.", "discussion"),       # a function named in prose
    ("```python\ndef get_flight(flight_id):\n    return lookup(flight_id)\n```", "discussion"),
    ('[book_flight(origin="Paris")] Anything else?', "answer_attempt"),
    ("I can't help with booking flights.", "refuse"),
    ("", "missing"),
])
def test_rule_labels_calls_and_questions(reply, label):
    assert reply_label(ACTIONS, reply, ["I want to fly from Paris."]) == label


def test_ask_for_asks_for_the_next_argument_without_its_value(flight):
    rng = random.Random(0)
    revealed = set(ACTIONS.values_in("I want to book a flight from Paris.", flight))
    for _ in range(20):
        question = ACTIONS.ask_for("I'm going to Tokyo.", revealed, rng, flight)
        assert question.endswith("?") and "arrival city" in question
        assert ACTIONS.leak(question, revealed, flight) is None
    assert "departure" not in ACTIONS.ask_for("Flying on 2025-03-14.", revealed, rng, flight)  # the date's own noun
    assert ACTIONS.ask_for("Thanks!", revealed, rng, flight) is None  # no argument: the corpus asks generically
    assert ACTIONS.ask_for("From Paris to Tokyo.", set(), rng, flight) is None  # two arguments at once
    assert ACTIONS.ask_for("I'm going to Tokyo.", revealed, rng) is None  # no instance, no schema


def test_premature_calls_are_never_correct():
    rng = random.Random(0)
    instances = load_source("actions-gen:train", "actions", limit=200, seed=2)
    for inst in instances:
        for k in range(1, len(inst.shards)):
            text = ACTIONS.premature_reply(inst.shard_texts[:k], inst, rng)
            assert find_calls(text) is not None and ACTIONS.score(text, inst) == 0.0
    # Even when every value is already known the call made is a wrong one.
    assert ACTIONS.score(ACTIONS.premature_reply([" ".join(inst.shard_texts)], inst, rng), inst) == 0.0


# ---------------------------------------------------------------------------- SFT corpus and simulator

def reference_values(inst):
    (_, params), = inst.fields["reference_answer"][0].items()
    values = [v for accepted in params.values() for v in accepted if v != ""]
    shown = [str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in values]
    return [s for s in shown if len(s) >= 2] + [str(v) for v in values if isinstance(v, int) and v < 10]


def check_corpus(records, by_id):
    for record in records:
        inst = by_id[record["task_id"]]
        messages = record["messages"][1:]
        assert record["messages"][0]["content"] == ACTIONS.system_prompt_for(inst)
        said = ""
        for message, after in zip(messages, messages[1:] + [None]):
            if message["role"] == "user":
                said += " " + message["content"].lower()
                continue
            if after is None:  # the final reply: the reference call
                assert ACTIONS.score(message["content"], inst) == 1.0 and message["train"]
            elif not message["train"]:  # a recovery conversation's premature call, out of the loss
                assert ACTIONS.score(message["content"], inst) == 0.0
            else:  # the test's own leak check: no call, no value the user has not said yet
                assert not re.search(r"\w\s*\(", message["content"]), message["content"]
                for value in reference_values(inst):
                    if re.search(rf"(?<!\w){re.escape(value.lower())}(?!\w)", message["content"].lower()):
                        assert re.search(rf"(?<!\w){re.escape(value.lower())}(?!\w)", said), (value, record["id"])
                for number in re.findall(r"\d+(?:\.\d+)?", message["content"]):
                    assert number in said, (number, record["id"])


def test_actions_sft_corpus_asks_for_arguments_and_never_leaks():
    cfg = load_config(SFTDataConfig, None, ["data.source=actions-gen:train", "data.task=actions", "data.limit=150",
                                            "conversations_per_instance=2", "ask_share=0.5"])
    instances, _ = load_instances(cfg)
    records, stats = make_corpus(instances, cfg, progress=False)
    assert {r["kind"] for r in records} == {"deferral", "recovery", "single_turn"}
    asks = [m["content"] for r in records for m, kind in
            zip([m for m in r["messages"] if m["role"] == "assistant"], r["reply_kinds"]) if kind == "ask"]
    assert stats["ask_specific"] >= 0.8 * len(asks) and any("departure date" in a for a in asks)
    check_corpus(records, {i.task_id: i for i in instances})


@needs_lic
def test_actions_sft_corpus_on_the_lic_sample_never_leaks():
    cfg = load_config(SFTDataConfig, None, [f"data.source=lic:{LIC_SAMPLE}", "data.task=actions", "ask_share=0.5",
                                            "conversations_per_instance=6", "single_turn_share=0"])
    instances, _ = load_instances(cfg)
    records, _ = make_corpus(instances, cfg, progress=False)
    assert len(records) == 30
    check_corpus(records, {i.task_id: i for i in instances})


def test_the_simulator_plays_actions_conversations():
    instances = load_source("actions-gen:test", "actions", limit=6)

    def said_and_instance(messages):
        said = [m["content"] for m in messages if m["role"] == "user"]
        return said, next(i for i in instances if said in ([ACTIONS.full_prompt(i)], i.shard_texts[:len(said)]))

    def patient(messages):
        """Calls once every argument value of the instance is in the conversation, else asks."""
        said, inst = said_and_instance(messages)
        missing = [v for v in reference_values(inst) if v not in " ".join(said)]
        return "Which details are still missing?" if missing else ACTIONS.gold_reply(inst)

    def hasty(messages):
        said, inst = said_and_instance(messages)
        return ACTIONS.premature_reply(said, inst, random.Random(0))

    for fn, expected, premature in ((patient, 1.0, False), (hasty, 0.0, True)):
        convs = make_conversations(instances, ["full", "sharded"], runs=1)
        play(convs, FunctionBackend(fn), VerbatimUser(), RuleClassifier(), SamplingParams(max_new_tokens=64))
        for conv in convs:
            assert conv.messages[0]["content"] == ACTIONS.system_prompt_for(conv.instance)
            if conv.view == "full":
                assert conv.score() == (1.0 if fn is patient else 0.0)
                continue
            assert conv.score() == expected and conv.to_record()["premature_answer"] == premature, conv.key
            labels = [t.label for t in conv.turns]
            assert labels[-1] == "answer_attempt"
            assert labels[:-1] == (["clarification"] * (len(labels) - 1) if fn is patient else
                                   ["answer_attempt"] * (len(labels) - 1))


def test_generated_instances_show_their_tools_as_signature_lines():
    from fic.tasks.actions import tool_signature

    inst = load_source("actions-gen:test", "actions", limit=3, seed=0)[0]
    system = system_message(inst)["content"]
    for schema in inst.fields["function"]:
        line = tool_signature(schema)
        assert line in system.splitlines() and line.startswith(schema["name"] + "(")
        for name in schema["parameters"]["properties"]:
            assert f"{name}: " in line
    assert '{"name"' not in system
    schema = {"name": "rent_car", "description": "Rent a car.", "parameters": {"type": "dict", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "car_type": {"type": "string", "enum": ["suv", "van"]}},
        "required": ["city", "days"]}}
    assert tool_signature(schema) == 'rent_car(city: str, days: int, car_type: "suv" | "van" = None) -- Rent a car.'
    with pytest.raises(FicError, match="tool_format"):
        read_instance({**inst.to_dict(), "tool_format": "yaml"})


def test_a_request_is_answerable_once_every_required_argument_is_said():
    """actions: answerable once each required parameter's value has been said (an optional one
    may still follow); not before; None when the called function's schema is not listed."""
    task = tasks.get("actions")
    instance, order, required = late_optional_instance()
    texts = instance.shard_texts
    complete = max(order.index(p) for p in required) + 2  # shards (intent first) that hold every required value
    assert task.answerable(instance, texts[:complete - 1]) is False
    assert task.answerable(instance, texts[:complete]) is True and complete < len(texts)
    assert task.answerable(instance, texts) is True
    assert task.answerable(instance, texts[:1]) is False  # the intent alone
    unlisted = copy.deepcopy(instance)
    unlisted.fields["function"] = [dict(f, name=f["name"] + "_x") for f in unlisted.fields["function"]]
    assert task.answerable(unlisted, texts) is None
    assert tasks.get("math").answerable(instance, texts) is None  # a task that cannot tell
