"""Self-labelling (`fic.corpus.self_label`, `fic self-label`): the pseudo-label filter on scripted
calls, and blinding: a sentinel planted in the gold reaches neither the model's prompts, nor the
self-labelled file, nor its card, nor the self-training corpus `fic sft-data` builds from it."""

import copy
import json

import pytest
from scripted import FunctionBackend

from fic import tasks
from fic.cli.main import main
from fic.core.instance import Instance
from fic.corpus.self_label import check_self_label, label
from fic.data.actions_gen import generate
from fic.data.views import render_view

ACTIONS = tasks.get("actions")
SENTINEL = "zz-sentinel-gold-7731"


def garden():
    """test-unseen 0: water_garden(zone="flower bed", minutes=15, start_time="09:45"), every
    parameter required; tools convert_temperature and water_garden."""
    return Instance.from_dict(generate("test-unseen", 1)[0])


GOLD = '[water_garden(zone="flower bed", minutes=15, start_time="09:45")]'


@pytest.mark.parametrize("full, concat, why", [
    ("I need the zone first.", GOLD, "no call in the full view's reply"),
    (GOLD, '[water_garden(zone="flower bed", minutes=20, start_time="09:45")]', "full and concat views disagree"),
    (GOLD, "What is the zone?", "no call in the concat view's reply"),
    ('[set_timer(minutes=15)]', '[set_timer(minutes=15)]', "function not in the tool list"),
    ('[water_garden("flower bed", minutes=15, start_time="09:45")]',) * 2 + ("positional argument",),
    ('[water_garden(zone="flower bed", minutes=15, start_time="09:45", colour="red")]',) * 2
    + ("parameter the function does not have",),
    ('[water_garden(zone="flower bed", minutes=15)]',) * 2 + ("required argument missing",),
    ('[water_garden(zone="rose bed", minutes=15, start_time="09:45")]',) * 2 + ("value not in the request",),
    ('[water_garden(zone="flower bed", minutes=16, start_time="09:45")]',) * 2 + ("value not in the request",),
    ('[water_garden(zone="flower bed", minutes=15, start_time=True)]',) * 2 + ("value not in the request",),
])
def test_the_filter_refuses_each_kind_of_bad_self_label(full, concat, why):
    assert check_self_label(garden(), full, concat) == (None, why)


def test_the_filter_keeps_an_agreeing_well_formed_call_and_labels_it():
    instance = garden()
    # The concat view may phrase the same call differently: argument order and spacing do not matter.
    calls, why = check_self_label(instance, f"Sure: {GOLD}",
                                  '[water_garden(start_time="09:45", zone="flower bed", minutes=15)]')
    assert why is None and [c.name for c in calls] == ["water_garden"]
    records, dropped = label([instance], [GOLD], [GOLD])
    assert records[0]["reference_answer"] == instance.fields["reference_answer"] and not dropped
    # A label is the model's call, not the gold: an optional argument it left out is accepted left out.
    refund = Instance.from_dict(generate("test-unseen", 2)[1])  # request_refund(order_id, amount; reason optional)
    call = '[request_refund(order_id="OR39997", amount=43.75)]'
    (record,), _ = label([refund], [call], [call])
    assert record["reference_answer"] == [{"request_refund": {"order_id": ["OR39997"], "amount": [43.75],
                                                              "reason": [""]}}]
    assert ACTIONS.score(call, Instance.from_dict(record)) == 1.0


def test_checked_applies_the_filter_to_the_full_views_call_alone():
    instance = garden()
    # A model that asks a question in the concat view: dropped under agreeing, kept under checked.
    assert check_self_label(instance, GOLD, "Which zone?") == (None, "no call in the concat view's reply")
    calls, why = check_self_label(instance, GOLD, "Which zone?", "checked")
    assert why is None and [c.name for c in calls] == ["water_garden"]
    for reply, why in (("Which zone?", "no call in the full view's reply"),
                       ('[water_garden(zone="rose bed", minutes=15, start_time="09:45")]', "value not in the request"),
                       ('[water_garden(zone="flower bed", minutes=15)]', "required argument missing")):
        assert check_self_label(instance, reply, None, "checked") == (None, why)
    (record,), dropped = label([instance], [GOLD], None, "checked")
    assert record["reference_answer"] == instance.fields["reference_answer"] and not dropped


def test_any_call_keeps_wrong_calls_of_listed_functions_and_reads_no_concat_reply():
    instance = garden()
    wrong = '[water_garden(zone="rose bed", minutes=15)]'  # a value not in the request, a required one missing
    assert check_self_label(instance, wrong, None, "any-call")[1] is None
    for reply, why in (("Which zone?", "no call in the full view's reply"),
                       ('[set_timer(minutes=15)]', "function not in the tool list"),
                       ('[water_garden(zone="x", colour="red")]', "parameter the function does not have")):
        assert check_self_label(instance, reply, None, "any-call") == (None, why)
    (record,), _ = label([instance], [wrong], None, "any-call")
    assert record["reference_answer"] == [{"water_garden": {"zone": ["rose bed"], "minutes": [15],
                                                            "start_time": [""]}}]


def planted(records):
    """The records with the first string value of each gold call replaced by the sentinel."""
    out = copy.deepcopy(records)
    for record in out:
        (params,) = record["reference_answer"][0].values()
        name = next(p for p, v in params.items() if isinstance(v[0], str) and v[0])
        params[name] = [SENTINEL]
    return out


def test_blinding_the_sentinel_gold_reaches_no_prompt_label_card_or_self_training_corpus(tmp_path, monkeypatch):
    clean = generate("test-unseen", 12, seed=3)
    b_train = tmp_path / "b-train.jsonl"
    b_train.write_text("".join(json.dumps(r) + "\n" for r in planted(clean)))
    # A scripted model that answers from what it reads: the right call for the request in its last
    # user turn (as a model that understood it would), except that it calls nothing on instance 0
    # and calls differently in the concat view on instance 1: both must be dropped.
    answers = {}
    for number, record in enumerate(clean):
        instance = Instance.from_dict(record)
        for view in ("full", "concat"):
            text = render_view(instance, view)["messages"][-1]["content"]
            answers[text] = ("Which zone?" if number == 0 else
                             "[nothing()]" if number == 1 and view == "concat" else ACTIONS.reference_answer(instance))
    prompts = []

    def model(messages):
        prompts.append(json.dumps(messages))
        return answers[messages[-1]["content"]]

    monkeypatch.setattr("fic.cli.self_label.make_backend", lambda cfg: FunctionBackend(model))
    labelled = tmp_path / "b-train.self.jsonl"
    assert main(["self-label", "--model", "scripted", "--source", f"jsonl:{b_train}", "--out", str(labelled)]) == 0
    assert len(prompts) == 24 and not any(SENTINEL in p for p in prompts)
    records = [json.loads(line) for line in labelled.read_text().splitlines()]
    card = json.loads((tmp_path / "b-train.self.card.json").read_text())
    assert [r["task_id"] for r in records] == [r["task_id"] for r in clean[2:]]
    assert card["kept"] == 10 and card["dropped"] == {"full and concat views disagree": 1,
                                                      "no call in the full view's reply": 1}
    assert SENTINEL not in labelled.read_text() and SENTINEL not in json.dumps(card)
    assert "original reference answers were dropped" in card["reference_answer"]
    # The blinded prompts VASD reads (every call, right or wrong): no sentinel either, no concat prompt.
    blinded = tmp_path / "b-train.blind.jsonl"
    prompts.clear()
    assert main(["self-label", "--model", "scripted", "--source", f"jsonl:{b_train}", "--keep", "any-call",
                 "--out", str(blinded)]) == 0
    assert len(prompts) == 12 and SENTINEL not in blinded.read_text()
    assert len(blinded.read_text().splitlines()) == 11  # all but the reply with no call
    # Checked: the filter on the full view alone keeps instance 1 too, and asks no concat prompt.
    checked = tmp_path / "b-train.checked.jsonl"
    prompts.clear()
    assert main(["self-label", "--model", "scripted", "--source", f"jsonl:{b_train}", "--keep", "checked",
                 "--out", str(checked)]) == 0
    assert len(prompts) == 12 and SENTINEL not in checked.read_text()
    assert len(checked.read_text().splitlines()) == 11
    assert "keep checked" in json.loads((tmp_path / "b-train.checked.card.json").read_text())["reference_answer"]

    # C2: the self-training corpus built from the self-labels holds only them.
    corpus = tmp_path / "c2.sft.jsonl"
    config = tmp_path / "c2.yaml"
    config.write_text(f"data: {{source: ['jsonl:{labelled}'], task: actions, seed: 1}}\nseed: 1\nout: {corpus}\n"
                      "single_turn_share: 0.2\nrecovery_share: 0.3\npartial_share: 0.15\n")
    assert main(["sft-data", "--config", str(config)]) == 0
    built = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert SENTINEL not in corpus.read_text()
    labels = {r["task_id"]: ACTIONS.reference_answer(Instance.from_dict(r)) for r in records}
    assert {c["task_id"] for c in built} <= set(labels) and len(built) == 10
    for conversation in built:
        final = [m for m in conversation["messages"] if m["role"] == "assistant" and m["train"]][-1]
        if conversation["kind"] != "partial":  # a partial request ends in an ask, not a call
            assert ACTIONS.extract_answer(final["content"]) == labels[conversation["task_id"]]


def test_a_run_that_keeps_nothing_is_an_error_that_names_why_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """A model trained to defer asks a question in every concat view: under agreeing nothing is
    kept, and the verb says so (and what to use instead) rather than leave an empty corpus for
    `fic sft-data` to refuse later."""
    b_train = tmp_path / "b-train.jsonl"
    b_train.write_text("".join(json.dumps(r) + "\n" for r in generate("test-unseen", 3, seed=5)))
    full_prompts = {render_view(Instance.from_dict(r), "full")["messages"][-1]["content"]: r
                    for r in map(json.loads, b_train.read_text().splitlines())}

    def model(messages):
        record = full_prompts.get(messages[-1]["content"])
        return ACTIONS.reference_answer(Instance.from_dict(record)) if record else "Thanks. What's the zone?"

    monkeypatch.setattr("fic.cli.self_label.make_backend", lambda cfg: FunctionBackend(model))
    out = tmp_path / "b-train.self.jsonl"
    assert main(["self-label", "--model", "scripted", "--source", f"jsonl:{b_train}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no instance of 3 kept (dropped: 3 no call in the concat view's reply)" in err and "--keep checked" in err
    assert "Traceback" not in err and not out.exists() and not (tmp_path / "b-train.self.card.json").exists()
    assert main(["self-label", "--model", "scripted", "--source", f"jsonl:{b_train}", "--keep", "checked",
                 "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 3
