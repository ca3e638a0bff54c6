"""Math word problems (GSM8K style): answers are numbers, references end with `#### <number>`.

Scoring agrees with Lost in Conversation (the last number of the answer, with `,`, `$` and
a trailing `.` removed, equal to the text after `####`) and also accepts numerically equal
forms such as `3360.0`, `3,360`, `\\boxed{3360}`, `$3,360.00` or `6720/2`, checked with
exact fractions and, for LaTeX, with `math-verify`.
"""

from __future__ import annotations

import random
import re
from typing import Any

from fic.instance import Instance
from fic.parsing import as_fraction, last_number, number_values
from fic.tasks.base import ErrorFactory, Task

CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, e.g. <<40*4=160>>
BOXED = "\\boxed{"


def _last_boxed(text: str) -> str | None:
    start = text.rfind(BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def reference_number(answer: str) -> str | None:
    """The number after the last `####` of a GSM8K-style solution."""
    if "####" not in answer:
        return None
    return last_number(answer.rsplit("####", 1)[1])


class MathTask(Task):
    name = "math"
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

    def full_prompt(self, instance: Instance | dict) -> str:
        return self._instance(instance).fields["question"]

    def extract_answer(self, text: str) -> str | None:
        """The text after the last `####`, else the last `\\boxed{}`, else the last number."""
        if "####" in text:
            tail = text.rsplit("####", 1)[1].strip()
            return tail or None
        boxed = _last_boxed(text)
        if boxed is not None:
            return boxed.strip() or None
        return last_number(text)

    def score(self, text: str, instance: Instance | dict) -> float:
        gold = reference_number(self._instance(instance).fields["answer"])
        answer = self.extract_answer(text)
        if answer is None or gold is None:
            return 0.0
        predicted = last_number(answer)
        if predicted == gold:  # the LiC rule
            return 1.0
        if predicted is not None:
            value, reference = as_fraction(predicted), as_fraction(gold)
            if value is not None and value == reference:
                return 1.0
        # Only LaTeX goes to math-verify: on plain text it would pick a number other than the
        # last one and disagree with the LiC rule.
        latex = answer if ("####" in text or BOXED in text) else text.strip()
        return float("\\" in latex and _latex_equal(latex, gold))

    def reference_answer(self, instance: Instance | dict) -> str:
        return reference_number(self._instance(instance).fields["answer"]) or ""

    def gold_reply(self, instance: Instance | dict) -> str:
        """GSM8K's worked solution without calculator annotations, ending in `#### <number>`."""
        answer = self._instance(instance).fields["answer"]
        steps, _, final = answer.rpartition("####")
        steps = CALCULATOR.sub("", steps).strip()
        number = last_number(final) or final.strip()
        return f"{steps}\n#### {number}" if steps else f"#### {number}"


    # ------------------------------------------------------------------ SFT-corpus replies
    # The question maker and the premature answers live in fic.deferrals, written for numbers.

    @property
    def generic_asks(self) -> tuple[str, ...]:  # type: ignore[override]
        from fic.deferrals import GENERIC_ASKS

        return GENERIC_ASKS

    def mask_values(self, text: str, revealed: set, instance: Instance | None = None) -> str:
        from fic.deferrals import (
            MENTION,  # also blanks number words ("four"), not only digits
        )

        return MENTION.sub(lambda m: m.group(0) if set(self.values_in(m.group(0))) <= revealed else "___", text)

    def ask_for(self, shard: str, revealed: set, rng: random.Random) -> str | None:
        from fic.deferrals import ask_for

        return ask_for(shard, revealed, rng)

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        from fic.deferrals import as_value, premature_answer

        in_order = [value for text in revealed_texts for value in number_values(text, words=False)]
        return premature_answer(in_order, as_value(self.reference_answer(instance)), rng)


def _latex_equal(answer: str, gold: str) -> bool:
    """Fallback for answers like `\\frac{1}{2}` that are not plain numbers."""
    from math_verify import parse, verify  # imported lazily: it loads sympy

    try:
        return bool(verify(parse(gold), parse(answer)))
    except Exception:  # math-verify raises on unparsable input; unparsable means wrong
        return False
