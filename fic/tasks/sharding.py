"""Rule-based sharding of math word problems into Lost-in-Conversation shards.

Shard 1 states the goal: the question sentence (the last one ending in "?"; without one,
the last sentence that asks in other words, "Calculate ..."), framed as an intent, with the
number-free instructions of the problem ("Give the result as your final answer."). Each
later shard carries one fact, in the original order: every other sentence that holds a
number (also one after the question), conditions peeled off the question sentence ("If he
earns $5 a day, how ...") and, one fact per shard, the clauses of a sentence that lists
several ("An uncle eats 6 hamburgers per day, his wife eats 3 hamburgers per day, and their
son eats 7 hamburgers per day."), split only where every piece is a clause of its own
(it names its subject or its verb, and does not start with a number).

Text is moved, never rewritten, so every number of the question lands in exactly the shard
it belongs to: `shard_math` checks this and refuses (`ShardingError`) when it would not
hold, or when fewer than two fact shards come out (nothing worth revealing over several
turns). The seed only picks the intent wording.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from fic.core.errors import FicError
from fic.core.instance import Instance, Shard
from fic.core.parsing import NUMBER, number_values
from fic.core.seeding import pick

INTENT_FRAMES = (
    "I need help with a math problem. {goal}",
    "Can you help me work something out? {goal}",
    "Here's what I want to figure out. {goal}",
    "Quick question. {goal}",
    "I'm trying to solve a word problem. {goal}",
)
ABBREVIATIONS = ("Mr.", "Mrs.", "Ms.", "Dr.", "St.", "Jr.", "Sr.", "vs.", "e.g.", "i.e.", "etc.", "a.m.",
                 "p.m.")
QUESTION_WORDS = r"(?:how|what|which|who|when|where|calculate|find|determine|compute|work out)"
# "If he gets paid $5 a day, how much ..." -> a fact and a goal.
LEADING_CONDITION = re.compile(
    rf"^(?:if|given that|given|assuming that|assuming|suppose that|suppose)\s+(?P<fact>.+?),\s*"
    rf"(?P<goal>{QUESTION_WORDS}\b.*)$", re.IGNORECASE | re.DOTALL)
# "After accounting for 500 seats for graduates, how many ..." -> a fact (it has a number) and a goal.
LEADING_CLAUSE = re.compile(r"^(?P<fact>[^?]*?\d[^?]*?),\s*(?P<goal>(?:how|what|which|who)\b.*)$",
                            re.IGNORECASE | re.DOTALL)
# "... how many can you eat if your target is 1800 calories?" -> the goal and a fact.
TRAILING_CONDITION = re.compile(r"^(?P<goal>.+?)\s+(?:if|given that)\s+(?P<fact>.+?)(?P<end>[?.!]?)$",
                                re.IGNORECASE | re.DOTALL)


class ShardingError(FicError):
    """This instance cannot be sharded by the rules; the caller drops it with the reason."""


# Where a sentence listing several facts may be cut: ", ", ", and ", "; ", or " and " before a
# pronoun ("... 3 apples and his brother eats 4").
CLAUSE_BREAK = re.compile(r",\s+(?:and\s+|but\s+|while\s+)?|;\s+(?:and\s+)?|"
                          r"\s+and\s+(?=(?:he|she|they|it|we|his|her|their|its)\b)", re.IGNORECASE)
SUBJECTS = {"he", "she", "they", "it", "we", "i", "you", "his", "her", "their", "its", "our", "my", "your", "there"}
# Verbs word problems state facts with: a piece holding one of them is a clause of its own.
VERBS = set("""is are was were has have had can could will would does did do gets got buys bought sells sold
costs cost eats ate makes made takes took uses used needs needed earns earned pays paid spends spent produces
produced reads read runs ran walks walked drives drove weighs weighed holds held contains contained gives gave
receives received plays played scores scored saves saved owns owned grows grew collects collected works worked
charges charged drinks drank bakes baked sleeps slept travels traveled travelled swims swam writes wrote
sends sent finds found keeps kept loses lost wins won adds added picks picked jumps jumped rides rode flies
flew plants planted washes washed cooks cooked fills filled lays laid catches caught weigh contain hold need
cover covers covered measure measures measured""".split())
NUMBER_START = re.compile(r"^[-$£€]?\d")


def split_sentences(text: str, *, lowercase_starts: bool = False) -> list[str]:
    """Split prose into sentences without breaking decimals (0.5), money ($3.50) or titles (Ms.).
    `lowercase_starts` also cuts before a lowercase word ("costs £6. muffins cost £3 each.")."""
    starts = "A-Za-z" if lowercase_starts else "A-Z"
    pieces = re.split(rf"(?<=[.!?])\s+(?=[\"'{starts}0-9£$€])|\n\s*\n", text.strip())
    sentences: list[str] = []
    for piece in pieces:
        piece = piece.strip()
        if not piece:
            continue
        if sentences and sentences[-1].endswith(ABBREVIATIONS):
            sentences[-1] = f"{sentences[-1]} {piece}"
        else:
            sentences.append(piece)
    return sentences


def _goal_index(sentences: list[str]) -> int | None:
    """The question sentence: the last one ending in "?", else the last that asks in other words."""
    asked = [i for i, s in enumerate(sentences) if s.rstrip().endswith("?")]
    if asked:
        return asked[-1]
    return max((i for i, s in enumerate(sentences) if LEADING_CONDITION.match(s)
                or re.match(rf"^(?:now,\s*)?{QUESTION_WORDS}\b(?!\s+necessary)", s, re.IGNORECASE)), default=None)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _is_clause(piece: str) -> bool:
    """Whether a piece cut from a sentence still says something on its own: it does not start
    with a number ("2 notebooks which cost $4 each" lost its "he bought"), and it starts with
    its subject or holds a verb."""
    if NUMBER_START.match(piece):
        return False
    words = _words(piece)  # a piece that starts with its verb ("writes 3 of it") lost its subject
    return len(words) >= 2 and words[0] not in VERBS and (words[0] in SUBJECTS or any(w in VERBS for w in words))


def split_clauses(sentence: str) -> list[str]:
    """One fact per piece: a sentence listing several facts, cut at clause boundaries where
    every piece is a clause with a number of its own; else the sentence whole."""
    pieces, start = [], 0
    for match in CLAUSE_BREAK.finditer(sentence):
        pieces.append([sentence[start:match.start()], sentence[match.start():match.end()]])
        start = match.end()
    pieces.append([sentence[start:], ""])
    merged: list[list[str]] = []
    for text, separator in pieces:  # a piece without a number belongs to the next one
        if merged and not NUMBER.search(merged[-1][0]):
            merged[-1] = [merged[-1][0] + merged[-1][1] + text, separator]
        else:
            merged.append([text, separator])
    if len(merged) > 1 and not NUMBER.search(merged[-1][0]):  # ... or, at the end, to the one before
        last = merged.pop()
        merged[-1] = [merged[-1][0] + merged[-1][1] + last[0], last[1]]
    clauses = [text.strip() for text, _ in merged]
    if len(clauses) < 2 or not all(_is_clause(c) for c in clauses):
        return [sentence]
    return [_sentence(c) for c in clauses]


def _sentence(text: str) -> str:
    """Capitalise a clause and end it with a period, so a moved clause reads as a sentence."""
    text = text.strip().rstrip(",;")
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?" else text + "."


def _numbers(text: str) -> Counter:
    return number_values(text, words=False)


def _split_goal(goal: str) -> tuple[str, list[str]]:
    """Peel conditions that carry numbers off the goal sentence; they are facts, not the goal."""
    facts: list[str] = []
    leading = LEADING_CONDITION.match(goal) or LEADING_CLAUSE.match(goal)
    if leading:
        facts.append(_sentence(leading["fact"]))
        goal = leading["goal"].strip()
    trailing = TRAILING_CONDITION.match(goal)
    if trailing and NUMBER.search(trailing["fact"]):
        facts.append(_sentence(trailing["fact"]))
        goal = trailing["goal"].rstrip(",") + (trailing["end"] or "?")
    return goal, facts


def shard_math(instance: Instance, *, seed: int = 0) -> Instance:
    """Return a copy of `instance` with rule-based shards; raise ShardingError if it cannot be split."""
    question = instance.fields["question"]
    sentences = split_sentences(question, lowercase_starts=True)
    goal_index = _goal_index(sentences)
    if goal_index is None:
        raise ShardingError("no question sentence found to state the goal", record=instance.task_id)
    goal, goal_facts = _split_goal(sentences[goal_index])
    after = sentences[goal_index + 1:]
    # After the question: facts if they hold a number, else instructions for shard 1
    # ("Give the result as your final answer.").
    instructions = [s for s in after if not _numbers(s)]
    facts = [clause for s in sentences[:goal_index] + goal_facts + [s for s in after if _numbers(s)]
             for clause in split_clauses(s)]
    if not facts:
        raise ShardingError("only one piece of information; nothing to reveal over several turns",
                            record=instance.task_id)
    if len(facts) < 2:
        raise ShardingError("only one fact besides the question, and it cannot be split into clauses; "
                            "a sharded conversation needs at least two", record=instance.task_id)
    goal = re.sub(r"^now,\s*", "", goal, flags=re.IGNORECASE)
    goal = goal[0].upper() + goal[1:]
    intent = " ".join([pick(INTENT_FRAMES, seed, instance.task_id).format(goal=goal), *instructions])
    texts = [intent, *facts]
    if _numbers(question) != sum((_numbers(t) for t in texts), Counter()):
        raise ShardingError("the numbers of the shards differ from the question's", record=instance.task_id)
    shards = [Shard(shard_id=i, shard=text) for i, text in enumerate(texts, start=1)]
    return dataclasses.replace(instance, shards=shards, fields=dict(instance.fields))
