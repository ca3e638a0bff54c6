"""User simulators: who decides what the user says at turns 2.. of a multi-turn view.

Turn 1 of every multi-turn conversation is shard 1 verbatim (decided by the simulator in
`fic.conversation.simulator`, as in Lost in Conversation). Later turns reveal at most one more shard:

- `verbatim`: the next unrevealed shard in shard-id order, word for word. Deterministic, no
  model; with it the turns equal `fic.data.views.user_turns`.
- `llm`: a model plays the user under the LiC rules (written here in our own words): reveal
  at most one unrevealed shard per turn, the one most relevant to the assistant's last
  message; rephrase it briefly and casually without dropping or adding information; to a
  question no unrevealed shard answers, reply briefly that you don't know and reveal nothing
  (shard id -1, as in LiC); never ask questions, never solve the task; reply with a JSON
  object `{"response": ..., "shard_id": ...}`. All conversations that need a user turn are
  answered in one batched `chat` call. How many turns may reveal nothing is bounded by the
  simulator (`max_idle_turns`).

A model's reply that is not usable (no JSON object, missing or wrong-typed keys, a shard that
does not exist or was already revealed, a rephrasing that drops a value of its shard, or a
message that gives away a value of a shard not revealed yet, checked with the task's
`values_in`) never stops the evaluation: the user falls back to the verbatim next shard and
the turn's `user_note` in the log says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from fic.conversation import lic_prompts
from fic.conversation.simulator import NOTHING, UserTurn
from fic.core.bounds import MAX_REPEATS
from fic.core.config import setting
from fic.core.generation import Backend, BackendConfig, SamplingParams
from fic.core.parsing import find_json
from fic.core.seeding import reply_seed
from fic.data.views import shard_turn
from fic.tasks.lic_prompts import fill

USER_KINDS = ("verbatim", "llm")


@dataclass
class UserSimulatorSection:
    kind: str = setting("verbatim", "verbatim: reveal shards in order, word for word (no model); llm: a model "
                        "plays the user under the LiC rules.", choices=USER_KINDS)
    backend: BackendConfig = setting(BackendConfig(), "The user model (kind llm only).")
    temperature: float = setting(1.0, "Sampling temperature of the user model.", min=0.0, unbounded="a sampling temperature: logits are divided by it")
    max_new_tokens: int = setting(256, "Most tokens of one user-model reply.", min=1)
    max_idle_turns: int = setting(3, "User turns per conversation that may reveal nothing (LiC's \"I don't "
                                  "know\" to a question no shard answers); after that many the next shard is "
                                  "revealed verbatim, so a conversation has at most shards + this many user "
                                  "turns (kind llm; the verbatim user always reveals one).", min=0,
                                  max=MAX_REPEATS)

USER_RULES = """\
You are role-playing a person who asks an AI assistant for help with a task. You know the whole \
task, but you tell it to the assistant a little at a time: the task is cut into numbered pieces \
("shards"), and some are already revealed. Write the user's next message.

Rules:
1. Reveal at most one shard that has not been revealed yet. Pick the one most relevant to the \
assistant's last message: if the assistant asked about something a shard answers, reveal that \
shard; if it asked nothing in particular, pick the one that follows most naturally.
2. Say it in your own words, short and casual, the way people type to a chatbot. Keep every \
detail of the shard (numbers, names, units); do not add anything that is not in it, and say \
nothing from the other shards that are not revealed yet.
3. If the assistant asked about something that no unrevealed shard covers, reply briefly that you \
don't know (e.g. "I don't know, sorry") and reveal nothing: use shard_id -1.
4. Never ask the assistant questions, never solve the task, never comment on whether the \
assistant's answer is right.
5. Reply with only a JSON object, nothing else: {"response": "<your message>", "shard_id": <id or -1>}"""

MAX_REPLY_CHARS = 1500  # long assistant replies are cut in the user's transcript to bound the prompt


class VerbatimUser:
    """Reveals the next shard in order, word for word."""

    name = "verbatim"

    def next_turns(self, conversations: Sequence[Any], seed: int = 0) -> list:
        return [UserTurn(shard_turn(conv.instance, conv.unrevealed[0], conv.prompts), conv.unrevealed[0])
                for conv in conversations]


class LLMUser:
    """A model that plays the user under the LiC rules; see the module docstring."""

    name = "llm"

    def __init__(self, backend: Backend, *, temperature: float = 1.0, max_new_tokens: int = 256):
        self.backend, self.temperature, self.max_new_tokens = backend, temperature, max_new_tokens

    def next_turns(self, conversations: Sequence[Any], seed: int = 0) -> list:
        # Tasks whose turns LiC sends as written (translation, summary, data2text) need no model.
        fixed = {id(conv): turn for conv, turn in zip(conversations, VerbatimUser().next_turns(conversations))
                 if conv.task.fixed_turns}
        asking = [conv for conv in conversations if id(conv) not in fixed]
        # Each conversation's turn from its own seed (see fic.conversation.simulator): not the batch's.
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                seeds=tuple(reply_seed(seed, "user", conv) for conv in asking))
        outputs = self.backend.chat([user_prompt(conv) for conv in asking], params) if asking else []
        for conv, out in zip(asking, outputs):
            try:
                text, shard_id = parse_user_reply(out.text, conv)
                fixed[id(conv)] = UserTurn(text, shard_id)
            except ValueError as err:
                fixed[id(conv)] = UserTurn(shard_turn(conv.instance, conv.unrevealed[0], conv.prompts),
                                           conv.unrevealed[0], note=f"fallback to verbatim: {err}")
        return [fixed[id(conv)] for conv in conversations]


def _shard(conv: Any, shard_id: int):
    return next(s for s in conv.instance.shards if s.shard_id == shard_id)


def user_prompt(conv: Any) -> list[dict]:
    """The chat messages that ask the user model for its next turn (under `prompts: lic`, LiC's
    own user-simulator prompt)."""
    if conv.prompts == "lic":
        return lic_user_prompt(conv)
    revealed = [s for s in conv.instance.shards if s.shard_id in conv.revealed]
    hidden = [s for s in conv.instance.shards if s.shard_id not in conv.revealed]
    lines = ["Shards already revealed:"]
    lines += [f"- shard {s.shard_id}: {s.shard}" for s in revealed] or ["- (none)"]
    lines += ["", "Shards not revealed yet (pick at most one; -1 for none):"]
    lines += [f"- shard {s.shard_id}: {s.shard}" for s in hidden]
    lines += ["", "Conversation so far:"]
    for message in conv.messages:
        if message["role"] == "system":
            continue
        content = message["content"] or ""
        if message["role"] == "assistant" and len(content) > MAX_REPLY_CHARS:
            content = content[:MAX_REPLY_CHARS] + " [...]"
        lines.append(f"[{message['role']}] {content}")
    lines += ["", 'Write the user\'s next message as JSON: {"response": "...", "shard_id": N}']
    return [{"role": "system", "content": USER_RULES}, {"role": "user", "content": "\n".join(lines)}]


def lic_user_prompt(conv: Any) -> list[dict]:
    """LiC's user-simulator prompt (`prompts/user_agent.txt`) as LiC fills it: one user message
    with the conversation so far (no system prompt, replies not cut) and the shards after the
    first as JSON, revealed and not."""
    later = conv.instance.shards[1:]
    talk = "\n\n".join(f"[{m['role']}] {m['content']}" for m in conv.messages if m["role"] in ("user", "assistant"))
    text = fill(
        lic_prompts.USER_AGENT, CONVERSATION_SO_FAR=talk,
        SHARDS_REVEALED=json.dumps([s.to_dict() for s in later if s.shard_id in conv.revealed]),
        SHARDS_NOT_REVEALED=json.dumps([s.to_dict() for s in later if s.shard_id not in conv.revealed]))
    return [{"role": "user", "content": text}]


def parse_user_reply(text: str, conv: Any) -> tuple[str, int]:
    """(message, shard_id) from a user model's reply; ValueError with the reason when unusable."""
    obj = find_json(text or "")
    if obj is None:
        raise ValueError("no JSON object in the user model's reply")
    response, shard_id = obj.get("response"), obj.get("shard_id")
    if not isinstance(response, str) or not response.strip():
        raise ValueError("'response' missing or not a non-empty string")
    if isinstance(shard_id, str) and shard_id.strip().lstrip("-").isdigit():
        shard_id = int(shard_id)
    if isinstance(shard_id, bool) or not isinstance(shard_id, int):
        raise ValueError(f"'shard_id' is not an integer: {shard_id!r:.40}")
    if shard_id != NOTHING and shard_id not in conv.shard_ids:
        raise ValueError(f"shard_id {shard_id} does not exist")
    if shard_id in conv.revealed:
        raise ValueError(f"shard_id {shard_id} was already revealed")
    task, instance = conv.task, conv.instance
    said = set(task.values_in(response, instance))
    if shard_id != NOTHING:
        lost = set(task.values_in(_shard(conv, shard_id).shard, instance)) - said
        if lost:
            raise ValueError(f"the rephrasing drops value(s) {', '.join(sorted(map(str, lost)))} of shard {shard_id}")
    # A value the user may say: one of this shard or of a shard already revealed. A value that
    # only a shard still hidden holds would reveal two shards at once (or one under id -1).
    allowed = set().union(*(task.values_in(s.shard, instance) for s in conv.instance.shards
                            if s.shard_id in conv.revealed or s.shard_id == shard_id))
    hidden = {value: s.shard_id for s in conv.instance.shards if s.shard_id not in conv.revealed
              and s.shard_id != shard_id for value in task.values_in(s.shard, instance)}
    leaked = sorted({value for value in said - allowed if value in hidden}, key=str)
    if leaked:
        shards = sorted({hidden[value] for value in leaked})
        raise ValueError(f"the message gives away value(s) {', '.join(map(str, leaked))} of shard(s) "
                         f"{', '.join(map(str, shards))}, not revealed yet")
    return response.strip(), shard_id


def make_user(kind: str, backend: Backend | None = None, **kwargs: Any):
    if kind == "verbatim":
        return VerbatimUser()
    if kind == "llm":
        if backend is None:
            raise ValueError("the llm user simulator needs a backend")
        return LLMUser(backend, **kwargs)
    raise ValueError(f"unknown user simulator {kind!r}")
