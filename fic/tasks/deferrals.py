"""What the assistant says while a task is still incomplete, and the check that it says no more.

- `DEFERRALS`: brief acknowledge-and-wait replies written for FiC (short replies train faster
  and cost fewer tokens per conversation than long ones).
- `ask_for(shard, revealed)`: a rule-based question for the detail a coming shard carries
  ("she scores 21 points in each game" -> "Could you tell me how many points she scores in
  each game?"), or None when no honest question can be made; `GENERIC_ASKS` cover that case.
- `premature_answer(...)`: a plausible *wrong* early answer built from the numbers revealed so
  far (a partial computation), for recovery conversations.
- the task's `leak(reply, revealed, instance)` (`fic.tasks.base`): the guard every non-final reply
  passes: it may hold no number the user has not given yet and never the reference answer.

These are the tasks' own texts (`Task.deferrals`, `generic_asks`, `ask_for`, `premature_reply`,
`early_reply`), read by the SFT corpus and by VASD's labels alike, so they stay below both; the
corpus's own wording (the acknowledgement that opens a recovery answer) is in `fic.corpus.build`.

Numbers are compared by value (`Fraction`), digits and number words alike ("four" == "4"),
sign ignored. The guard is deliberately conservative: "two hundred" reads as {2, 100}, so a
reply that spells a revealed 200 that way is refused rather than risk a leak.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction

from fic.core.parsing import NUMBER_WORD, clean_number, number_values, word_value

DEFERRALS = (
    "Got it. What else do I need to know?",
    "Okay, noted. What's next?",
    "Thanks. Please go on.",
    "Understood. What other details are there?",
    "Got it. Keep going.",
    "Noted. Is there more?",
    "Okay. What else?",
    "Thanks, I'm following. What comes next?",
    "Alright. I'll wait for the rest before solving.",
    "Got it. I need more details before I can answer.",
    "Sure. Tell me the rest.",
    "Okay, I have that. What else should I know?",
    "Thanks for that. Anything else?",
    "Noted. I'll hold off on solving until I have everything.",
    "Makes sense. Go on.",
    "Got it so far. What's the next detail?",
    "Okay. Please share the remaining details.",
    "Thanks. I'll need the rest of the information to solve this.",
    "Understood. Continue whenever you're ready.",
    "Alright, noted. What other information do you have?",
    "Got it. Let me know the rest.",
    "Okay. That's not enough to solve it yet. What else?",
    "I see. What else should I take into account?",
    "Thanks. What's the rest of the problem?",
)

GENERIC_ASKS = (
    "What else should I know, e.g. the numbers involved?",
    "Could you give me the numbers I need?",
    "What are the remaining details?",
    "Which quantities are involved?",
    "What other facts or numbers should I use?",
    "Can you share the rest of the details, including any amounts?",
    "What information is still missing?",
    "Are there more details or numbers I should know?",
)

MAX_ASK_WORDS = 16  # longer facts get a generic ask: asks stay brief, like deferrals
ACKS = ("Got it.", "Okay.", "Thanks.", "Noted.", "Sure.", "Understood.", "Alright.", "")
# `{q}` is an indirect question in statement word order: "how many pens he bought".
INDIRECT_FRAMES = ("Could you tell me {q}?", "Can you tell me {q}?", "Do you know {q}?",
                   "I still need to know {q}.", "Please tell me {q}.")

PREMATURE_FRAMES = (
    "Based on that: {work}.\n#### {result}",
    "Here's the answer with what you've given me: {work}.\n#### {result}",
    "Let me work it out: {work}. So the answer is {result}.\n#### {result}",
    "Assuming that's everything, {work}.\n#### {result}",
    "That gives {work}.\n#### {result}",
)
GUESS_FRAMES = (
    "I'll assume typical values here, which gives {result}.\n#### {result}",
    "Without more details, my best estimate is {result}.\n#### {result}",
    "Going with a reasonable assumption, the answer is {result}.\n#### {result}",
)

# A mention the question maker can blank out: currency + digits (+ %), or a number word.
MENTION = re.compile(rf"(?P<cur>[$£€])?(?P<num>\d(?:[\d,]*\d)?(?:\.\d+)?|{NUMBER_WORD.pattern})(?P<pct>\s?%|\s+percent\b)?",
                     re.IGNORECASE)


def as_value(text: str) -> Fraction | None:
    """The value of a reference answer such as "3360", "-4", "2.5" or "3/4"."""
    found = number_values(text)
    return next(iter(found)) if len(found) == 1 else None


def fmt(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.2f}".rstrip("0").rstrip(".")


# --- the question maker --------------------------------------------------------------------

_SWAP = {"i": "you", "me": "you", "my": "your", "mine": "yours", "myself": "yourself", "we": "you",
         "us": "you", "our": "your", "ours": "yours", "ourselves": "yourselves", "am": "are",
         "i'm": "you're", "i've": "you've", "i'll": "you'll", "i'd": "you'd", "we're": "you're",
         "we've": "you've", "we'll": "you'll"}
# Words that cannot start the noun phrase after a number ("72 inside", "36 of them", "3 more").
_NOT_NOUN = {"of", "in", "on", "at", "for", "to", "with", "inside", "outside", "each", "every", "per",
             "and", "or", "but", "more", "less", "fewer", "times", "than", "as", "left", "from", "by",
             "into", "out", "off", "over", "under", "is", "are", "was", "were", "percent", "a", "an",
             "the", "so", "if", "when", "then", "too", "later", "ago", "total", "altogether", "instead"}
# Sentence-initial words that are not names, lowered when the sentence is embedded in a question.
_NOT_BLANKABLE = {"half", "twice", "double", "triple", "thrice", "dozen", "hundred", "thousand", "million",
                  "billion"}
_SUBORDINATE = re.compile(r"\b(?:that|which|who|whom|whose|where|when|while|because|if|until)\b",
                          re.IGNORECASE)
_DETERMINERS = {"his", "her", "their", "its", "your", "the", "a", "an", "these", "those", "all"}
_LOWER_FIRST = {"he", "she", "it", "they", "the", "a", "an", "each", "every", "his", "her", "its", "their",
                "this", "that", "these", "those", "there", "some", "all", "both", "you", "your", "then",
                "after", "later", "also", "and", "but", "now", "finally", "on", "in", "at", "for"}


def _swap_person(text: str) -> str | None:
    """Turn the user's first person into the assistant's second person; None if it says "you"."""
    if re.search(r"\byou(?:r|rs|rself|'re|'ve|'ll|'d)?\b", text, re.IGNORECASE):
        return None
    def swap(match: re.Match) -> str:
        word = match.group(0)
        return _SWAP.get(word.lower(), word)
    text = re.sub(r"\b(?:I'm|I've|I'll|I'd|we're|we've|we'll|I|me|my|mine|myself|we|us|our|ours|ourselves)\b",
                  swap, text, flags=re.IGNORECASE)
    return re.sub(r"\byou was\b", "you were", re.sub(r"\byou am\b", "you are", text))


def _lower_first(text: str) -> str:
    first = text.split(" ", 1)[0]
    return text[0].lower() + text[1:] if first.lower() in _LOWER_FIRST else text


def _value(match: re.Match) -> Fraction:
    num = match.group("num")
    if num[0].isdigit():
        return Fraction(clean_number(num))
    return word_value(num)


def ask_for(shard: str, revealed: set[Fraction], rng: random.Random) -> str | None:
    """A question asking for what `shard` tells, without saying it; None when none can be made.

    With one new number followed by a noun, the number and noun move to the front as an indirect
    question ("he bought 4 pens" -> "how many pens he bought"); otherwise each new number (at most
    two) is replaced in place, an echo question ("He dropped how many of them?"). The result holds
    no number that is not in `revealed`; callers still pass it through the task's `leak`.
    """
    text = _swap_person(re.sub(r"^(?:and|but|so|then|also)\s+", "", shard.strip().rstrip(".!?;:").strip(),
                               flags=re.IGNORECASE))
    if not text or "?" in text or "\n" in text:
        return None
    mentions = [m for m in MENTION.finditer(text) if _value(m) not in revealed]
    if not mentions or len(mentions) > 2:
        return None
    for m in mentions:
        before, after = text[m.start() - 1:m.start()], text[m.end():m.end() + 1]
        if (before and before not in " (") or (after and not (after in " ,;)" or after.isspace())):
            return None  # "5-year-old", "3x", "2nd": glued to other text, no clean blank
        if m.group("num").lower() in _NOT_BLANKABLE or _value(m) == 1 or \
                re.match(r"\s+as\b", text[m.end():]):
            return None  # "twice as many", "two hundred", "one pack", "0.5 as many": "how many" would not fit
        if m.group("cur") and re.match(r"\s+[A-Za-z]", text[m.end():]) and \
                text[m.end():].split()[0].lower() not in _NOT_NOUN:
            return None  # "$410,000 budget": the amount modifies a noun, no question fits
    if len(text.split()) > MAX_ASK_WORDS:
        return None  # a long echo is no brief question; the caller asks generically
    if len(mentions) == 1:
        question = _fronted(text, mentions[0])
        if question is not None:
            return f"{_pick(rng, ACKS)} {_pick(rng, INDIRECT_FRAMES).format(q=question)}".strip()
    pieces, last = [], 0
    for m in mentions:
        pieces += [text[last:m.start()], _wh(m)]
        last = m.end()
    echo = "".join(pieces) + text[last:]
    echo = echo[0].upper() + echo[1:]
    return f"{_pick(rng, ACKS)} {echo}?".strip()


def _wh(mention: re.Match) -> str:
    if mention.group("cur"):
        return "how much"
    if mention.group("pct"):
        return "what percent"
    return "how many"


def _fronted(text: str, mention: re.Match) -> str | None:
    """The indirect question with the blanked quantity moved to the front, or None."""
    if "," in text or "(" in text or mention.group("pct"):
        return None
    rest = text[mention.end():]
    if mention.group("cur"):
        phrase, tail = "how much", rest
    else:
        noun = re.match(r"\s+([A-Za-z][A-Za-z'-]*)((?:\s+of\s+[A-Za-z][A-Za-z'-]*)?)", rest)
        if noun is None or noun.group(1).lower() in _NOT_NOUN:
            return None
        phrase, tail = f"how many {noun.group(1)}{noun.group(2)}", rest[noun.end():]
    head = text[:mention.start()].rstrip()
    if _SUBORDINATE.search(head):  # "a bed that is 112.5 feet long": the number sits in a clause
        return None
    if head.split() and head.split()[-1].lower() in _DETERMINERS:  # "among his 4 friends"
        head = head.rsplit(None, 1)[0] if len(head.split()) > 1 else ""
    if not head:  # nothing before the number: "4 pens were sold" reads fine as an echo instead
        return None
    clause = " ".join(f"{head} {tail.strip()}".split())
    return f"{phrase} {_lower_first(clause)}"


def choose_fresh(rng: random.Random, pool: tuple[str, ...], used: set[str]) -> str:
    """A phrasing of `pool` not yet in `used` (repeats only once the pool is spent); marks it used."""
    fresh = [p for p in pool if p not in used] or list(pool)
    choice = fresh[rng.randrange(len(fresh))]
    used.add(choice)
    return choice


def _pick(rng: random.Random, options: tuple[str, ...]) -> str:
    return options[rng.randrange(len(options))]


# --- premature answers for recovery conversations -------------------------------------------

def premature_answer(revealed_in_order: list[Fraction], reference: Fraction | None,
                     rng: random.Random) -> str:
    """A plausible wrong early answer: a partial computation on what was revealed, never the reference.

    With no usable number revealed it is a bare guess. The text never holds the reference value
    (checked), so an earlier "answer" can never teach the final one.
    """
    numbers = [v for v in dict.fromkeys(revealed_in_order) if v != 0]
    for _ in range(30):
        if len(numbers) >= 2:
            a, b = rng.sample(numbers, 2)
            op = rng.choice("+*-")
            if op == "-" and a < b:
                a, b = b, a
            result = a + b if op == "+" else a * b if op == "*" else a - b
            work = f"{fmt(a)} {op} {fmt(b)} = {fmt(result)}"
        elif len(numbers) == 1:
            a, k = numbers[0], rng.choice((2, 3, 4, 10))
            result = a * k
            work = f"{fmt(a)} * {k} = {fmt(result)}"
        else:
            result, work = Fraction(rng.randint(2, 120)), None
        if result <= 0 or (result * 100).denominator != 1:
            continue  # keep the shown arithmetic exact to two decimals
        if work is None:
            text = _pick(rng, GUESS_FRAMES).format(result=fmt(result))
        else:
            text = _pick(rng, PREMATURE_FRAMES).format(work=work, result=fmt(result))
        if reference is None or reference not in number_values(text):
            return text
    for guess in range(2, 1000):  # the reference is a single value: some small guess differs from it
        if reference is None or Fraction(guess) != reference:
            return _pick(rng, GUESS_FRAMES).format(result=guess)
    raise AssertionError("unreachable")
