"""Function calling (Lost in Conversation's `actions` task, from BFCL v3): answers are calls.

An instance carries LiC's keys: `function` (the tool schemas the assistant may call),
`fully_specified_question` (`[[{"role": "user", "content": ...}]]`, BFCL's form) and
`reference_answer` (`[{function_name: {param: [accepted values]}}]`; `""` among a parameter's
accepted values means it may be left out). The system prompt lists the tools, one JSON
object a line, and asks for the call(s) only, as `[func(a=1, b="x")]`; every view gets the
same system prompt.

Scoring is BFCL's AST match (`fic.tasks.calls.check_calls`). FiC reads the call wherever it
stands in the reply (after a sentence, inside a code fence); LiC scores a reply only when the
whole of it, code fences removed, is the call list. Like the math task's numeric leniency,
this is deliberate: it scores what the model decided, not how tidy its reply is.

What texts carry (`values_in`): numbers (by value, as for math) and the reference's string
values (case-folded), so a reply before the last shard may repeat what the user gave but not
name a city, a date or an amount the user has not given yet, and must not call anything.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections import Counter
from typing import Any

from fic.core.instance import Instance
from fic.core.parsing import NUMBER, number_values
from fic.tasks import lic_prompts
from fic.tasks.answers import framed_as_template, is_placeholder
from fic.tasks.base import ErrorFactory, Task
from fic.tasks.calls import (
    Call,
    check_calls,
    find_calls,
    format_calls,
    reference_calls,
)

SYSTEM_PROMPT = (
    "You are an assistant that calls functions. Given a request and the functions below, reply with "
    "the function call(s) that fulfil it, in the form [func_name(param=value, other_param=\"text\")], and "
    "nothing else. If no function fits the request, say so. If the request lacks a value that a "
    "function needs, say so.\n\nFunctions:\n")

TOOL_FORMATS = ("json", "signature")
_TYPE_NAMES = {"string": "str", "integer": "int", "float": "float", "number": "float", "boolean": "bool",
               "array": "list", "dict": "dict"}


def tool_signature(schema: dict) -> str:
    """A tool as one Python-style line: `rent_car(city: str, days: int, car_type: "suv" | "van" = None) -- Rent a car.`
    (enums as their values, optional parameters defaulting to None)."""
    parameters = schema.get("parameters") or {}
    required = set(parameters.get("required") or ())
    parts = []
    for name, spec in (parameters.get("properties") or {}).items():
        kind = " | ".join(json.dumps(v) for v in spec["enum"]) if spec.get("enum") else \
            _TYPE_NAMES.get(spec.get("type"), str(spec.get("type", "any")))
        parts.append(f"{name}: {kind}" + ("" if name in required else " = None"))
    return f"{schema['name']}({', '.join(parts)}) -- {schema.get('description', '')}".rstrip(" -")


DEFERRALS = (
    "Got it. What else do I need to know?",
    "Okay, noted. What are the other details?",
    "Thanks. I'll wait for the remaining details before making the call.",
    "Understood. Please go on.",
    "Noted. Is there anything else the request needs?",
    "Okay. What else should the call include?",
    "Got it so far. What's the next detail?",
    "Alright. I need a few more details before I can call the function.",
    "Sure. Tell me the rest.",
    "Thanks. Anything else?",
    "Okay, I have that. What else?",
    "Noted. I'll hold off on the call until I have everything.",
    "Makes sense. Go on.",
    "Got it. Let me know the remaining details.",
    "Understood. Continue whenever you're ready.",
    "Alright, noted. What other details do you have?",
)
GENERIC_ASKS = (
    "What other details does the request need?",
    "Which details are still missing?",
    "What else should the call include?",
    "Could you give me the remaining details?",
    "Are there more details I should know before making the call?",
    "What are the remaining values for the request?",
)
ASK_FRAMES = ("What is the {noun}?", "Could you tell me the {noun}?", "Can you give me the {noun}?",
              "What's the {noun}?")
ACKS = ("Got it.", "Okay.", "Thanks.", "Noted.", "Sure.", "")
PREMATURE_FRAMES = ("{call}", "{call}", "Here is the call: {call}", "Sure! {call}", "Calling it now: {call}")
CALL_LIST = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")  # "[func(": the form the system prompt asks for
MAX_NOUN_WORDS = 7  # longer parameter descriptions give no brief question: the name is used instead


def _fold(text: str) -> str:
    return " ".join(text.casefold().split())


@functools.lru_cache(maxsize=4096)
def _mention(value: str) -> re.Pattern:
    """A folded string value as a whole mention ("paris" in "to paris." but not in "parish")."""
    return re.compile(rf"(?<!\w){re.escape(value)}(?!\w)")


def value_keys(value: Any) -> set:
    """The `values_in` keys one accepted value is named by: numbers by value (sign ignored,
    as `number_values` reads them), strings case-folded (two characters or more)."""
    if isinstance(value, bool) or value is None:
        return set()
    if isinstance(value, (int, float)):
        return set(number_values(repr(value), words=False))
    if isinstance(value, str):
        folded = _fold(value)
        return {folded} if len(folded) >= 2 else set()
    if isinstance(value, (list, tuple)):
        return set().union(*(value_keys(v) for v in value))
    if isinstance(value, dict):
        return set().union(*(value_keys(v) for v in value.values()))
    return set()


def states(text: str, value: Any) -> bool:
    """Whether `text` names `value` as `values_in` reads texts: every key of it (a number by
    value, a string as a whole case-folded mention); a value with no key (a boolean) is never named."""
    keys = value_keys(value)
    numbers, folded = number_values(text), _fold(text)
    return bool(keys) and all(key in numbers if not isinstance(key, str) else _mention(key).search(folded)
                              for key in keys)


def _strings(value: Any) -> set[str]:
    return {key for key in value_keys(value) if isinstance(key, str)}


class ActionsTask(Task):
    name = "actions"
    system_prompt = SYSTEM_PROMPT.rstrip()
    required_fields = ("function", "fully_specified_question", "reference_answer")
    deferrals = DEFERRALS
    generic_asks = GENERIC_ASKS

    # ------------------------------------------------------------------ the instance's keys

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        functions = fields.get("function")
        if not isinstance(functions, list) or not functions:
            raise error("missing or empty; expected a list of tool schemas {name, description, parameters}",
                        "function")
        if fields.get("tool_format", "json") not in TOOL_FORMATS:
            raise error(f"expected one of {', '.join(TOOL_FORMATS)}, got {fields['tool_format']!r}", "tool_format")
        names = set()
        for i, schema in enumerate(functions):
            where = f"function[{i}]"
            if not isinstance(schema, dict) or not isinstance(schema.get("name"), str) or not schema["name"]:
                raise error("expected an object with a non-empty 'name'", where)
            parameters = schema.get("parameters")
            if not isinstance(parameters, dict) or not isinstance(parameters.get("properties"), dict):
                raise error("expected 'parameters' with a 'properties' object", where + ".parameters")
            if not all(isinstance(spec, dict) for spec in parameters["properties"].values()):
                raise error("expected each property to be an object {type, description}", where + ".parameters")
            missing = [p for p in parameters.get("required") or () if p not in parameters["properties"]]
            if missing:
                raise error(f"required parameter(s) {missing} are not among the properties", where + ".parameters")
            names.add(schema["name"])
        question = fields.get("fully_specified_question")
        if not (isinstance(question, list) and question and isinstance(question[0], list)
                and any(isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
                        and m["content"].strip() for m in question[0])):
            raise error('expected [[{"role": "user", "content": "..."}]] (BFCL\'s form)', "fully_specified_question")
        reference = fields.get("reference_answer")
        if not isinstance(reference, list) or not reference:
            raise error('missing or empty; expected [{"function_name": {"param": [accepted values]}}]',
                        "reference_answer")
        for i, entry in enumerate(reference):
            where = f"reference_answer[{i}]"
            if not isinstance(entry, dict) or len(entry) != 1:
                raise error('expected one {"function_name": {"param": [accepted values]}} object', where)
            (name, params), = entry.items()
            if name not in names:
                raise error(f"calls {name!r}, which is not in 'function' ({', '.join(sorted(names))})", where)
            if not isinstance(params, dict) or not all(isinstance(v, list) and v for v in params.values()):
                raise error("expected each parameter to map to a non-empty list of accepted values", where)

    def system_prompt_for(self, instance: Instance, prompts: str = "fic") -> str:
        fields = instance.fields
        if prompts == "lic":  # LiC formats the tool list as Python prints it (`"{}".format(...)`)
            return lic_prompts.fill(lic_prompts.ACTIONS_SYSTEM, FUNCTIONS=str(fields["function"]))
        # The tools are most of the prompt, and every turn carries them: compact JSON, one tool a
        # line (LiC's data), or Python-style signatures at about 40% of the tokens where the
        # instance asks for them (`tool_format: signature`, FiC's generated data).
        show = tool_signature if fields.get("tool_format") == "signature" else \
            (lambda f: json.dumps(f, ensure_ascii=False, separators=(",", ":")))
        return SYSTEM_PROMPT + "\n".join(show(f) for f in fields["function"])

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        first_turn = instance.fields["fully_specified_question"][0]
        if prompts == "lic":  # LiC takes the first message of BFCL's first turn
            return lic_prompts.fill(lic_prompts.ACTIONS_FULL, QUESTION=first_turn[0]["content"])
        return next(m["content"] for m in reversed(first_turn) if isinstance(m, dict) and m.get("role") == "user")

    # ------------------------------------------------------------------ answers

    def extract_answer(self, text: str) -> str | None:
        calls = find_calls(text)
        return None if calls is None else format_calls(calls)

    def scored(self, text: str, instance: Instance, judge: Any = None) -> tuple[float, str | None]:
        """The score and, for a 0, why: no readable call (none, too long, too deep) or the check's
        reason; the simulator logs it as the turn's score_note."""
        calls = find_calls(text)
        if calls is None:
            return 0.0, "no readable function call in the reply"
        fields = instance.fields
        problem = check_calls(calls, fields["function"], fields["reference_answer"])
        return (0.0, problem) if problem is not None else (1.0, None)

    def reference_answer(self, instance: Instance) -> str:
        return format_calls(reference_calls(instance.fields["reference_answer"]))

    def gold_reply(self, instance: Instance) -> str:
        """The reference call(s) alone, as the system prompt asks: `[func(a=1, b="x")]`."""
        return self.reference_answer(instance)

    # ------------------------------------------------------------------ what texts carry

    def values_in(self, text: str, instance: Instance | None = None) -> Counter:
        """Numbers by value, plus each string value of the reference the text names (folded)."""
        found = number_values(text)
        if instance is None:
            return found
        folded = _fold(text)
        for value in _strings(instance.fields["reference_answer"]):
            hits = len(_mention(value).findall(folded))
            if hits:
                found[value] += hits
        return found

    def leak(self, reply: str, revealed: set, instance: Instance) -> str | None:
        """A call, or any value the user has not given yet; values the user gave may be repeated."""
        if find_calls(reply) is not None or self._names_tool(reply, instance):
            return "holds a function call"
        for value in self.values_in(reply, instance):
            if value not in revealed:
                return f"holds {value}, a value the user has not given yet"
        return None

    def mask_values(self, text: str, revealed: set, instance: Instance | None = None) -> str:
        """`text` with each value not in `revealed` as `___`: strings first, so a date is one blank."""
        if instance is not None:
            for value in sorted(_strings(instance.fields["reference_answer"]) - revealed, key=len,
                                reverse=True):
                text = re.sub(rf"(?<!\w){re.escape(value)}(?!\w)", "___", text, flags=re.IGNORECASE)

        def blank_number(match: re.Match) -> str:
            return match.group(0) if set(number_values(match.group(0))) <= revealed else "___"

        return NUMBER.sub(blank_number, text)

    def _names_tool(self, text: str, instance: Instance) -> bool:
        return any(re.search(rf"(?<![\w.]){re.escape(f['name'])}\s*\(", text)
                   for f in instance.fields["function"])

    def answerable(self, instance: Instance, revealed_texts: list[str]) -> bool | None:
        """Every required parameter of each reference call has its value in what was said: a
        call then is right unless an optional argument is still to come, which the sharded view
        gives no way to know (a premature call, but not an error of reading). None when a
        called function has no schema here or a required value is not text (a boolean)."""
        schemas = {f.get("name"): f for f in instance.fields["function"] if isinstance(f, dict)}
        given = set().union(*(self.values_in(text, instance) for text in revealed_texts))
        for entry in instance.fields["reference_answer"]:
            (name, params), = entry.items()
            if name not in schemas:
                return None
            for param in (schemas[name].get("parameters") or {}).get("required") or []:
                keys = value_keys(params.get(param))
                if not keys:
                    return None
                if not keys & given:
                    return False
        return True

    # ------------------------------------------------------------------ classifying replies

    def committed_answer(self, reply: str) -> bool:
        """Committed when the reply makes a call: one with a named argument, or a call
        list in the asked form (`[get_time()]`). Not one: a function only named in prose ("use
        `len()`", "should I use get_weather()?"), a call suggested in a sentence ("You could call
        get_weather(city="Paris")"), a call with slots to fill (`date="YYYY-MM-DD"`,
        `city="<city>"`, `city=city`), or one presented as an example or as what the call will be
        once the user says more (`fic.tasks.answers.framed_as_template`). Without a call nothing
        is an attempt: a date or an amount stated in prose commits to no call."""
        text = (reply or "").strip()
        calls = find_calls(text)
        made = calls is not None and (any(c.args for c in calls) or CALL_LIST.search(text) is not None)
        if made:
            start = _call_start(text, calls[0].name)
            made = not (any(is_placeholder(v) or _names_itself(k, v) for c in calls for k, v in c.args.items())
                        or framed_as_template(text, start) or SUGGESTION.search(_line_before(text, start)))
        return made

    # ------------------------------------------------------------------ SFT-corpus replies

    def params_named(self, text: str, revealed: set, instance: Instance) -> list[str]:
        """The reference parameters whose values `text` names and `revealed` does not hold yet."""
        new = set(self.values_in(text, instance)) - revealed
        named = []
        for entry in instance.fields["reference_answer"]:
            (_, params), = entry.items()
            for param, accepted in params.items():
                if value_keys(accepted) & new and param not in named:
                    named.append(param)
        return named

    def ask_for(self, shard: str, revealed: set, rng: random.Random,
                instance: Instance | None = None) -> str | None:
        """"What is the departure date?": a question for the one parameter `shard` gives, worded
        from the tool schema's description of it; None when the shard gives no parameter or
        several (the corpus then asks generically)."""
        if instance is None:
            return None
        named = self.params_named(shard, revealed, instance)
        if len(named) != 1:
            return None
        noun = self._noun(named[0], instance)
        question = ASK_FRAMES[rng.randrange(len(ASK_FRAMES))].format(noun=noun)
        return f"{ACKS[rng.randrange(len(ACKS))]} {question}".strip()

    def _noun(self, param: str, instance: Instance) -> str:
        """A parameter's description as a short noun phrase ("The departure date, as YYYY-MM-DD."
        -> "departure date"), or its name in words when the description does not give one."""
        names = {next(iter(entry)) for entry in instance.fields["reference_answer"]}
        description = next((f["parameters"]["properties"].get(param, {}).get("description", "")
                            for f in instance.fields["function"] if f["name"] in names
                            and param in f["parameters"]["properties"]), "")
        phrase = re.split(r"[.;:(]|,\s|\s-\s", str(description), maxsplit=1)[0].strip()
        noun = re.sub(r"^(?:the|a|an)\s+", "", phrase, flags=re.IGNORECASE)
        words = noun.split()
        # Only "The ..." descriptions read as a noun phrase ("How many to order" does not).
        if noun == phrase or not words or len(words) > MAX_NOUN_WORDS or not re.fullmatch(r"[\w' -]+", noun):
            return param.replace("_", " ").replace(".", " ")
        return noun[0].lower() + noun[1:] if not words[0].isupper() else noun

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        """The call made too early: parameters the user gave get their values, the others are left
        out or guessed (another enum value, another number). Never the correct call: if it would
        score, a value is changed until it does not."""
        fields = instance.fields
        revealed = set().union(*(set(self.values_in(t, instance)) for t in revealed_texts))
        schemas = {f["name"]: f for f in fields["function"]}
        calls = []
        for entry in fields["reference_answer"]:
            (name, params), = entry.items()
            properties = schemas[name]["parameters"]["properties"]
            args = {}
            for param, accepted in params.items():
                given = [v for v in accepted if v != ""]
                if not given:
                    continue
                if value_keys(given) & revealed:
                    args[param] = given[0]
                elif rng.random() < 0.5:
                    guess = _guess(properties.get(param, {}), given, rng)
                    if guess is not None:
                        args[param] = guess
            calls.append(Call(name, args))
        frame = PREMATURE_FRAMES[rng.randrange(len(PREMATURE_FRAMES))]
        for call in calls:  # every value right: the premature call must still be wrong
            if self.score(format_calls(calls), instance) < 1.0:
                break
            for param, value in list(call.args.items()):
                call.args[param] = _wrong(value)
        if self.score(format_calls(calls), instance) >= 1.0:
            calls.append(Call(calls[0].name, dict(calls[0].args)))  # one call too many is never right
        return frame.format(call=format_calls(calls))


# A call written inside a sentence that suggests or supposes it ("You could call f(x=1)",
# "I would use f(x=1)") rather than making it.
SUGGESTION = re.compile(r"\b(?:could|can|might|may|would|should|you|if|like|such as|using|use)\b", re.IGNORECASE)


def _call_start(text: str, name: str) -> int:
    """Where the last mention of `name(` starts in `text` (its `[` when it opens a call list)."""
    starts = [m.start() for m in re.finditer(rf"(?<![\w.]){re.escape(name)}\s*\(", text)]
    if not starts:
        return 0
    start = starts[-1]
    return start - 1 if start and text[start - 1] == "[" else start


def _line_before(text: str, start: int) -> str:
    """The words before `start` on its line, after the last sentence end or colon."""
    line = text[text.rfind("\n", 0, start) + 1:start]
    return re.split(r"[.!?:]", line)[-1]


def _names_itself(param: str, value: Any) -> bool:
    """`city=city`: a bare name equal to the parameter's name, a slot rather than a value."""
    return isinstance(value, str) and value.strip().lower() == param.lower()


def _guess(prop: dict, given: list, rng: random.Random) -> Any:
    """A plausible wrong value a model might guess, or None (leave the parameter out)."""
    others = [v for v in prop.get("enum") or () if v not in given]
    if others:
        return others[rng.randrange(len(others))]
    kind = prop.get("type")
    if kind == "integer":
        return next(v for v in (rng.randint(1, 100) for _ in range(100)) if v not in given)
    if kind in ("float", "number"):
        return next(v for v in (round(rng.uniform(1, 100), 2) for _ in range(100)) if v not in given)
    return None


def _wrong(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + " (to be confirmed)"
    return []
