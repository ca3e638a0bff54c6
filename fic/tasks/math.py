"""Math word problems (GSM8K style): answers are numbers, references end with `#### <number>`.

Reading a reply's answer, as a careful grader would:

- after a final-answer marker (`####`, `\\boxed{...}`, "final answer"; the last one in the
  reply that is followed by an answer), the answer is read there: the first line after
  `####` or "final answer" up to the end of its sentence, or the box's content. In that span
  the number after the last `=` (else the first number) is the answer, so
  "#### 18\n\nNote: apples cost $2 each" answers 18. A span that is LaTeX rather than a plain
  number (`\\frac{1}{2}`) goes to `math-verify` as a whole.
- a reply without a marker is read by Lost in Conversation's rule, its last number, unless
  its last line ends in LaTeX (`= \\frac{6720}{2}`), which math-verify reads as a whole.

A number is equal to the reference when its text (`,` `$` and a trailing `.` removed) equals
the number after `####` (LiC's exact match) or when both are the same exact value (`3360.0`,
`6720/2`). The README lists where this is more lenient than LiC and why.
"""

from __future__ import annotations

import random
import re
from typing import Any

from fic.core.instance import Instance
from fic.core.optional import need
from fic.core.parsing import NUMBER, as_fraction, clean_number, last_number, number_values
from fic.tasks import lic_prompts
from fic.tasks.base import ErrorFactory, Task
from fic.tasks.deferrals import (
    GENERIC_ASKS,
    MENTION,  # also blanks number words ("four"), not only digits
    as_value,
    ask_for,
    premature_answer,
)
from fic.tasks.sharding import shard_math  # the question sentence first, then one fact per shard

CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, e.g. <<40*4=160>>
BOXED = "\\boxed{"
# Where a reply says "this is my answer". "final answer" needs a number after it in the same
# sentence ("Before I give the final answer, could you tell me ...?" is no answer).
MARKER = re.compile(r"####|\\boxed\{|\bfinal answer\b(?:\s*(?:is|was|would be|will be)\b)?", re.IGNORECASE)
SENTENCE_END = re.compile(r"[.!?;](?=\s|$)")
LATEX_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}")


def boxed_content(text: str, start: int) -> str | None:
    """The balanced content of the `\\boxed{` that starts at `start`, or None if it never closes."""
    depth, i = 1, start + len(BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def _span_after(text: str) -> str | None:
    """The first non-empty line of `text`, up to the end of its first sentence; None when that
    sentence is a question ("... the final answer, could you tell me how many?")."""
    line = next((ln for ln in text.splitlines() if ln.strip(" *:=\t")), "")
    line = line.strip().lstrip("*:= \t").strip()
    end = SENTENCE_END.search(line)
    if end is None:
        return line
    return None if end.group(0) == "?" else line[:end.start()]


def answer_span(text: str) -> str | None:
    """What the reply gives as its answer after its last usable final-answer marker, or None
    when no marker is followed by a number or LaTeX."""
    for match in reversed(list(MARKER.finditer(text))):
        if match.group(0) == BOXED:
            span = boxed_content(text, match.start())
        else:
            span = _span_after(text[match.end():])
        if span and (NUMBER.search(span) or "\\" in span):
            return span.strip()
    return None


def read_span(span: str) -> tuple[str, str] | None:
    """("number", cleaned number) for a plain span, ("latex", span) for one math-verify must
    read, None for a span without an answer."""
    plain = LATEX_TEXT.sub(r" \1", span).replace("\\$", "$").replace("\\,", "").replace("\\!", "")
    plain = plain.replace("\\%", "%")
    if "\\" in plain or "{" in plain or "^" in plain:
        return "latex", span
    found = NUMBER.search(plain.rsplit("=", 1)[-1]) or NUMBER.search(plain)
    return ("number", clean_number(found.group(0))) if found else None


def reference_number(answer: str) -> str | None:
    """The number after the last `####` of a GSM8K-style solution."""
    if "####" not in answer:
        return None
    return last_number(answer.rsplit("####", 1)[1])


class MathTask(Task):
    name = "math"
    scoring_needs = ("math_verify",)  # a reply may give its answer in LaTeX, whatever the reference's form
    system_prompt = (
        "You are a helpful assistant. When you solve a math problem, reason step by step and "
        "end your reply with the final answer on its own line in the form \"#### <number>\"."
    )
    required_fields = ("question", "answer")

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        super().validate_fields(fields, error)
        if reference_number(fields["answer"]) is None:
            raise error("expected a solution ending in '#### <number>', found no number after '####'",
                        "answer")

    def system_prompt_for(self, instance: Instance, prompts: str = "fic") -> str:
        return lic_prompts.MATH_SYSTEM if prompts == "lic" else self.system_prompt

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        question = instance.fields["question"]
        return lic_prompts.fill(lic_prompts.MATH_FULL, QUESTION=question) if prompts == "lic" else question

    def concat_turn(self, instance: Instance, contents: list[str], prompts: str = "fic") -> str:
        """The bullet list; under LiC's prompts inside its `Q: ... A:` frame, as LiC's concat view."""
        bullets = super().concat_turn(instance, contents, prompts)
        return lic_prompts.fill(lic_prompts.MATH_FULL, QUESTION=bullets) if prompts == "lic" else bullets

    def extract_answer(self, text: str) -> str | None:
        """The answer span after the last final-answer marker (see the module docstring), else
        the last number of the reply (LiC)."""
        return answer_span(text or "") or last_number(text or "")

    def score(self, text: str, instance: Instance) -> float:
        gold = reference_number(instance.fields["answer"])
        text = text or ""
        if gold is None:
            return 0.0
        span = answer_span(text)
        if span is not None:
            read = read_span(span)
            if read is None:
                return 0.0
            kind, answer = read
            return float(_latex_equal(answer, gold) if kind == "latex" else _numbers_equal(answer, gold))
        # No marker: a closing line in LaTeX is read as a whole; else LiC's rule, the last number.
        last_line = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
        read = read_span(last_line.rsplit("=", 1)[-1])
        if read is not None and read[0] == "latex":
            return float(_latex_equal(read[1].strip().strip("$").strip(), gold))
        return float(_numbers_equal(last_number(text), gold))

    def reference_answer(self, instance: Instance) -> str:
        return reference_number(instance.fields["answer"]) or ""

    def gold_reply(self, instance: Instance) -> str:
        """GSM8K's worked solution without calculator annotations, ending in `#### <number>`."""
        answer = instance.fields["answer"]
        steps, _, final = answer.rpartition("####")
        steps = CALCULATOR.sub("", steps).strip()
        number = last_number(final) or final.strip()
        return f"{steps}\n#### {number}" if steps else f"#### {number}"


    # ------------------------------------------------------------------ SFT-corpus replies
    # The question maker and the premature answers live in fic.tasks.deferrals, written for numbers.

    @property
    def generic_asks(self) -> tuple[str, ...]:  # type: ignore[override]

        return GENERIC_ASKS

    def mask_values(self, text: str, revealed: set, instance: Instance | None = None) -> str:

        return MENTION.sub(lambda m: m.group(0) if set(self.values_in(m.group(0))) <= revealed else "___", text)

    def ask_for(self, shard: str, revealed: set, rng: random.Random,
                instance: Instance | None = None) -> str | None:

        return ask_for(shard, revealed, rng)

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:

        in_order = [value for text in revealed_texts for value in number_values(text, words=False)]
        return premature_answer(in_order, as_value(self.reference_answer(instance)), rng)

    rule_sharder = True

    def rule_shard(self, instance: Instance, seed: int = 0) -> Instance:

        return shard_math(instance, seed=seed)


def _numbers_equal(predicted: str | None, gold: str) -> bool:
    """LiC's exact match of the cleaned text, or the same exact value ("3360.0", "6720/2")."""
    if predicted is None:
        return False
    if predicted == gold:
        return True
    value = as_fraction(predicted)
    return value is not None and value == as_fraction(gold)


MAX_LATEX_CHARS = 400   # a LaTeX answer longer than this is not read (an answer is a number or a short formula)
MAX_LATEX_DEPTH = 12    # nor one whose braces nest deeper
LATEX_SECONDS = 2       # math-verify's own limits on parsing and comparing (a power tower can take minutes)


def _brace_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        deepest = max(deepest, depth)
    return deepest


def _latex_equal(answer: str, gold: str) -> bool:
    """A LaTeX answer (`\\frac{1}{2}`), read as a whole by math-verify, bounded in size, depth and time."""
    if len(answer) > MAX_LATEX_CHARS or _brace_depth(answer) > MAX_LATEX_DEPTH:
        return False
    math_verify = need("math_verify", "scoring a LaTeX math answer")  # imported lazily: it loads sympy

    try:
        return bool(math_verify.verify(math_verify.parse(gold, parsing_timeout=LATEX_SECONDS),
                                       math_verify.parse(f"\\boxed{{{answer}}}", parsing_timeout=LATEX_SECONDS),
                                       timeout_seconds=LATEX_SECONDS))
    except Exception:  # math-verify raises on unparsable input (and off the main thread); unparsable means wrong
        return False
