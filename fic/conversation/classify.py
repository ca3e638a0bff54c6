"""Reply classifiers: what kind of move each assistant reply makes, as one of Lost in
Conversation's seven labels (`fic.conversation.labels.LABELS`, defined there).

- `rule` (offline, fast, deterministic): the heuristics of `fic.conversation.labels`
  (`reply_label`, which asks the task whether a structured reply commits to an answer).
- `llm`: a model reads the full task specification, the conversation and the reply (as
  LiC's classifier does) and answers with a JSON object `{"label": ...}`. When its output
  has no usable label, the rule label is used and the turn's `label_note` says so; a label
  named in plain text (no JSON) is accepted too. Under `prompts: lic` the model gets LiC's own
  classifier prompt (shard 1, the other shards, the task's answer description, the reply) and
  answers `{"response_type": ...}`, as LiC's does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from fic.conversation import lic_prompts
from fic.conversation.labels import LABELS, reply_label
from fic.core.config import setting
from fic.core.generation import Backend, BackendConfig, SamplingParams
from fic.core.parsing import find_json
from fic.tasks.lic_prompts import fill

CLASSIFIER_KINDS = ("rule", "llm")


@dataclass
class ClassifierSection:
    kind: str = setting("rule", "rule: fast offline heuristic; llm: a model labels each reply with one of the "
                        "7 LiC labels.", choices=CLASSIFIER_KINDS)
    backend: BackendConfig = setting(BackendConfig(), "The classifier model (kind llm only).")
    max_new_tokens: int = setting(64, "Most tokens of one classifier reply.", min=1)


class RuleClassifier:
    name = "rule"

    def classify(self, conversations: Sequence[Any]) -> list[tuple[str, str | None]]:
        return [(reply_label(conv.task, conv.messages[-1]["content"], _user_texts(conv)), None) for conv in conversations]


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
    task specification (as LiC's classifier gets it), what the user said, and the reply. Under
    `prompts: lic`, LiC's own classifier prompt (`lic_classifier_prompt`)."""
    if conv.prompts == "lic":
        return lic_classifier_prompt(conv)
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


def lic_classifier_prompt(conv: Any) -> list[dict]:
    """LiC's classifier prompt (`prompts/system_turn_categorization.txt`) as LiC fills it: one user
    message with shard 1, the other shards as JSON, the task's answer description, and the last
    turn (what follows the last user message: the reply). It answers `{"response_type": ...}`."""
    first, *later = conv.instance.shards
    last_user = max(i for i, m in enumerate(conv.messages) if m["role"] == "user")
    last_turn = "\n\n".join(f"[{m['role']}] {m['content']}" for m in conv.messages[last_user + 1:])
    text = fill(lic_prompts.CLASSIFIER, CONVERSATION_SO_FAR=last_turn, INITIAL_SHARD=first.shard,
                SHARDS=json.dumps([s.to_dict() for s in later]),
                ANSWER_DESCRIPTION=lic_prompts.ANSWER_DESCRIPTIONS.get(conv.instance.task, ""))
    return [{"role": "user", "content": text}]


def parse_label(text: str) -> str:
    """The label in a classifier model's reply; ValueError when there is none."""
    obj = find_json(text or "")
    if obj is not None:
        label = obj.get("label", obj.get("response_type", obj.get("classification")))  # FiC's key, LiC's
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
            id(conv): (reply_label(conv.task, conv.messages[-1]["content"] or "", _user_texts(conv)), None)
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
                labels[id(conv)] = (reply_label(conv.task, reply, _user_texts(conv)), f"rule label used: {err}")
        return [labels[id(conv)] for conv in conversations]


def make_classifier(kind: str, backend: Backend | None = None, **kwargs: Any):
    if kind == "rule":
        return RuleClassifier()
    if kind == "llm":
        if backend is None:
            raise ValueError("the llm classifier needs a backend")
        return LLMClassifier(backend, **kwargs)
    raise ValueError(f"unknown classifier {kind!r}")
