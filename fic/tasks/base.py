"""What every task provides. Subclasses override the prompts, validation and scoring.

Besides prompts and scoring, a task tells the task-generic stages what its texts carry:

- `values_in(text, instance)`: the values a text states (numbers for math; argument values
  for function calling; ...). The user simulator checks that a rephrased shard keeps its
  values and reveals no value of a shard not yet given; the LLM sharder checks that shards
  carry exactly the values of the question; the SFT corpus checks that no reply before the
  last shard names a value the user has not given (`leak`).
- `committed_answer(reply)`: whether a reply commits to a structured answer (calls, code,
  SQL), for the offline classifier (`fic.conversation.labels`); None where it reads the prose.
- SFT-corpus replies while information is missing: `ask_for` (a question for the detail the
  next shard carries, or None), `generic_asks` (when no specific question can be made),
  `premature_reply` (a plausible wrong early answer for recovery conversations) and
  `mask_values` (a shard with its unrevealed values blanked, a hint for a model that writes
  replies).

The defaults treat numbers as a task's values, which fits any task whose details are
quantities; tasks whose details are names, dates or code override them.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Callable

from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.core.parsing import NUMBER, number_values
from fic.tasks.deferrals import DEFERRALS, choose_fresh
from fic.tasks.sharding import ShardingError

ErrorFactory = Callable[..., FicError]  # error(message, field) -> FicError naming file and record

# How a task words its prompts: `fic`, FiC's own; `lic`, Lost in Conversation's verbatim
# (`fic.tasks.lic_prompts`). One code path: every rendering method takes the style.
PROMPT_STYLES = ("fic", "lic")

GENERIC_ASKS = (
    "What else should I know?",
    "What are the remaining details?",
    "What information is still missing?",
    "Could you share the rest of the details?",
    "Are there more details I should know?",
    "What other details should I take into account?",
)



class Task:
    name: str = ""
    system_prompt: str = "You are a helpful assistant."
    required_fields: tuple[str, ...] = ()
    generic_asks: tuple[str, ...] = GENERIC_ASKS
    # Lost in Conversation sends the user turns of some tasks (translation, summary, data2text)
    # as written, never rephrased by the user simulator, and treats every reply there as an
    # answer attempt: the user asks for an updated answer at each turn.
    fixed_turns: bool = False
    replies_are_answers: bool = False
    # Tasks whose scoring runs model-written code (code): a run checks the sandbox before it plays.
    runs_code: bool = False
    # Optional modules (`fic.core.optional.EXTRAS`) scoring imports: a stage that scores checks them
    # before any model loads (`fic.tasks.check_scoring`), not after the first turn was played.
    scoring_needs: tuple[str, ...] = ()

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        """Raise `error(message, field)` for a missing or malformed task key."""
        for key in self.required_fields:
            value = fields.get(key)
            if not isinstance(value, str) or not value.strip():
                raise error(f"missing or empty; the {self.name} task needs it as text", key)

    def validate_shards(self, instance: Instance, error: ErrorFactory) -> None:
        """Raise `error(message, field)` for a shard this task cannot send (here: empty text)."""
        for index, shard in enumerate(instance.shards):
            if not shard.shard.strip():
                raise error(f"expected non-empty text, got {shard.shard!r}", f"shards[{index}].shard")

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        """The original, fully specified single-turn instruction (the full view's user turn)."""
        raise NotImplementedError

    def concat_prompt(self, shard_texts: list[str]) -> str:
        """All shards in one turn as a bullet list, as in Lost in Conversation's concat view."""
        return "".join(f"- {text}\n" for text in shard_texts).rstrip("\n")

    # ------------------------------------------------------------------ per-instance rendering
    # The defaults fit tasks whose shards are plain sentences; tasks whose prompts carry a schema,
    # documents or framing override them. `prompts` is the style (`PROMPT_STYLES`): FiC's own
    # wording, or Lost in Conversation's verbatim.

    def system_prompt_for(self, instance: Instance, prompts: str = "fic") -> str:
        """The system prompt of one instance (database puts its schema here)."""
        return self.system_prompt

    def shard_contents(self, instance: Instance) -> list[str]:
        """What each shard tells, in shard order (summary renders the documents a shard points to)."""
        return instance.shard_texts

    def sharded_turns(self, instance: Instance, prompts: str = "fic") -> list[str]:
        """The user turns of the sharded view, one per shard, as Lost in Conversation sends them."""
        return self.shard_contents(instance)

    def concat_turn(self, instance: Instance, contents: list[str], prompts: str = "fic") -> str:
        """The one user turn of the concat views, from shard contents in the order given. LiC's
        concat list keeps the newline after its last bullet."""
        return self.concat_prompt(contents) + ("\n" if prompts == "lic" else "")

    def shards_in_order(self, instance: Instance, contents: list[str]) -> list:
        """The instance's shards in the order of `contents` (shard contents, perhaps shuffled), for
        prompts that name a shard by its id (LiC's data2text hints)."""
        left = list(zip(self.shard_contents(instance), instance.shards))
        ordered = []
        for text in contents:
            index = next(i for i, (content, _) in enumerate(left) if content == text)
            ordered.append(left.pop(index)[1])
        return ordered

    def scored(self, text: str, instance: Instance, judge: Any = None) -> tuple[float, str | None]:
        """`score` plus why a reply scored 0 when the reason is not just a wrong answer (code that
        timed out, SQL that was refused, no judge configured); the simulator logs the note.
        `judge` is the run's LLM judge (a backend with `chat`, or None), for the tasks it scores
        (summary); the caller hands it in for each call, no task keeps one."""
        return float(self.score(text, instance)), None

    def scoring_caveats(self, judged: bool = False) -> list[str]:
        """What this task's scores do not measure as set up now (database without Spider
        databases; summary without a judge, `judged` telling whether the run has one), one
        sentence each; `fic eval` writes them to `metrics.json` and the report."""
        return []

    def extract_answer(self, text: str) -> str | None:
        """The answer part of a reply, or None when the reply holds no answer."""
        raise NotImplementedError

    def score(self, text: str, instance: Instance) -> float:
        """Score a reply in [0, 1] against the instance's reference."""
        raise NotImplementedError

    def reference_answer(self, instance: Instance) -> str:
        """The gold final answer, as a short string."""
        raise NotImplementedError

    def gold_reply(self, instance: Instance) -> str:
        """A complete assistant reply: the worked solution ending in the task's answer format."""
        raise NotImplementedError

    # ------------------------------------------------------------------ what texts carry

    def values_in(self, text: str, instance: Instance | None = None) -> Counter:
        """The values `text` states, as hashable, normalised keys (numbers by value here)."""
        return number_values(text)

    def leak(self, reply: str, revealed: set, instance: Instance) -> str | None:
        """Why `reply` may not be said before the last shard, or None when it is safe.

        Here: an answer marker, the reference answer's value (even one the user happened to
        say: the reply must not look like an answer), or any value the user has not given.
        Tasks whose reference is made of values the user gives (function calls) override it."""
        if "####" in reply or "\\boxed" in reply:
            return "holds an answer marker"
        reference = self.values_in(self.reference_answer(instance), instance)
        for value in self.values_in(reply, instance):
            if value in reference:
                return f"holds the reference answer {value}"
            if value not in revealed:
                return f"holds {value}, a value the user has not given yet"
        return None

    def mask_values(self, text: str, revealed: set, instance: Instance | None = None) -> str:
        """`text` with every value not in `revealed` replaced by `___`."""
        def blank(match: Any) -> str:
            return match.group(0) if set(number_values(match.group(0))) <= revealed else "___"
        return NUMBER.sub(blank, text)

    def answerable(self, instance: Instance, revealed_texts: list[str]) -> bool | None:
        """Whether the shards said so far (`revealed_texts`) carry everything an answer needs, so
        that answering now is not an error even if more shards follow; None where the task cannot
        tell (here: premature answers are then reported as they are, without this split)."""
        return None

    # ------------------------------------------------------------------ classifying replies

    def committed_answer(self, reply: str) -> bool | None:
        """Whether a reply commits to an answer, for tasks whose answer is structured (a call,
        code, a query): not a template with slots, not an example (`fic.tasks.answers`). None
        (here) where the classifier reads the reply's prose instead (math-style answers)."""
        return None

    # ------------------------------------------------------------------ SFT-corpus replies

    @property
    def deferrals(self) -> tuple[str, ...]:
        """Brief acknowledge-and-wait replies the SFT corpus says while details are missing."""

        return DEFERRALS

    def ask_for(self, shard: str, revealed: set, rng: random.Random,
                instance: Instance | None = None) -> str | None:
        """A brief question asking for what `shard` tells, naming none of its new values; None
        when no honest question can be made (the corpus then uses `generic_asks`). `instance`
        is there for tasks whose details are named by a schema (function parameters)."""
        return None

    def early_reply(self, next_turn: str, revealed: set, rng: random.Random, instance: Instance, *, ask: bool,
                    used: set[str]) -> tuple[str, bool]:
        """What the assistant says while information is missing: with `ask`, a question for what
        `next_turn` tells (`ask_for`), else or when no honest question can be made a pool phrasing
        (`generic_asks` or `deferrals`, one not yet in `used`); and whether it names the detail.
        It never holds a value the user has not given (`leak`): a pool phrasing that did would be
        a bug, raised, never a silent leak."""
        text = self.ask_for(next_turn, revealed, rng, instance) if ask else None
        if text is not None and self.leak(text, revealed, instance):
            text = None  # e.g. a revealed number equal to the answer: ask generically instead
        specific = text is not None
        if text is None:
            text = choose_fresh(rng, self.generic_asks if ask else self.deferrals, used)
        reason = self.leak(text, revealed, instance)
        if reason:
            raise AssertionError(f"pool reply {text!r} {reason}")
        return text, specific

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        """A plausible wrong answer given too early, from what was revealed so far; it must not
        hold the reference answer. Used (out of the loss) in recovery conversations."""
        raise NotImplementedError(f"task {self.name!r} has no premature replies; set recovery_share=0")

    # ------------------------------------------------------------------ sharding

    rule_sharder: bool = False  # whether `rule_shard` can shard this task's instances offline

    def rule_shard(self, instance: Instance, seed: int = 0) -> Instance:
        """A copy of `instance` with shards made by rules; `fic.tasks.sharding.ShardingError` when the task
        has no rule sharder or this instance cannot be split (the LLM sharder then does it)."""

        raise ShardingError(f"the {self.name} task has no rule sharder; shard its instances with --sharder llm",
                            record=instance.task_id)
