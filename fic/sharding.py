"""Rule-based sharding of math word problems into Lost-in-Conversation shards.

Shard 1 states the goal (the question sentence, framed as an intent); each later shard
carries one fact sentence of the problem, in the original order. Sentences are moved, never
rewritten, so every number of the question lands in exactly the shard its sentence belongs
to: `shard_math` checks this and refuses (`ShardingError`) when it would not hold, or when
the problem has too few facts to split. The seed only picks the intent wording.
"""

from __future__ import annotations

import re
from collections import Counter

from fic.errors import FicError
from fic.instance import Instance, Shard
from fic.parsing import NUMBER, number_values
from fic.seeding import pick

INTENT_FRAMES = (
    "I need help with a math problem. {goal}",
    "Can you help me work something out? {goal}",
    "Here's what I want to figure out. {goal}",
    "Quick question. {goal}",
    "I'm trying to solve a word problem. {goal}",
)
ABBREVIATIONS = ("Mr.", "Mrs.", "Ms.", "Dr.", "St.", "Jr.", "Sr.", "vs.", "e.g.", "i.e.", "etc.")
QUESTION_WORDS = r"(?:how|what|which|who|when|where|calculate|find|determine|compute|work out)"
# "If he gets paid $5 a day, how much ..." -> a fact and a goal.
LEADING_CONDITION = re.compile(
    rf"^(?:if|given that|given|assuming that|assuming|suppose that|suppose)\s+(?P<fact>.+?),\s*"
    rf"(?P<goal>{QUESTION_WORDS}\b.*)$", re.IGNORECASE | re.DOTALL)
# "... how many can you eat if your target is 1800 calories?" -> the goal and a fact.
TRAILING_CONDITION = re.compile(r"^(?P<goal>.+?)\s+(?:if|given that)\s+(?P<fact>.+?)(?P<end>[?.!]?)$",
                                re.IGNORECASE | re.DOTALL)


class ShardingError(FicError):
    """This instance cannot be sharded by the rules; the caller drops it with the reason."""


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences without breaking decimals (0.5), money ($3.50) or titles (Ms.)."""
    pieces = re.split(r"(?<=[.!?])\s+(?=[\"'A-Z0-9£$€])|\n\s*\n", text.strip())
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


def _is_goal(sentence: str) -> bool:
    return (sentence.rstrip().endswith("?") or LEADING_CONDITION.match(sentence) is not None
            or re.match(rf"^(?:now,\s*)?{QUESTION_WORDS}\b", sentence, re.IGNORECASE) is not None)


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
    leading = LEADING_CONDITION.match(goal)
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
    sentences = split_sentences(question)
    goal_index = max((i for i, s in enumerate(sentences) if _is_goal(s)), default=None)
    if goal_index is None:
        raise ShardingError("no question sentence found to state the goal", record=instance.task_id)
    goal, goal_facts = _split_goal(sentences[goal_index])
    facts = sentences[:goal_index] + goal_facts
    instructions = sentences[goal_index + 1:]  # "Give the result as your final answer." and the like
    if not facts:
        raise ShardingError("only one piece of information; nothing to reveal over several turns",
                            record=instance.task_id)
    goal = re.sub(r"^now,\s*", "", goal, flags=re.IGNORECASE)
    goal = goal[0].upper() + goal[1:]
    intent = " ".join([pick(INTENT_FRAMES, seed, instance.task_id).format(goal=goal), *instructions])
    texts = [intent, *facts]
    if _numbers(question) != sum((_numbers(t) for t in texts), Counter()):
        raise ShardingError("the numbers of the shards differ from the question's", record=instance.task_id)
    shards = [Shard(shard_id=i, shard=text) for i, text in enumerate(texts, start=1)]
    return Instance(task_id=instance.task_id, task=instance.task, shards=shards, fields=dict(instance.fields))


SHARDERS = {"math": shard_math}


def shard_missing(instances: list[Instance], *, seed: int = 0,
                  progress: bool = False) -> tuple[list[Instance], list[tuple[Instance, str]]]:
    """Keep instances that have shards, rule-shard the rest; return the kept ones (in order)
    and the (instance, reason) pairs that could not be sharded."""
    from tqdm import tqdm

    kept, dropped = [], []
    for instance in tqdm(instances, desc="sharding", unit="inst", disable=not progress or None):
        if instance.is_sharded:
            kept.append(instance)
            continue
        try:
            kept.append(shard_rule(instance, seed=seed))
        except ShardingError as err:
            dropped.append((instance, err.message))
    return kept, dropped


def shard_rule(instance: Instance, *, seed: int = 0) -> Instance:
    """Shard with the rules of the instance's task."""
    try:
        sharder = SHARDERS[instance.task]
    except KeyError:
        raise FicError(f"the rule sharder supports tasks {', '.join(SHARDERS)}; got {instance.task!r}; "
                       "use --sharder llm for other tasks") from None
    return sharder(instance, seed=seed)
