"""Judges for `fic probe`: what kind of user turn did the model write?

The probe shows a model `[user question; assistant reply]` and lets it write the next *user*
turn. Each such turn gets one of eight labels (the label set of arXiv 2604.02315; the
definitions here are FiC's own words):

- `genuine_follow_up`: reacts to the reply as a user would: asks about a step, questions or
  corrects the result, asks to finish a cut-off answer, asks what follows from it.
- `restates_query`: repeats or paraphrases the original question (or asks it again).
- `repeats_reply`: copies or paraphrases the assistant's reply, or goes on solving the task as
  if it were the assistant (steps, a final answer).
- `meta_planning`: narration or planning instead of speech: "Let me think ...", "The user
  wants ...", "As the user, I would ask ...", reasoning blocks.
- `malformed`: empty, garbled, stuck in a loop, or chat markup / several speakers in one turn.
- `new_question`: a new question or task unrelated to the conversation (another problem, a
  different topic).
- `brief_filler`: a short acknowledgement with no content ("Thanks!", "OK, got it.").
- `other`: anything else.

Two judges:

- `rule` (offline, deterministic): word-overlap and phrase heuristics, in this order:
  malformed; meta-planning phrasing; a near copy of the question or of the reply (word-pair
  overlap), or an answer marker outside a question (the turn goes on answering); a short
  acknowledgement; a new-topic phrase ("another problem"); a phrase that reacts to the reply
  ("you forgot", "is that right"), a follow-up word ("explain", "why", "step") pointing back at
  the conversation, or a question about "that" ("how much is that per month?"), each only in a
  turn of at most 30 words; a turn built from the question's own words (asked or told again:
  restates) or from the reply's (repeats); a short question about a number (10 or more, or a
  fraction) only the reply worked out; a
  question, request or new problem unrelated to both; otherwise other. Good enough to
  separate what small models do (they mostly restate or change the subject); use the `llm`
  judge for numbers to publish.
- `llm`: a model reads the question, the reply and the turn and answers with a JSON object
  `{"label": ..., "reason": ...}`. An unusable answer (no JSON, unknown label) is sent back
  with what was wrong, up to `retries` times; after that the rule label is used and the
  record's `judge_note` says so.
"""

from __future__ import annotations

import itertools
import re
from typing import Sequence

from fic.core.generation import Backend, SamplingParams
from fic.core.parsing import find_json, number_values

LABELS = ("genuine_follow_up", "restates_query", "repeats_reply", "meta_planning", "malformed",
          "new_question", "brief_filler", "other")
JUDGE_KINDS = ("rule", "llm")

# --------------------------------------------------------------------------- the rule judge

_STOPWORDS = frozenset("""
a an the and or but if then so of to in on at by for with from as is are was were be been being it its
this that these those there here he she they them his her their we us our i me my you your it's i'm
what which who whom whose when where how why do does did done have has had can could would should will
shall may might must not no yes all any each some more most much many than too very just also only
about into over under up down out off again once same other such own one per into please
""".split())

# Chat markup or a role label on its own line: the model wrote a transcript, not a user turn.
MARKUP = re.compile(r"<\|[a-z_]+\|>|<\/?(?:s|im_start|im_end)>|^\s*(?:user|assistant|system)\s*:?\s*$",
                    re.IGNORECASE | re.MULTILINE)
SPEAKER = re.compile(r"^\s*(?:user|assistant|ai|human|bot)\s*:", re.IGNORECASE | re.MULTILINE)
META = re.compile(
    r"^\W*(?:(?:okay|ok|alright|hmm|so|well)\W+){0,3}(?:let me (?:think|see|analy[sz]e|figure|work|break|start|solve|"
    r"try)|let's (?:think|see|analy[sz]e|figure|work|break|start|solve)|i need to (?:figure|find|calculate|"
    r"determine|think|analy[sz]e|respond|write|ask|come up)|i should (?:ask|respond|write|say)|"
    r"(?:first|to start),? i (?:need|will|should)|my (?:next|follow-up) (?:message|question|turn)|"
    r"as (?:the|a) user\b|the user (?:wants|is|would|might|needs|asked|has)|<think>|thinking:|plan:|"
    r"here is (?:my|a) (?:plan|possible))", re.IGNORECASE)
ANSWER_MARKER = re.compile(r"####|\\boxed\{|\bthe (?:final )?answer is\b|\bfinal answer\b", re.IGNORECASE)
FILLER = frozenset("""
thanks thank you ok okay great got it cool nice perfect awesome sure yes yeah alright good sounds makes
sense understood i see that helps helped much so very wow a lot appreciate all right oh ah hmm wonderful
excellent fine gotcha job work cheers brilliant amazing clear now this is was the
""".split())
NEW_TOPIC = re.compile(r"\b(?:another|a new|a different|the next|one more|unrelated|switch(?:ing)? topics?|"
                       r"change (?:of )?(?:the )?subject|something else)\b(?:\W+\w+){0,2}?\W+"
                       r"(?:question|problem|puzzle|task|topic|one|thing|math)", re.IGNORECASE)
# Phrases that only make sense as a reaction to what the assistant said.
REACTS = re.compile(
    r"\b(?:mistake|wrong|incorrect|error|not right|doesn't add up|does not add up|double[- ]check|"
    r"are you sure|is that (?:right|correct)|that can't be|should(?:n't)? (?:it|that|the answer) be|"
    r"(?:didn't|did not|don't|never) finish|cut off|incomplete|unfinished|you stopped|you forgot|you missed|"
    r"you skipped|you said|you wrote|you got|you used|you multiplied|you divided|you added|you subtracted|"
    r"you assumed|you mean|your (?:answer|calculation|solution|result|math|reasoning|explanation|steps?)|"
    r"i got)\b", re.IGNORECASE)
# Follow-up words that need the turn to point back at the conversation to count.
FOLLOW_UP = re.compile(r"\b(?:explain|clarify|why|how did|how do you|how come|what about|what if|continue|"
                       r"go on|keep going|rest of|finish|step|show|break (?:it|that|this) down|where did|"
                       r"where does|mean|elaborate|more detail|walk me through)\b", re.IGNORECASE)
POINTS_BACK = re.compile(r"\b(?:that|this|it|those|these|there|above|step|answer|result|calculation|"
                         r"solution|part|number)\b", re.IGNORECASE)
# "is that", "of this": pointing at something said, not introducing something ("this question: ...").
POINTS_AT = re.compile(r"\b(?:is|was|does|did|about|of|with|from|for|on|in)\s+(?:that|this)\b"
                       r"(?!\s+(?:question|problem|puzzle|task))", re.IGNORECASE)
REQUEST = re.compile(r"^\W*(?:can|could|would|will) you\b|^\W*(?:please|tell me|write|give me|help me|"
                     r"solve|calculate|compute|find|what|how|who|when|where|which|why|is|are|do|does)\b",
                     re.IGNORECASE)
COPY_SHARE = 0.5      # share of the turn's word pairs found in the question (or reply) that makes a copy
GROUNDED_SHARE = 0.5  # share of the turn's content words from the question that makes a re-asked question
# A follow-up is a question or two; longer text that happens to say "explain" or "mistake" is
# something else (sampled small models ramble on until the token limit).
MAX_FOLLOW_UP_WORDS = 30


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+(?:'[a-z]+)?|\d+(?:\.\d+)?", text.lower())


def _content(words: Sequence[str]) -> list[str]:
    return [w for w in words if w not in _STOPWORDS]


def _pairs(words: Sequence[str]) -> set[tuple[str, str]]:
    return set(itertools.pairwise(words))


def _share(part: Sequence | set, whole: set) -> float:
    part = list(part)
    return sum(p in whole for p in part) / len(part) if part else 0.0


def _malformed(text: str, words: list[str]) -> bool:
    if not text or not re.search(r"[A-Za-z]", text):
        return True
    if MARKUP.search(text) or len(SPEAKER.findall(text)) >= 2:
        return True
    visible = [c for c in text if not c.isspace()]
    if sum(c.isalnum() for c in visible) < 0.6 * len(visible):
        return True
    # Stuck in a loop: one 4-word sequence over and over, or a long turn of very few distinct words.
    grams = list(zip(words, words[1:], words[2:], words[3:]))
    if grams and max(grams.count(g) for g in set(grams)) >= 4:
        return True
    return len(words) >= 20 and len(set(words)) < 0.3 * len(words)


def rule_judge(query: str, reply: str, turn: str) -> str:
    """The rule judge's label for a generated user `turn` after `query` and `reply` (see the
    module docstring for the order of the checks)."""
    text = (turn or "").strip()
    words = _words(text)
    if _malformed(text, words):
        return "malformed"
    if META.search(text[:300]):
        return "meta_planning"
    query_words, reply_words = _words(query), _words(reply)
    is_question = "?" in text or REQUEST.search(text) is not None
    if len(words) >= 5:
        pairs = _pairs(words)
        in_query, in_reply = _share(pairs, _pairs(query_words)), _share(pairs, _pairs(reply_words))
        if max(in_query, in_reply) >= COPY_SHARE:
            return "restates_query" if in_query >= in_reply else "repeats_reply"
    if ANSWER_MARKER.search(text) and not is_question:
        return "repeats_reply"
    if len(words) <= 10 and "?" not in text and _share(words, FILLER) >= 0.6:
        return "brief_filler"
    if NEW_TOPIC.search(text):
        return "new_question"
    short = len(words) <= MAX_FOLLOW_UP_WORDS
    if short and REACTS.search(text):
        return "genuine_follow_up"
    content = _content(words)
    query_content, reply_content = set(_content(query_words)), set(_content(reply_words))
    known = query_content | reply_content
    refers_back = POINTS_BACK.search(text) is not None or any(w in known for w in content)
    if short and FOLLOW_UP.search(text) and refers_back:
        return "genuine_follow_up"
    # "how many points is that per month?": a question about "that" in the conversation's terms.
    if short and is_question and POINTS_AT.search(text) and any(w in known for w in content):
        return "genuine_follow_up"
    # Built from the question's own words (a question asked again, or its facts told again); from
    # the reply's rather than the question's, it retells the reply.
    in_query, in_reply = _share(content, query_content), _share(content, reply_content)
    if content and (is_question and in_query >= GROUNDED_SHARE or len(content) >= 4 and max(in_query, in_reply) >= 0.6):
        return "restates_query" if in_query >= in_reply else "repeats_reply"
    new_numbers = set(number_values(text, words=False)) - set(number_values(query + " " + reply, words=False))
    # A short question about a number only the reply worked out means the turn read the reply
    # (small counts like 1 or 3 turn up anywhere, so they do not count).
    reply_numbers = {v for v in set(number_values(reply, words=False)) - set(number_values(query, words=False))
                     if v >= 10 or v.denominator != 1}
    if short and is_question and not new_numbers and set(number_values(text, words=False)) & reply_numbers:
        return "genuine_follow_up"
    if _share(content, known) < 0.25 and (is_question or (new_numbers and len(words) >= 8)):
        return "new_question"
    return "other"


# --------------------------------------------------------------------------- the LLM judge

JUDGE_RULES = """\
You judge one message written by a language model that was asked to play the USER of a chat \
with an AI assistant. You see the user's original question, the assistant's reply, and the \
message to judge: what the user says next. Choose exactly one label:
- genuine_follow_up: reacts to the assistant's reply as a real user would: asks about a step, \
questions or corrects the result, asks the assistant to finish a cut-off answer, asks what \
follows from it. It must depend on what the reply said.
- restates_query: repeats or paraphrases the original question, or asks it again.
- repeats_reply: copies or paraphrases the assistant's reply, or goes on solving the task as \
the assistant would.
- meta_planning: narration or planning instead of a message ("Let me think...", "The user \
wants...", "As the user I would ask...").
- malformed: empty, garbled, stuck repeating itself, or containing chat markup or several \
speakers.
- new_question: a new question or task unrelated to this conversation.
- brief_filler: a short acknowledgement with no content ("Thanks!", "OK").
- other: anything else.
Reply with only a JSON object: {"label": "<one label>", "reason": "<a few words>"}"""

MAX_CHARS = 2500
_ALIASES = {"genuine_followup": "genuine_follow_up", "follow_up": "genuine_follow_up",
            "followup": "genuine_follow_up", "restate_query": "restates_query",
            "restated_query": "restates_query", "repeat_reply": "repeats_reply",
            "repeated_reply": "repeats_reply", "meta": "meta_planning", "new_unrelated_question":
            "new_question", "unrelated_question": "new_question", "filler": "brief_filler"}


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS // 2] + "\n[...]\n" + text[-MAX_CHARS // 2:]


def judge_prompt(query: str, reply: str, turn: str) -> list[dict]:
    body = (f"The user's original question:\n<<<\n{_cut(query)}\n>>>\n\n"
            f"The assistant's reply:\n<<<\n{_cut(reply)}\n>>>\n\n"
            f"The user's next message, to judge:\n<<<\n{_cut(turn)}\n>>>\n\nAnswer with the JSON object only.")
    return [{"role": "system", "content": JUDGE_RULES}, {"role": "user", "content": body}]


def normalize_label(value: str) -> str | None:
    """A label as models tend to write it ("Genuine follow-up", "new-question") in FiC's form."""
    key = re.sub(r"[\s\-]+", "_", value.strip().lower()).strip("_.'\"")
    key = _ALIASES.get(key, key)
    return key if key in LABELS else None


def parse_judgement(text: str) -> str:
    """The label in a judge model's answer; ValueError saying what is wrong when there is none.

    Accepts the JSON object anywhere in the answer (code fences and chatter are ignored) and
    labels written with spaces, hyphens or capitals. Without JSON, an answer that names exactly
    one label is accepted (small judges often answer plainly)."""
    obj = find_json(text or "")
    if obj is not None:
        label = obj.get("label")
        if not isinstance(label, str):
            raise ValueError(f"the JSON object has no 'label' string (got {label!r:.40})")
        normalized = normalize_label(label)
        if normalized is None:
            raise ValueError(f"unknown label {label!r:.40}")
        return normalized
    plain = re.sub(r"[\s\-]+", "_", (text or "").lower())
    named = {label for label in LABELS if re.search(rf"(?<![a-z]){label}(?![a-z])", plain)}
    if len(named) == 1:
        return named.pop()
    if not (text or "").strip():
        raise ValueError("empty answer")
    raise ValueError("no JSON object and not exactly one label named" if not named
                     else f"no JSON object and several labels named ({', '.join(sorted(named))})")


def _retry_message(error: str) -> str:
    return (f"That answer could not be used: {error}. Reply again with only a JSON object "
            f"{{\"label\": ..., \"reason\": ...}} whose label is one of: {', '.join(LABELS)}.")


class RuleJudge:
    name = "rule"

    def describe(self) -> str:
        return "rule (offline heuristics of fic.probe.judge)"

    def judge(self, items: Sequence[tuple[str, str, str]]) -> list[tuple[str, str | None]]:
        return [(rule_judge(query, reply, turn), None) for query, reply, turn in items]


class LLMJudge:
    """Labels turns with a model through any backend; invalid answers are re-asked, then fall
    back to the rule label with a note."""

    name = "llm"

    def __init__(self, backend: Backend, model: str, *, max_new_tokens: int = 96, retries: int = 2, seed: int = 0):
        self.backend, self.model = backend, model
        self.max_new_tokens, self.retries, self.seed = max_new_tokens, retries, seed

    def describe(self) -> str:
        return f"llm ({self.model}, JSON answers, {self.retries} retries, then the rule label)"

    def judge(self, items: Sequence[tuple[str, str, str]]) -> list[tuple[str, str | None]]:
        results: list[tuple[str, str | None] | None] = [None] * len(items)
        # An empty turn needs no model to be called malformed.
        chats = {}
        for i, (query, reply, turn) in enumerate(items):
            if not (turn or "").strip():
                results[i] = ("malformed", None)
            else:
                chats[i] = judge_prompt(query, reply, turn)
        errors: dict[int, str] = {}
        for attempt in range(self.retries + 1):
            if not chats:
                break
            order = sorted(chats)
            params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0, seed=self.seed + attempt)
            outputs = self.backend.chat([chats[i] for i in order], params)
            for i, out in zip(order, outputs):
                try:
                    label = parse_judgement(out.text)
                except ValueError as err:
                    errors[i] = str(err)
                    chats[i] = chats[i] + [{"role": "assistant", "content": out.text or ""},
                                           {"role": "user", "content": _retry_message(str(err))}]
                    continue
                note = f"valid after {attempt} retr{'y' if attempt == 1 else 'ies'}" if attempt else None
                results[i] = (label, note)
                del chats[i]
        for i in chats:  # never answered usably
            query, reply, turn = items[i]
            results[i] = (rule_judge(query, reply, turn),
                          f"rule label used: {self.retries + 1} answers unusable ({errors[i]})")
        return results  # type: ignore[return-value]


def make_judge(kind: str, backend: Backend | None = None, **kwargs):
    if kind == "rule":
        return RuleJudge()
    if kind == "llm":
        if backend is None:
            raise ValueError("the llm judge needs a backend")
        return LLMJudge(backend, **kwargs)
    raise ValueError(f"unknown judge {kind!r}")
