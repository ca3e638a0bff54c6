"""Reply classifiers: what kind of move each assistant reply makes.

Labels (Lost in Conversation's seven, definitions in our own words):

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

Two classifiers:

- `rule` (offline, fast, deterministic): tuned for math-style answers. In order: empty ->
  missing; a refusal phrase near the start -> refuse; `####` or `\\boxed{}`, or "final
  answer" / "the answer is" in a sentence that states a value and is not a question ->
  answer_attempt ("Before I give the final answer, could you tell me ...?" is not one);
  wording that branches over readings ("it depends", "depending on", "if you mean") with
  numbers -> hedge; a reply ending in a question -> answer_attempt when a numeric conclusion
  comes before a short courtesy question, interrogation (several questions), clarification
  (one specific question in under 100 words), else discussion (a vague question, or a long
  reply); a closing sentence that states a number -> answer_attempt, unless that sentence
  mostly repeats one of the user's messages (a parroted shard is not an answer); otherwise
  discussion.
- `llm`: a model reads the full task specification, the conversation and the reply (as
  LiC's classifier does) and answers with a JSON object `{"label": ...}`. When its output
  has no usable label, the rule label is used and the turn's `label_note` says so; a label
  named in plain text (no JSON) is accepted too.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from fic.core.generation import Backend, SamplingParams
from fic.core.parsing import NUMBER, find_json, number_values

LABELS = ("answer_attempt", "clarification", "interrogation", "discussion", "hedge", "refuse", "missing")
CLASSIFIER_KINDS = ("rule", "llm")

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


def _sentences(text: str) -> list[str]:
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
    sentences = _sentences(text)
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


class RuleClassifier:
    name = "rule"

    def classify(self, conversations: Sequence[Any]) -> list[tuple[str, str | None]]:
        return [(conv.task.rule_label(conv.messages[-1]["content"], _user_texts(conv)), None) for conv in conversations]


def _user_texts(conv: Any) -> list[str]:
    return [m["content"] or "" for m in conv.messages if m["role"] == "user"]


CLASSIFIER_RULES = """\
You label one reply of an AI assistant in a conversation where a user describes a task, \
possibly over several messages. You are shown the complete task, as the user would state it in \
full; the assistant has only seen what the user said so far. Choose exactly one label:
- answer_attempt: the reply gives a complete final answer to the task (for math: a final number), \
so that the conversation could end here. A reply that only promises an answer, or asks something \
before answering, is not one.
- clarification: a short reply (under 100 words) whose main point is a single question asking the \
user for one specific missing detail.
- interrogation: the reply asks the user several questions.
- discussion: the reply talks about the task (restates it, explains, plans) without a final \
answer; a vague question ("anything else?") or a long reply that ends in a question is discussion.
- hedge: the reply gives several candidate answers for different interpretations.
- refuse: the reply declines to help.
- missing: the reply is empty or has no content.
Reply with only a JSON object: {"label": "<one of the labels>"}"""

MAX_CHARS = 3000


def classifier_prompt(conv: Any) -> list[dict]:
    """Chat messages asking the classifier model to label the last reply of `conv`: the full
    task specification (as LiC's classifier gets it), what the user said, and the reply."""
    users = [m["content"] for m in conv.messages if m["role"] == "user"]
    reply = conv.messages[-1]["content"] or ""
    if len(reply) > MAX_CHARS:
        reply = reply[:MAX_CHARS // 2] + "\n[...]\n" + reply[-MAX_CHARS // 2:]
    task = conv.task.full_prompt(conv.instance)
    if len(task) > MAX_CHARS:
        task = task[:MAX_CHARS] + " [...]"
    body = (f"The complete task:\n<<<\n{task}\n>>>\n\nWhat the user said so far:\n"
            + "\n".join(f"- {u}" for u in users)
            + f"\n\nThe assistant's reply to label:\n<<<\n{reply}\n>>>\n\nAnswer with the JSON object only.")
    return [{"role": "system", "content": CLASSIFIER_RULES}, {"role": "user", "content": body}]


def parse_label(text: str) -> str:
    """The label in a classifier model's reply; ValueError when there is none."""
    obj = find_json(text or "")
    if obj is not None:
        label = obj.get("label", obj.get("classification"))
        if isinstance(label, str) and label.strip().lower() in LABELS:
            return label.strip().lower()
        raise ValueError(f"JSON without a known label: {str(label)!r:.40}")
    # No JSON: accept a reply that names exactly one label (small models often answer plainly).
    named = {label for label in LABELS if re.search(rf"\b{label}\b", (text or "").lower())}
    if len(named) == 1:
        return named.pop()
    raise ValueError("no JSON object and no single label named in the classifier's reply")


class LLMClassifier:
    name = "llm"

    def __init__(self, backend: Backend, *, max_new_tokens: int = 64, seed: int = 0):
        self.backend, self.max_new_tokens, self.seed = backend, max_new_tokens, seed

    def classify(self, conversations: Sequence[Any]) -> list[tuple[str, str | None]]:
        # Tasks whose every reply is an answer attempt (LiC: translation, summary, data2text) need
        # no model.
        labels: dict[int, tuple[str, str | None]] = {
            id(conv): (conv.task.rule_label(conv.messages[-1]["content"] or "", _user_texts(conv)), None)
            for conv in conversations if conv.task.replies_are_answers}
        asking = [conv for conv in conversations if id(conv) not in labels]
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0, seed=self.seed)
        outputs = self.backend.chat([classifier_prompt(conv) for conv in asking], params) if asking else []
        for conv, out in zip(asking, outputs):
            reply = conv.messages[-1]["content"] or ""
            if not reply.strip():  # no model needed to see an empty reply
                labels[id(conv)] = ("missing", None)
                continue
            try:
                labels[id(conv)] = (parse_label(out.text), None)
            except ValueError as err:
                labels[id(conv)] = (conv.task.rule_label(reply, _user_texts(conv)), f"rule label used: {err}")
        return [labels[id(conv)] for conv in conversations]


def make_classifier(kind: str, backend: Backend | None = None, **kwargs: Any):
    if kind == "rule":
        return RuleClassifier()
    if kind == "llm":
        if backend is None:
            raise ValueError("the llm classifier needs a backend")
        return LLMClassifier(backend, **kwargs)
    raise ValueError(f"unknown classifier {kind!r}")
