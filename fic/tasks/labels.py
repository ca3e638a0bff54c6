"""The rule labels of assistant replies: Lost in Conversation's seven labels and the offline
heuristics that assign them (`rule_label`, generic; `label_reply`, for tasks whose answer is
structured). The tasks refine them (`Task.rule_label`); the classifiers of
`fic.conversation.classify` call the tasks.

Labels (definitions in our own words):

- `answer_attempt`: the reply commits to a complete answer to the task (a final number, a
  query, code ...). Only these are extracted and scored.
- `clarification`: a short reply (under 100 words, as in LiC) whose point is one question
  asking the user for a specific missing detail.
- `interrogation`: a reply that asks the user several questions.
- `discussion`: talks about the problem (restates it, plans, explains) without answering;
  a vague question ("What else should I know?") or a long reply ending in a question is
  discussion too.
- `hedge`: offers several candidate answers for different readings of the task.
- `refuse`: declines to help.
- `missing`: empty reply.

`rule_label` (math-style answers), in order: empty -> missing; a refusal phrase near the
start -> refuse; `####` or `\\boxed{}`, or "final answer" / "the answer is" in a sentence that
states a value and is not a question -> answer_attempt ("Before I give the final answer, could
you tell me ...?" is not one); wording that branches over readings ("it depends", "depending
on", "if you mean") with numbers -> hedge; a reply ending in a question -> answer_attempt when
a numeric conclusion comes before a short courtesy question, interrogation (several
questions), clarification (one specific question in under 100 words), else discussion (a vague
question, or a long reply); a closing sentence that states a number -> answer_attempt, unless
that sentence mostly repeats one of the user's messages (a parroted shard is not an answer);
otherwise discussion.
"""

from __future__ import annotations

import re
from typing import Sequence

from fic.core.parsing import NUMBER, number_values

LABELS = ("answer_attempt", "clarification", "interrogation", "discussion", "hedge", "refuse", "missing")

STRONG_MARKER = re.compile(r"####|\\boxed\{")
# Words that only mark a sentence as an answer when it states a value and asks nothing.
SOFT_MARKER = re.compile(r"\bfinal answer\b|\bthe answer is\b|\banswer:\s*\S", re.IGNORECASE)
CLARIFICATION_WORDS = 100  # LiC: a clarification is under 100 words
# Words that do not make a question specific: "What else do I need to know?" asks for nothing
# in particular ("How many games did she play?" does).
VAGUE = set("""what else how who which when where why is are was were do does did i you me my your we us
the a an to of for in on at about any anything something more other others rest remaining missing further
additional extra detail details info information context know need needs tell share provide give clarify
explain elaborate specify mention add go continue let please could would can should will shall may might
like want there that this these those it its problem task question questions help sure need calculate
compute solve find figure work out answer proceed else so and or but if then have has had be been
requirements specifics particulars""".split())
REFUSAL = re.compile(r"\b(?:I can(?:no|')t (?:help|assist|answer|do that|provide)|I(?: am|'m) (?:sorry, but I|"
                     r"unable to|not able to)|I won't be able|I will not)\b", re.IGNORECASE)
HEDGE = re.compile(r"\b(?:it depends|depending on|if you mean|if you meant|could be either|"
                   r"there are (?:two|several|multiple) (?:possible|ways to read|interpretations))\b", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
ECHO_SHARE = 0.7  # share of a sentence's words found in one user message that makes it an echo


def reply_sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(text) if s.strip()]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:\.[0-9]+)?", text.lower())


def _echoes(sentence: str, user_texts: Sequence[str]) -> bool:
    """Whether a sentence mostly repeats something the user said (small models often parrot
    each shard back: "Ara plays 40 games per year."). Such a sentence is not an answer."""
    words = _words(sentence)
    numbers = set(number_values(sentence, words=False))
    for text in user_texts:
        said = set(_words(text))
        said_numbers = set(number_values(text, words=False))
        # A sentence that brings a number of its own is a claim, however many words it shares.
        if words and numbers <= said_numbers and sum(w in said for w in words) >= ECHO_SHARE * len(words):
            return True
    return False


def rule_label(reply: str, user_texts: Sequence[str] = ()) -> str:
    """The rule classifier's label for one reply (see the module docstring for the order).

    `user_texts` (what the user said so far) lets a closing sentence that only repeats the
    user's own words count as discussion rather than as an answer.
    """
    text = (reply or "").strip()
    if not text:
        return "missing"
    sentences = reply_sentences(text)
    marked = STRONG_MARKER.search(text) is not None or any(
        SOFT_MARKER.search(s) and _states_number(s) for s in sentences)
    if REFUSAL.search(text[:300]) and not marked:
        return "refuse"
    if marked:
        return "answer_attempt"
    has_number = NUMBER.search(text) is not None
    if HEDGE.search(text) and has_number:
        return "hedge"
    questions = [s for s in sentences if s.endswith("?")]
    if sentences[-1].endswith("?"):
        # "... the total is 42. Anything else?" still commits to 42: a closing courtesy
        # question after a numeric conclusion is not a clarification.
        statements = [s for s in sentences if not s.endswith("?")]
        if statements and _states_number(statements[-1]) and len(questions) == 1 \
                and len(sentences[-1].split()) <= 8 and not _echoes(statements[-1], user_texts):
            return "answer_attempt"
        if len(questions) >= 2:
            return "interrogation"
        if len(text.split()) >= CLARIFICATION_WORDS or not _is_specific(questions[0]):
            return "discussion"
        return "clarification"
    conclusion = sentences[-1] if _states_number(sentences[-1]) else (
        sentences[-2] if len(sentences) > 1 and _states_number(sentences[-2])
        and NUMBER.search(sentences[-1]) is None and len(sentences[-1].split()) <= 12 else None)
    if conclusion is not None and not _echoes(conclusion, user_texts):
        return "answer_attempt"
    return "interrogation" if len(questions) >= 2 else "discussion"


def _is_specific(question: str) -> bool:
    """Whether a question names what it asks about (a word beyond the generic ones)."""
    return any(w not in VAGUE for w in re.findall(r"[a-z]{3,}", question.lower().replace("'", " ")))


def _states_number(sentence: str) -> bool:
    """A sentence that concludes with a value: it has a number and is not a question."""
    return not sentence.endswith("?") and NUMBER.search(sentence) is not None


def label_reply(reply: str, has_answer: bool) -> str:
    """The rule label for tasks whose answer is structured (a query, code, a call): an answer
    attempt when `has_answer` (the task found its answer in the reply), else what the reply
    does instead: nothing, a refusal, one question, several, or talk."""
    text = (reply or "").strip()
    if not text:
        return "missing"
    if has_answer:
        return "answer_attempt"
    if REFUSAL.search(text[:300]):
        return "refuse"
    questions = [s for s in reply_sentences(text) if s.endswith("?")]
    if len(questions) >= 2:
        return "interrogation"
    return "clarification" if questions else "discussion"
