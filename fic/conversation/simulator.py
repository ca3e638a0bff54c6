"""Playing conversations in lockstep: many conversations, one batched generation call per turn.

A `Conversation` is one (instance, view, run). `play` advances every still-active
conversation by one turn per step:

1. the user speaks: single-turn views send their one prompt; in multi-turn views turn 1
   sends shard 1 verbatim (as in Lost in Conversation) and later turns ask the user
   simulator (`fic.conversation.users`) for its next message, batched over all conversations. The
   user reveals at most one shard a turn and may reveal none (LiC's shard id -1: a brief
   "I don't know" to a question the shards do not answer). Turns that reveal nothing are
   bounded: after `max_idle_turns` of them in one conversation the next shard is revealed
   verbatim (noted in the turn's `user_note`), so a conversation has at most
   shards + `max_idle_turns` user turns (recap: one more) and always ends;
2. the assistant replies: the prompts of all active conversations go to the backend in
   chunks of `batch_size` (so 64 conversations cost about as many calls as one
   conversation has turns);
3. single-turn views (`full`, `concat`, `shuffle-concat`) are never classified, as in LiC:
   every reply is extracted and scored (label `not_classified`). In multi-turn views each
   reply is labelled by the classifier (`fic.conversation.classify`) and only answer attempts are
   extracted and scored;
4. a conversation stops at the first correct answer (`stop_at_correct`, the LiC default) or
   after the reply to the turn that revealed its last shard (recap: to the recap turn);
   finished conversations drop out and are handed to `on_finish` at once, so the caller can
   log them before the next step (resumable logs).

Two forms of each conversation are kept: the text messages (for the user simulator, the
classifier and the logs) and the exact token ids the assistant saw and produced. The ids
grow with `fic.core.chat.prompt_ids` / `continue_ids` plus the ids the backend generated, so the
assistant's replies are never re-tokenised. Backends without token ids (openai) get the text
messages through `chat` instead.

Views: `full`, `concat`, `shuffle-concat` (one turn; every run draws its own order of the
shards from (`view_seed`, run)), `sharded` (one shard per turn),
`recap` (sharded plus a last turn restating every shard), `snowball` (each later turn
restates the shards revealed so far before the new one). With the verbatim user the turns
are exactly `fic.data.views.user_turns`. The assistant only gets the task's system prompt: it is
never told the conversation is multi-turn. A conversation's `prompts` is the wording of its
system prompt and user turns: FiC's own (`fic`) or Lost in Conversation's verbatim (`lic`).

Seeding: every sampled reply (the assistant's, and the user model's) has a seed of its own,
derived from (`seed`, the conversation's task id, view and run, its turn), and the backends
sample each prompt from its own seed alone (`SamplingParams.seeds`). So the N runs of a
conversation are independent samples, and a reply does not depend on the batch it was played
in: a resumed evaluation, or one played in other chunks (`batch_size`), draws exactly the
replies an uninterrupted one would (up to the last bit of floating point the batch shape may
change in the logits).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from fic import tasks
from fic.core import progress
from fic.core.chat import continue_ids, prompt_ids
from fic.core.errors import FicError, cut_short_on_sigterm, one_line
from fic.core.generation import Backend, Generation, SamplingParams
from fic.core.instance import Instance
from fic.core.ranks import Ranks
from fic.core.seeding import derive_seed, reply_seed
from fic.data.views import (
    SINGLE_TURN_VIEWS,
    VIEWS,
    check_prompts,
    recap_turn,
    rendered,
    shard_turn,
    snowball_turn,
    system_message,
    user_turns,
)

MULTI_TURN_VIEWS = tuple(v for v in VIEWS if v not in SINGLE_TURN_VIEWS)
NOT_CLASSIFIED = "not_classified"  # the label of single-turn replies: scored always, never classified
NOTHING = -1  # LiC's shard id of a user turn that reveals no shard
DEFAULT_MAX_IDLE_TURNS = 3
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # the turns' timestamps, as LiC's logs write them


@dataclass
class Turn:
    """One user turn and the assistant's reply to it, as logged."""

    user: str
    shard_ids: list[int]            # shards this user turn revealed for the first time ([]: none)
    reply: str = ""
    label: str = ""
    answer: str | None = None       # extracted from answer attempts and from every single-turn reply
    score: float | None = None      # 0..1, for the same replies
    prompt_tokens: int = 0          # context length the assistant saw for this reply
    reply_tokens: int = 0           # tokens the assistant generated
    finish_reason: str = ""
    seed: int | None = None         # the seed this reply was sampled from (see the module docstring)
    user_note: str | None = None    # why the user simulator fell back, if it did
    label_note: str | None = None   # why the classifier fell back, if it did
    score_note: str | None = None   # why the score is what it is beyond a wrong answer (sandbox, no judge)
    sent_at: str = ""               # when the user turn was sent and the reply came back: local time,
    replied_at: str = ""            # to the second, as Lost in Conversation's logs stamp them

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Conversation:
    instance: Instance
    view: str
    run: int = 0
    messages: list[dict] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    revealed: list[int] = field(default_factory=list)
    done: bool = False
    stop_reason: str | None = None
    view_seed: int = 0  # the shuffle-concat order
    max_idle_turns: int = DEFAULT_MAX_IDLE_TURNS  # user turns that may reveal nothing
    recapped: bool = False  # recap view: the restating turn has been sent
    prompts: str = "fic"  # the prompt style (`fic.tasks.base.PROMPT_STYLES`): FiC's wording or LiC's

    def __post_init__(self) -> None:
        check_prompts(self.prompts)
        if self.view not in VIEWS:
            raise FicError(f"unknown view {self.view!r}; expected one of {', '.join(VIEWS)}", field="views")
        if self.view != "full" and not self.instance.is_sharded:
            raise FicError(f"view {self.view!r} needs shards", record=self.instance.task_id, field="shards")
        if not self.messages:
            self.messages = [system_message(self.instance, self.prompts)]

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.instance.task_id, self.view, self.run)

    @property
    def task(self):
        return tasks.get(self.instance.task)

    @property
    def shard_ids(self) -> list[int]:
        return [s.shard_id for s in self.instance.shards]

    @property
    def unrevealed(self) -> list[int]:
        return [i for i in self.shard_ids if i not in self.revealed]

    @property
    def idle_turns(self) -> int:
        """User turns so far that revealed no shard (the recap turn does not count)."""
        return sum(1 for t in self.turns if not t.shard_ids) - int(self.recapped)

    def everything_said(self) -> bool:
        """Whether the user has nothing left to say: the conversation ends after this reply."""
        if self.view in SINGLE_TURN_VIEWS:
            return bool(self.turns)
        return not self.unrevealed and (self.view != "recap" or self.recapped)

    def most_turns(self, user_idles: bool = True) -> int:
        """The most assistant replies this conversation can take in all: one in a single-turn
        view; else one per shard, the recap turn, and the turns that reveal nothing (only a user
        model idles; the verbatim user reveals a shard every turn)."""
        if self.view in SINGLE_TURN_VIEWS:
            return 1
        return len(self.shard_ids) + (self.view == "recap") + (self.max_idle_turns if user_idles else 0)

    def needs_user_simulator(self) -> bool:
        """Turns 2.. of a multi-turn view are written by the user simulator."""
        return self.view in MULTI_TURN_VIEWS and bool(self.turns) and bool(self.unrevealed)

    def score(self) -> float:
        """The conversation's score: that of its last answer attempt (0 when it never answered).

        With `stop_at_correct` this is 1 exactly when some answer was correct, as in LiC.
        """
        scored = [t.score for t in self.turns if t.score is not None]
        return scored[-1] if scored else 0.0

    def to_record(self) -> dict:
        """The log line: the key, the outcome and the full trace of turns."""
        last_shard_turn = max((k for k, t in enumerate(self.turns) if t.shard_ids), default=None)
        first_attempt = next((k for k, t in enumerate(self.turns) if t.label == "answer_attempt"), None)
        system = self.messages[0]["content"] if self.messages and self.messages[0]["role"] == "system" else None
        return {
            "task_id": self.instance.task_id, "task": self.instance.task, "view": self.view, "run": self.run,
            "score": self.score(), "stop_reason": self.stop_reason, "num_turns": len(self.turns),
            "num_shards": len(self.instance.shards),
            # Turn index (0-based) of the first answer attempt, and whether it came before the
            # user had revealed every shard (a premature answer, the main failure in LiC).
            "first_answer_turn": first_attempt,
            "premature_answer": (first_attempt is not None and self.view in MULTI_TURN_VIEWS
                                 and not self._all_revealed_by(first_attempt)),
            # How many shards the user had revealed when the first answer attempt came (the
            # answer-timing bins of `fic.evaluation.metrics` read it as a share of num_shards).
            "shards_at_first_answer": (None if first_attempt is None else
                                       len({i for t in self.turns[:first_attempt + 1] for i in t.shard_ids})),
            # Whether the shards said by the first answer attempt were enough to answer
            # (`Task.answerable`): a premature answer that was not is an error of reading.
            "answerable_at_first_answer": answerable_by(self.instance, self.view, self.turns, first_attempt),
            "last_shard_turn": last_shard_turn,
            "prompt_tokens": self.turns[-1].prompt_tokens if self.turns else 0,
            "generated_tokens": sum(t.reply_tokens for t in self.turns),
            "system": system,  # the system prompt the assistant saw (with the instance's tools, if any)
            "turns": [t.to_dict() for t in self.turns],
        }

    def _all_revealed_by(self, turn_index: int) -> bool:
        seen = {i for t in self.turns[:turn_index + 1] for i in t.shard_ids}
        return all(i in seen for i in self.shard_ids)


def answerable_by(instance: Instance, view: str, turns: Sequence[Any], turn: int | None) -> bool | None:
    """`Task.answerable` of the shards revealed by turn `turn` of a multi-turn view (turns as
    `Turn`s or their dicts); None for no turn, in a single-turn view, or where the task cannot tell."""
    if turn is None or view not in MULTI_TURN_VIEWS:
        return None
    ids = {i for t in turns[:turn + 1] for i in (t["shard_ids"] if isinstance(t, dict) else t.shard_ids)}
    return tasks.get(instance.task).answerable(instance, [s.shard for s in instance.shards if s.shard_id in ids])


def unanswerable_answer_rate(records: list[dict]) -> float | None:
    """Share of conversations whose first answer attempt came before the shards said were enough
    to answer (`Task.answerable`): the part of the premature answers that is an error of reading,
    not the sharded view's own ambiguity. None where the task cannot tell for some premature one."""
    premature = [r for r in records if r.get("premature_answer")]
    if not records or any(r.get("answerable_at_first_answer") is None for r in premature):
        return None
    return sum(r["answerable_at_first_answer"] is False for r in premature) / len(records)


@dataclass
class UserTurn:
    """What the user simulator says at one turn: the text and the one shard it reveals
    (`NOTHING`, -1, when it reveals none)."""

    text: str
    shard_id: int
    note: str | None = None


def _first_user_turn(conv: Conversation) -> tuple[str, list[int]]:
    if conv.view in SINGLE_TURN_VIEWS:
        (text,) = user_turns(conv.instance, conv.view, seed=conv.view_seed, prompts=conv.prompts)
        return text, conv.shard_ids
    return shard_turn(conv.instance, conv.shard_ids[0], conv.prompts), [conv.shard_ids[0]]


def _compose(conv: Conversation, picked: UserTurn | None) -> tuple[str, list[int], str | None]:
    """The next user message of `conv`: the simulator's shard, wrapped as the view wants."""
    if not conv.turns:
        text, ids = _first_user_turn(conv)
        return text, ids, None
    if picked is None:  # only recap's last turn comes here
        conv.recapped = True
        return recap_turn(conv.instance, conv.prompts), [], None
    if picked.shard_id == NOTHING and conv.idle_turns >= conv.max_idle_turns:
        # The bound on turns that reveal nothing: the conversation must go on to its end.
        shard = next(s for s in conv.instance.shards if s.shard_id == conv.unrevealed[0])
        picked = UserTurn(shard_turn(conv.instance, shard.shard_id, conv.prompts), shard.shard_id,
                          note=f"revealed shard {shard.shard_id} verbatim: the user already revealed nothing "
                          f"{conv.idle_turns} time(s) (max_idle_turns={conv.max_idle_turns})")
    ids = [] if picked.shard_id == NOTHING else [picked.shard_id]
    if conv.view == "snowball":
        # LiC restates the user's earlier messages; here their verbatim sharded turns (FiC: the shards).
        said = rendered(conv.task, "sharded_turns", conv.instance, prompts=conv.prompts) if conv.prompts == "lic" \
            else conv.task.shard_contents(conv.instance)
        by_id = dict(zip(conv.shard_ids, said))
        return snowball_turn(conv.instance, [by_id[i] for i in conv.revealed], picked.text, conv.prompts), ids, \
            picked.note
    return picked.text, ids, picked.note


def _generate(backend: Backend, convs: list[Conversation], params: SamplingParams) -> list[Generation]:
    if getattr(backend, "tokenizer", None) is None:  # remote: text in, text out
        return backend.chat([c.messages for c in convs], params)
    return backend.generate([c.ids for c in convs], params)


def _grow_ids(backend: Backend, conv: Conversation, message: dict) -> None:
    """Append a user message (and the generation prompt) to the conversation's exact ids."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return

    if not conv.ids:
        conv.ids = prompt_ids(tokenizer, conv.messages + [message])
    else:
        conv.ids = continue_ids(tokenizer, conv.messages, conv.ids, [message])


def play(conversations: Sequence[Conversation], assistant: Backend, user: Any, classifier: Any,
         params: SamplingParams, *, batch_size: int = 64, stop_at_correct: bool = True, seed: int = 0,
         max_turns: int | None = None, max_context: int | None = None,
         on_finish: Callable[[Conversation], None] | None = None,
         on_step: Callable[[int, int], None] | None = None, judge: Any = None,
         ranks: Ranks | None = None) -> list[Conversation]:
    """Play every conversation to its end in lockstep; return them (also updated in place).

    `user` is a user simulator (`fic.conversation.users`), `classifier` a reply classifier
    (`fic.conversation.classify`). `max_turns` cuts conversations after that many replies (benchmarks);
    `max_context` ends a conversation whose next prompt plus `params.max_new_tokens` would not
    fit the model. `on_step(step, active)` is called before each step. `judge` is the LLM judge
    handed to the tasks that score with one (summary; `Task.scored`).

    `ranks` (`fic.core.ranks.Ranks`): the processes of a sharded model (ZeRO-3, FSDP), each playing
    its own conversations. Every forward must run on every rank, so the ranks agree before each
    turn whether any of them still has a conversation going, and on how many generation calls the
    turn takes (the most any rank needs): a rank with fewer conversations, or none left, calls the
    assistant with zero prompts (`generate([], params)`), and the backend runs its forwards in
    lockstep with the others. Only the assistant is called in lockstep: a user simulator or
    classifier on the sharded model itself is not supported.
    """
    if batch_size < 1:
        raise FicError(f"batch_size must be at least 1, got {batch_size}", field="batch_size")
    ranks = ranks or Ranks()
    step = 0
    while True:
        active = [c for c in conversations if not c.done]
        if not ranks.any(bool(active)):
            return list(conversations)
        progress.note(turn=step + 1, conversations=len(active))  # for the heartbeat of the bar around
        if on_step is not None:
            on_step(step, len(active))
        # 1. The user speaks. Only later turns of multi-turn views ask the simulator.
        asking = [c for c in active if c.needs_user_simulator()]
        picked = dict(zip(map(id, asking), user.next_turns(asking, seed=derive_seed(seed, "user"))
                          if asking else []))
        for conv in active:
            text, shard_ids, note = _compose(conv, picked.get(id(conv)))
            message = {"role": "user", "content": text}
            _grow_ids(assistant, conv, message)
            conv.messages.append(message)
            conv.revealed.extend(shard_ids)
            conv.turns.append(Turn(user=text, shard_ids=shard_ids, user_note=note, sent_at=now()))
        ready = []
        for conv in active:
            if max_context is not None and len(conv.ids) + params.max_new_tokens > max_context:
                conv.turns.pop()  # never answered; the trace ends with the last full exchange
                conv.messages.pop()
                _finish(conv, "context_full", on_finish)
            else:
                ready.append(conv)
        # 2. The assistant replies, in chunks of similar prompt length (less padding).
        ready.sort(key=lambda c: len(c.ids), reverse=True)
        for call in range(ranks.most(-(-len(ready) // batch_size))):
            chunk = ready[call * batch_size:(call + 1) * batch_size]  # empty on a rank with fewer: it idles along
            seeds = tuple(reply_seed(seed, "assistant", conv) for conv in chunk)
            with cut_short_on_sigterm():  # a reply is kept only once its call returns: none is half-written
                outputs = _generate(assistant, chunk, _with_seeds(params, seeds))
            for conv, out, reply in zip(chunk, outputs, seeds):
                turn = conv.turns[-1]
                turn.prompt_tokens = len(conv.ids) if conv.ids else 0
                turn.reply, turn.reply_tokens = out.text, len(out.token_ids)
                turn.finish_reason, turn.seed, turn.replied_at = out.finish_reason, reply, now()
                conv.ids = conv.ids + list(out.token_ids)
                conv.messages.append({"role": "assistant", "content": out.text})
        # 3. Single-turn replies are scored whatever they look like; multi-turn replies are
        # labelled and only answer attempts are extracted and scored.
        multi = [c for c in ready if c.view in MULTI_TURN_VIEWS]
        labels = dict(zip(map(id, multi), _classify(classifier, multi) if multi else []))
        for conv in ready:
            turn = conv.turns[-1]
            turn.label, turn.label_note = labels.get(id(conv), (NOT_CLASSIFIED, None))
            if turn.label in ("answer_attempt", NOT_CLASSIFIED):
                turn.answer, turn.score, turn.score_note = score_reply(conv.task, turn.reply, conv.instance, judge)
            # 4. Stop at the first correct answer, or after the reply to the last user turn.
            if stop_at_correct and turn.score is not None and turn.score >= 1.0:
                _finish(conv, "correct", on_finish)
            elif conv.everything_said():
                _finish(conv, "last_turn", on_finish)
            elif max_turns is not None and len(conv.turns) >= max_turns:
                _finish(conv, "max_turns", on_finish)
        step += 1


def now() -> str:
    """The wall-clock time to the second, in Lost in Conversation's format (`utils.date_str`)."""
    return time.strftime(TIME_FORMAT)


def score_reply(task: Any, reply: str, instance: Instance, judge: Any = None) -> tuple[str | None, float, str | None]:
    """(answer, score, note) of one reply. A model reply must never end an evaluation or a
    training run: a scorer that raises (a parse that recursed too deep, a bug in a task) gives
    score 0, with the exception named in the note, and the run goes on. A `FicError` is the
    user's to fix (a database folder missing, no sandbox) and still stops the run; so do Ctrl-C
    and SIGTERM, which are no `Exception`."""
    try:
        answer = task.extract_answer(reply)
        score, note = task.scored(reply, instance, judge)
        score = float(score)
    except FicError:
        raise
    except Exception as err:
        return None, 0.0, f"the scorer failed on this reply ({type(err).__name__}: {one_line(str(err))[:200]}); scored 0"
    if not 0.0 <= score <= 1.0:  # NaN included
        return answer, 0.0, f"the scorer returned {score!r}, not a score in [0, 1]; scored 0"
    return answer, score, note


def _classify(classifier: Any, conversations: list[Conversation]) -> list[tuple[str, str | None]]:
    """The classifier's labels; a classifier that raises on a reply (the rule classifier reads code
    and calls out of it) labels that reply an answer attempt, which is then scored (and scores 0
    if the scorer fails on it too)."""
    try:
        return classifier.classify(conversations)
    except FicError:
        raise
    except Exception:
        labels = []
        for conv in conversations:
            try:
                labels.append(classifier.classify([conv])[0])
            except FicError:
                raise
            except Exception as err:
                labels.append(("answer_attempt", f"the classifier failed on this reply ({type(err).__name__}); "
                               "taken as an answer attempt"))
        return labels


def _finish(conv: Conversation, reason: str, on_finish: Callable[[Conversation], None] | None) -> None:
    conv.done, conv.stop_reason = True, reason
    if on_finish is not None:
        on_finish(conv)


def _with_seeds(params: SamplingParams, seeds: tuple[int, ...]) -> SamplingParams:
    return SamplingParams(max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                          top_p=params.top_p, seeds=seeds)


def make_conversations(instances: Sequence[Instance], views: Sequence[str], runs: int, *,
                       view_seed: int = 0, skip: set | frozenset = frozenset(),
                       max_idle_turns: int = DEFAULT_MAX_IDLE_TURNS, prompts: str = "fic") -> list[Conversation]:
    """One conversation per (instance, view, run), except the keys in `skip` (already played).
    Each run draws its own shuffle-concat order (LiC shuffles per conversation). `prompts` is
    the prompt style every conversation is rendered in."""
    out = []
    for instance in instances:
        for view in views:
            for run in range(runs):
                if (instance.task_id, view, run) not in skip:
                    out.append(Conversation(instance, view, run, view_seed=derive_seed(view_seed, "order", run),
                                            max_idle_turns=max_idle_turns, prompts=prompts))
    return out
