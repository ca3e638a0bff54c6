"""What every task provides. Subclasses override the prompts, validation and scoring."""

from __future__ import annotations

from typing import Any, Callable

from fic.errors import FicError
from fic.instance import Instance, as_instance

ErrorFactory = Callable[..., FicError]  # error(message, field) -> FicError naming file and record


class Task:
    name: str = ""
    system_prompt: str = "You are a helpful assistant."
    required_fields: tuple[str, ...] = ()

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        """Raise `error(message, field)` for a missing or malformed task key."""
        for key in self.required_fields:
            value = fields.get(key)
            if not isinstance(value, str) or not value.strip():
                raise error(f"missing or empty; the {self.name} task needs it as text", key)

    def full_prompt(self, instance: Instance | dict) -> str:
        """The original, fully specified single-turn instruction."""
        raise NotImplementedError

    def concat_prompt(self, shard_texts: list[str]) -> str:
        """All shards in one turn as a bullet list, as in Lost in Conversation's concat view."""
        return "".join(f"- {text}\n" for text in shard_texts).rstrip("\n")

    def extract_answer(self, text: str) -> str | None:
        """The answer part of a reply, or None when the reply holds no answer."""
        raise NotImplementedError

    def score(self, text: str, instance: Instance | dict) -> float:
        """Score a reply in [0, 1] against the instance's reference."""
        raise NotImplementedError

    def reference_answer(self, instance: Instance | dict) -> str:
        """The gold final answer, as a short string."""
        raise NotImplementedError

    def gold_reply(self, instance: Instance | dict) -> str:
        """A complete assistant reply: the worked solution ending in the task's answer format."""
        raise NotImplementedError

    @staticmethod
    def _instance(instance: Instance | dict) -> Instance:
        return as_instance(instance)
