"""The rule labels of assistant replies: Lost in Conversation's seven labels and the offline
heuristics that assign them: `reply_label(task, reply, user_texts)`, what the `rule` classifier
of `fic.conversation.classify` says, reads prose replies with `rule_label` (math-style answers)
and structured ones (calls, code, SQL) with `label_reply`, given the task's word on whether the
reply commits to an answer (`Task.committed_answer`).

Labels (definitions in our own words):

- `answer_attempt`: the reply commits to a complete answer to the task (a final number, a
  query, code ...), so that the conversation could end there (LiC's rule). Only these are
  extracted and scored.
- `clarification`: a short reply (under 100 words, as in LiC) whose point is one question
  asking the user for a specific missing detail.
- `interrogation`: a reply that asks the user several questions.
- `discussion`: talks about the problem (restates it, plans, explains) without answering;
  a vague question ("What else should I know?") or a long reply ending in a question is
  discussion too.
- `hedge`: offers several candidate answers for different readings of the task.
- `refuse`: declines to help.
- `missing`: empty reply.

A reply *asks* in a question ("How many games?") or in a request that reads as one ("Please
tell me the points per game.", "I still need the points per game.", "Go on."); a closing
*courtesy* question offers more help or checks the answer landed ("Anything else?", "Does that
help?", "Would you like me to explain a step?") and asks for no detail ("What else?" and "Is
there anything else I should know?" do).

`rule_label` (math-style answers), in order: empty -> missing; a refusal phrase near the start
-> refuse; `####` or `\\boxed{}`, or "final answer" / "the answer is" in a sentence that states
a value and is not a question -> answer_attempt ("Before I give the final answer, could you
tell me ...?" is not one); wording that branches over readings ("it depends", "depending on",
"if you mean") with numbers -> hedge; a reply that says it is waiting for more ("Once you tell
me ...", "before I can compute ...") or ends by asking -> answer_attempt only when a numeric
statement of its own comes before a single closing courtesy question; else interrogation
(asks twice or more), clarification (one specific ask in under 100 words) or discussion (a
vague ask, or a long reply); a closing sentence that states a number -> answer_attempt, unless
it is a recap, read against everything the user said so far, not one message at a time: it
computes nothing, its numbers are all the user's, and it restates several of them ("Got it: 4
years and 40 games per year." after "Ara played for 4 years." and "She played 40 games every
year."), or its words are mostly the user's, or it is closer to the message its number came from
than to the user's question ("Okay, Mia starts with 12 apples." after "Mia had 12 apples.");
otherwise discussion. An intermediate result followed by a request for more ("So 4 * 40 = 160
games. What else?", "... so 160 games in total. How many points per game?") is therefore no
answer attempt: the conversation could not end there.

`label_reply` (structured answers: calls, code, SQL): the task says whether the reply holds a
committed answer (not a template with placeholders, not an example: `fic.tasks.answers`);
without one, the reply is labelled by how it asks, as above. Tasks whose every reply is an answer
(`Task.replies_are_answers`: translation, summary, data2text) label any non-empty reply an
answer attempt.
"""

from __future__ import annotations

import re
from typing import Sequence

from fic.core.parsing import NUMBER, NUMBER_WORD, number_values
from fic.tasks import Task
from fic.tasks.answers import WAITING

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
requirements specifics particulars next comes coming following ready whenever detail function take into
account query call request values value got okay thanks thank sure noted alright understood great yes now
keep going carry ahead""".split())
REFUSAL = re.compile(r"\b(?:I can(?:no|')t (?:help|assist|answer|do that|provide)|I(?: am|'m) (?:sorry, but I|"
                     r"unable to|not able to)|I won't be able|I will not)\b", re.IGNORECASE)
HEDGE = re.compile(r"\b(?:it depends|depending on|if you mean|if you meant|could be either|"
                   r"there are (?:two|several|multiple) (?:possible|ways to read|interpretations))\b", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
CODE_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)


# A request that asks like a question: "Please tell me ...", "I still need ...", "Go on."
# ("Let me know if you need anything else" offers help and asks for nothing).
REQUEST = re.compile(
    r"^(?:\W*(?:okay|ok|sure|thanks|thank you|great|alright|got it|noted|so|and|now)\b[\s,.!:-]*)*(?:please\s+)?"
    r"(?:tell me|let me know (?!if\b|whether\b)|give me|share|provide|send (?:me )?the|go on|go ahead|continue|"
    r"keep going|carry on|proceed|what(?:'s| is) next)\b"
    r"|\bI(?:'ll| will| would|'d)?\s+(?:still\s+)?need\s+(?:to know|the|a|an|your|more|some|her|his|their|its|"
    r"one more|that|this|these|those)\b"
    r"|\bI still need\b|\b(?:is|are) (?:still )?missing\b",
    re.IGNORECASE)
# Courtesy questions after an answer: offers of more help, or a check that the answer landed.
OFFER = re.compile(
    r"\b(?:would you like|do you want|want me to|shall I|should I (?:also|explain|show|break|walk|go|add|"
    r"write|include)|can I (?:help|do|assist)|may I help|how (?:else )?can I help)\b", re.IGNORECASE)
COURTESY = re.compile(
    r"\b(?:anything else|something else|any (?:other |more |further )?questions|further questions|"
    r"(?:does|did|do) (?:that|this|it) (?:help|make sense|answer|work|look|clear)|makes? sense|"
    r"is (?:that|this) (?:all|correct|right|clear|helpful|ok|okay|what you)|is there anything|"
    r"need (?:anything|more help|further help|any help|help)|helpful|all good)\b",
    re.IGNORECASE)
# What makes a closing question ask for a detail instead: "What else?", "How many ...?"
ASKS_DETAIL = re.compile(
    r"\b(?:what else|what(?:'s| is| are) (?:the )?(?:next|rest|remaining|other)|how (?:many|much|long|often|far|"
    r"old)|which|when|where|who|(?:anything|something) (?:else )?(?:I|we) (?:should|need|must|have to)|"
    r"(?:more|other|remaining|missing|further|additional|next|extra) (?:details?|info|information|facts?|numbers?|"
    r"values?|data|pieces?|parts?|requirements?|conditions?|constraints?)|(?:do|should) (?:I|we) (?:need|know)|"
    r"tell me|is there more)\b", re.IGNORECASE)
COURTESY_WORDS = 14  # a longer closing question is no throwaway courtesy
ECHO_SHARE = 0.7  # share of a sentence's content words the user said that makes it a recap
# Words a recap adds around what the user said ("Got it: so she played 4 years and ...").
FILLER = set("""a an the and or so then also just it its it's that this these those is are was were be been
being has have had do does did got get okay ok alright sure thanks thank you noted understood great right i
i'm we me my your you're yes well now here there of to in on at for with by from per each every as let's let
s""".split())


def reply_sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(text) if s.strip()]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:\.[0-9]+)?", text.lower())


def _content_words(text: str) -> list[str]:
    """The words of `text` that carry content: neither filler nor numbers (digits or words)."""
    return [w for w in _words(NUMBER_WORD.sub(" ", text)) if w not in FILLER and not w[0].isdigit()]


def _stems(text: str) -> set[str]:
    """Content words with a plural `s` dropped ("games" ~ "game"): enough to see the same noun."""
    return {w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in _content_words(text)}


def _echoes(sentence: str, user_texts: Sequence[str]) -> bool:
    """Whether a sentence only restates what the user said, read across all the user's messages
    (small models parrot the shards back, often several at once and in other words: "Got it: 4
    years and 40 games per year.", "Mia starts with 12 apples."). Such a sentence is no answer.

    A sentence with a number of its own, or that computes ("4 * 40"), makes a claim. One whose
    numbers are all the user's is a recap when it restates several of them, when most of its
    words are the user's, or when it is closer to the message its number came from than to
    the user's question (the first message): "So each friend got 5 lollipops." answers "How
    many lollipops did Ray's friends get?" with the 5 of "he kept 5 lollipops" (a wrong answer,
    still an answer)."""
    if not user_texts:
        return False
    said_numbers = set().union(*(number_values(t) for t in user_texts))
    numbers = set(number_values(sentence))
    if not numbers <= said_numbers or re.search(r"\d\s*[*x×/+=-]\s*\d", sentence):
        return False
    if len(numbers) >= 2:
        return True
    said = set().union(*(_words(t) for t in user_texts))
    words = _content_words(sentence)
    if sum(w in said for w in words) >= ECHO_SHARE * len(words):
        return True
    stems = _stems(sentence)
    question, *facts = user_texts
    sources = [t for t in facts if numbers & set(number_values(t))]
    if not sources or numbers & set(number_values(question)):
        return False
    return max(len(stems & _stems(t)) for t in sources) >= max(len(stems & _stems(question)), 1)


def asks(sentence: str) -> bool:
    """Whether a sentence asks the user something: a question, or a request that reads as one."""
    return sentence.endswith("?") or REQUEST.search(sentence) is not None


def is_courtesy(question: str) -> bool:
    """A closing question that offers more help or checks the answer landed, asking for no detail."""
    if len(question.split()) > COURTESY_WORDS or not question.endswith("?"):
        return False
    if OFFER.search(question):
        return True
    return COURTESY.search(question) is not None and ASKS_DETAIL.search(question) is None


def asking_label(text: str, sentences: Sequence[str] | None = None) -> str:
    """The label of a reply that gives no answer, by how it asks: several questions ->
    interrogation; one specific ask (a question, else a request) in under 100 words ->
    clarification; else (a vague ask, a long reply, no ask) -> discussion."""
    sentences = reply_sentences(text) if sentences is None else sentences
    questions = [s for s in sentences if s.endswith("?")]
    if len(questions) >= 2:
        return "interrogation"
    # A request asks like a question ("Please tell me the date."); one next to a question
    # ("I need the date. Could you tell me?") is the same ask.
    asked = questions or [s for s in sentences if asks(s)]
    if not asked or len(text.split()) >= CLARIFICATION_WORDS or not _is_specific(asked[0]):
        return "discussion"
    return "clarification"


def rule_label(reply: str, user_texts: Sequence[str] = ()) -> str:
    """The rule classifier's label for one reply (see the module docstring for the order).

    `user_texts` (what the user said so far) lets a sentence that only restates the user's own
    words count as a recap rather than as an answer.
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
    if HEDGE.search(text) and NUMBER.search(text) is not None:
        return "hedge"
    asked = [s for s in sentences if asks(s)]
    if WAITING.search(text) or asks(sentences[-1]):
        # "... the total is 42. Anything else?" still commits to 42; "... so 160 games. How many
        # points per game?" does not: the conversation could not end there.
        statements = [s for s in sentences if not asks(s)]
        if statements and _states_number(statements[-1]) and len(asked) == 1 and is_courtesy(sentences[-1]) \
                and not WAITING.search(text) and not _echoes(statements[-1], user_texts):
            return "answer_attempt"
        return asking_label(text, sentences)
    conclusion = sentences[-1] if _states_number(sentences[-1]) else (
        sentences[-2] if len(sentences) > 1 and _states_number(sentences[-2])
        and NUMBER.search(sentences[-1]) is None and len(sentences[-1].split()) <= 12 else None)
    if conclusion is not None and not _echoes(conclusion, user_texts):
        return "answer_attempt"
    return asking_label(text, sentences)


def _is_specific(question: str) -> bool:
    """Whether a question names what it asks about (a word beyond the generic ones). Asking for
    "anything else" is vague whatever it is about ("Anything else for the alarm?")."""
    if re.search(r"\b(?:anything|something|what|whatever) else\b", question, re.IGNORECASE):
        return False
    return any(w not in VAGUE for w in re.findall(r"[a-z]{3,}", question.lower().replace("'", " ")))


def _states_number(sentence: str) -> bool:
    """A sentence that concludes with a value: it has a number and is not a question."""
    return not sentence.endswith("?") and NUMBER.search(sentence) is not None


def label_reply(reply: str, has_answer: bool) -> str:
    """The rule label for tasks whose answer is structured (a query, code, a call): an answer
    attempt when `has_answer` (the task found a committed answer in the reply), else what the
    reply does instead: nothing, a refusal, one question, several, or talk (see `asking_label`)."""
    text = (reply or "").strip()
    if not text:
        return "missing"
    if has_answer:
        return "answer_attempt"
    if REFUSAL.search(text[:300]):
        return "refuse"
    # Questions are read in the prose: a `?` in code (`WHERE country = ?`) asks nothing.
    prose = CODE_FENCE.sub("\n", text).strip()
    return asking_label(prose) if prose else "discussion"


def reply_label(task: Task, reply: str, user_texts: Sequence[str] = ()) -> str:
    """The rule classifier's label for one reply of a conversation on `task`."""
    if task.replies_are_answers:
        return "answer_attempt" if (reply or "").strip() else "missing"
    committed = task.committed_answer(reply or "")
    return rule_label(reply, user_texts) if committed is None else label_reply(reply, committed)
