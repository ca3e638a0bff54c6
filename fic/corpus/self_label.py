"""`fic self-label`: replace instances' reference answers by a model's own filtered calls.

Label-free adaptation (VASD on prompts without gold, or the self-training it is compared with)
must never read the gold of the prompts it adapts on. This makes that true by construction: the
model answers each instance greedily in the full view and in the concat view; where the two
replies are one and the same call list and the call passes `check_self_label`, the instance is
written with `reference_answer` replaced by that call, and every other instance is dropped
(counted by reason). The original reference answers are not written anywhere: a stage that reads
the output cannot read them, and the data card says so.

The filter (function calls, `actions`): both views agree; every function called is one the
instance lists; no positional argument, no parameter the function does not have; every required
parameter given; every value stated in the request (numbers by value, strings as whole words,
case-folded). A value that cannot be checked against text (a boolean, a null) fails it.

`keep="checked"` applies the same filter to the full view's call alone: for a model that answers
the concat view's bulleted request by asking a question (a stage-1 model trained to defer does, on
every prompt of issue 55's B-train), agreement leaves nothing, and the card's counts say so
("no call in the concat view's reply"). `keep="any-call"` keeps instead every instance whose
full-view reply is a call of listed functions with only their parameters (an answer key the task
can score against), right or wrong: blinded prompts for a stage that must not read gold but needs
every prompt (VASD's rollouts), where "answer" is then only the model's own belief.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from fic import tasks
from fic.core.errors import FicError
from fic.core.files import write_json, write_jsonl
from fic.core.generation import SamplingParams
from fic.core.instance import Instance
from fic.data.views import render_view
from fic.tasks.actions import states
from fic.tasks.calls import Call, find_calls

VIEWS = ("full", "concat")  # the two single-turn views whose calls must agree
KEEP = ("agreeing", "checked", "any-call")


def check_self_label(instance: Instance, full_reply: str, concat_reply: str | None,
                     keep: str = "agreeing") -> tuple[list[Call] | None, str | None]:
    """The calls to train on, or None and why not. Reads the instance's tools and request only,
    never its reference answer. `concat_reply` is read only under `keep="agreeing"`; `"any-call"`
    checks only that the calls are an answer key (listed functions, their own parameters, named)."""
    if keep not in KEEP:
        raise FicError(f"unknown keep {keep!r}; expected one of {', '.join(KEEP)}", field="keep")
    calls = find_calls(full_reply)
    if calls is None:
        return None, "no call in the full view's reply"
    if keep == "agreeing":
        concat_calls = find_calls(concat_reply or "")
        if concat_calls is None:
            return None, "no call in the concat view's reply"
        if concat_calls != calls:
            return None, "full and concat views disagree"
    tools = {schema["name"]: schema for schema in instance.fields["function"]}
    request = tasks.of(instance).full_prompt(instance)
    for call in calls:
        schema = tools.get(call.name)
        if schema is None:
            return None, "function not in the tool list"
        if call.positional:
            return None, "positional argument"
        parameters = schema.get("parameters") or {}
        properties = parameters.get("properties") or {}
        if any(param not in properties for param in call.args):
            return None, "parameter the function does not have"
        if keep == "any-call":
            continue
        if any(param not in call.args for param in parameters.get("required") or ()):
            return None, "required argument missing"
        if not all(states(request, value) for value in call.args.values()):
            return None, "value not in the request"
    return calls, None


def self_labelled(instance: Instance, calls: list[Call]) -> dict:
    """The instance's record with `reference_answer` built from `calls` (an optional parameter
    left out is accepted left out) and nothing of the original answer."""
    record = {key: value for key, value in instance.to_dict().items() if key != "reference_answer"}
    tools = {schema["name"]: schema for schema in instance.fields["function"]}
    record["reference_answer"] = [
        {call.name: {param: [call.args[param]] if param in call.args else [""]
                     for param in (tools[call.name].get("parameters") or {}).get("properties") or {}}}
        for call in calls]
    return record


def replies(backend: Any, instances: list[Instance], view: str, *, max_new_tokens: int,
            batch_size: int) -> list[str]:
    """The model's greedy single-turn reply to each instance in `view`."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    out = []
    for start in range(0, len(instances), batch_size):
        chats = [render_view(instance, view)["messages"] for instance in instances[start:start + batch_size]]
        out += [generation.text for generation in backend.chat(chats, params)]
    return out


def label(instances: Iterable[Instance], full: list[str], concat: list[str] | None,
          keep: str = "agreeing") -> tuple[list[dict], Counter]:
    """Self-labelled records of the instances whose replies pass the filter; the rest counted."""
    kept, dropped = [], Counter()
    instances = list(instances)
    for instance, full_reply, concat_reply in zip(instances, full, concat or [None] * len(instances), strict=True):
        if instance.task != "actions":
            raise FicError(f"self-labelling reads function calls (task actions); {instance.task_id} is "
                           f"task {instance.task}", field="task")
        calls, why = check_self_label(instance, full_reply, concat_reply, keep)
        if calls is None:
            dropped[why] += 1
        else:
            kept.append(self_labelled(instance, calls))
    return kept, dropped


def write_self_labelled(out: str | Path, records: list[dict], dropped: Counter, *, model: str, source: str,
                        keep: str = "agreeing") -> dict:
    """The records (atomically) and their card `<out stem>.card.json`."""
    out = Path(out)
    kept_where = {"agreeing": "kept only where the concat view's call is the same and it passes the filter",
                  "checked": "kept only where it passes the filter (the concat view not asked: keep checked)",
                  "any-call": "kept wherever it is a call of listed functions, right or wrong (keep any-call)"}[keep]
    card = {
        "source": source, "model": model, "keep": keep, "instances": len(records) + sum(dropped.values()),
        "kept": len(records), "dropped": dict(sorted(dropped.items())),
        "reference_answer": f"the model's own greedy full-view call, {kept_where} (fic.corpus.self_label); the "
                            "original reference answers were dropped and are in no file this command writes",
    }
    write_jsonl(out, records)
    write_json(card_path(out), card)
    return card


def card_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.stem + ".card.json")
