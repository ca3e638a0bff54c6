"""Reading numbers and JSON out of free text (model replies, shards, user turns).

One home for the parsers every stage shares:

- `NUMBER` and `clean_number`: numbers as people write them (`-3`, `$1,200.50`, `3/4`, `.5`),
  cleaned the way Lost in Conversation cleans them (commas, `$`, spaces and a trailing `.`
  removed);
- `number_values(text)`: every number a text mentions as an exact value (`Fraction`), digits,
  fractions and number words alike ("four" == 4), sign ignored: what leak checks and
  "does this rephrasing keep every number" checks compare;
- `find_json(text)`: the first JSON object (or list) in a model's reply, whatever chatter or
  code fences surround it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from fractions import Fraction
from typing import Any

# A number as people write it: sign, thousands separators, decimals, an optional fraction.
# A hyphen right after a word, digit or bracket joins ("10-12 pages", "x-3"): it is no minus sign.
NUMBER = re.compile(r"(?:(?<![\w)\]])-)?\$?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
                    r"|(?:(?<![\w)\]])-)?\$?\.\d+")

_UNITS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
          "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
         "eighty": 80, "ninety": 90}
_OTHER = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "dozen": 12,
          "half": Fraction(1, 2), "twice": 2, "double": 2, "triple": 3, "thrice": 3}
_WORD = "|".join(sorted([*_UNITS, *_TENS, *_OTHER], key=len, reverse=True))
NUMBER_WORD = re.compile(rf"\b(?:(?:{'|'.join(_TENS)})-(?:{'|'.join(k for k in _UNITS if k != 'zero')})|{_WORD})\b",
                         re.IGNORECASE)


def clean_number(text: str) -> str:
    """Strip what LiC strips: commas, dollar signs, spaces and a trailing period."""
    return text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")


def last_number(text: str) -> str | None:
    """The last number of `text`, cleaned (LiC's rule for reading a math answer)."""
    matches = NUMBER.findall(text)
    return clean_number(matches[-1]) if matches else None


def as_fraction(text: str) -> Fraction | None:
    """The exact value of a cleaned number such as "3360", "-2.5" or "3/4"; None if it is none."""
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return Fraction(num) / Fraction(den)
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def word_value(word: str) -> Fraction:
    """The value of a number word matched by `NUMBER_WORD` ("forty-two" -> 42, "half" -> 1/2)."""
    word = word.lower()
    if "-" in word:
        tens, unit = word.split("-", 1)
        return Fraction(_TENS[tens] + _UNITS[unit])
    return Fraction(_UNITS.get(word, _TENS.get(word, _OTHER.get(word, 0))))


def number_values(text: str, *, words: bool = True) -> Counter:
    """Every number `text` mentions, by absolute value: digits, fractions and (if `words`) number
    words. Deliberately broad: "two hundred" reads as {2, 100}, so a check that a text holds no
    number it should not errs on the side of refusing."""
    values: Counter = Counter()
    for match in NUMBER.findall(text):
        value = as_fraction(clean_number(match).lstrip("-"))
        if value is not None:
            values[abs(value)] += 1
    for match in NUMBER_WORD.findall(text) if words else ():
        values[word_value(match)] += 1
    return values


def find_json(text: str, *, lists: bool = False) -> Any:
    """The first JSON object in `text` (or list, with `lists`), or None; code fences and chatter
    around it are ignored."""
    decoder = json.JSONDecoder()
    kinds = (dict, list) if lists else (dict,)
    if len(text or "") > MAX_JSON_TEXT_CHARS:
        return None
    for tried, match in enumerate(re.finditer(r"[\[{]" if lists else r"\{", text or "")):
        if tried == MAX_JSON_STARTS:  # each try reads to the end: bounded work on any text
            return None
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except (ValueError, RecursionError, MemoryError):  # bad JSON, nested too deep, a 5,000-digit number
            continue
        if isinstance(value, kinds):
            return value
    return None


MAX_JSON_TEXT_CHARS = 200_000  # a model's reply longer than this is not searched for JSON
MAX_JSON_STARTS = 64           # `{` (or `[`) positions tried per text
