"""A scripted backend for tests: replies come from a function, not from a model."""

from __future__ import annotations

from typing import Any, Callable

from fic.core.errors import FicError
from fic.core.generation import Generation, SamplingParams, check_prompts, stop_ids


def end_of_turn_id(tokenizer: Any) -> int:
    """The one id that closes an assistant turn: eos when it is an end-of-turn id, else the lowest."""
    ids = stop_ids(tokenizer)
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if eos in ids else min(ids)


class FunctionBackend:
    """A scripted backend for tests and dry runs: replies come from `fn`, not from a model.

    `chat()` calls `fn(messages)` for each conversation. `generate()` needs `tokenizer`: it calls
    `fn(prompt_text)` with the prompt decoded to a string (special tokens kept, so the chat
    markup is visible) and returns the reply encoded with that tokenizer plus the end-of-turn id,
    exactly what a local backend would return for that text. Replies always finish with "stop"
    unless they are cut by `max_new_tokens`; log-probs are 0.0 (the script is certain).
    """

    def __init__(self, fn: Callable[[Any], str], tokenizer: Any | None = None,
                 name: str = "function"):
        self.fn, self.tokenizer, self.name = fn, tokenizer, name

    def _reply(self, text: str, params: SamplingParams) -> Generation:
        if self.tokenizer is None:
            return Generation(token_ids=[], text=text, logprobs=[], finish_reason="stop")
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [end_of_turn_id(self.tokenizer)]
        if len(ids) > params.max_new_tokens:
            ids = ids[:params.max_new_tokens]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            return Generation(token_ids=ids, text=text, logprobs=[0.0] * len(ids), finish_reason="length")
        return Generation(token_ids=ids, text=text, logprobs=[0.0] * len(ids), finish_reason="stop")

    def chat(self, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
        return [self._reply(str(self.fn(conv)), params) for conv in conversations]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.tokenizer is None:
            raise FicError("FunctionBackend.generate needs a tokenizer to turn replies into token ids")
        check_prompts(prompts)
        texts = [self.tokenizer.decode(list(p), skip_special_tokens=False) for p in prompts]
        return [self._reply(str(self.fn(text)), params) for text in texts]
