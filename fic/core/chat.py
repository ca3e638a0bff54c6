"""Chat rendering with training masks, token-in / token-out.

FiC never re-tokenises text a model generated. Training masks come from token positions
in one rendering of the whole conversation, and a simulated conversation grows by
appending the template's tokens for new turns to the exact ids the model produced. Both
only work when the chat template obeys three rules, which `render_chat` checks on every
conversation and `check_template` checks on a probe:

1. Prefix rule: rendering the first k messages gives a prefix of the ids of the whole
   conversation. Templates that rewrite earlier turns break it, e.g. Qwen3-style templates
   that drop `<think>` blocks from earlier assistant turns, or templates that insert the
   date or a turn count into the system prompt (`fic.core.templates` trains the first kind
   through a variant that keeps the rule).
2. Generation-prompt rule: the ids of `messages[:i]` plus the generation prompt are a
   prefix of the ids of `messages[:i+1]` when message i is the assistant's, so what the
   model sees when it generates is what it is trained on.
3. Every assistant turn contains an end-of-turn token, and it is trained: a model that
   never sees its end-of-turn token in the loss never learns to stop.

Rendered text is tokenised with `add_special_tokens=False`: the template already writes
BOS where the model wants it, and a second one would shift every position.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import jinja2

from fic.core.errors import FicError, one_line

# Tokens that close a turn in widely used chat formats: ChatML, Llama 3 (eot, and eom
# after a tool call), Phi-3, Gemma, plus end-of-document tokens, which also stop a reply.
KNOWN_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                     "<|endoftext|>", "<|end_of_text|>")

_WHY = ("FiC builds loss masks from token positions and feeds the model's own generated ids "
        "back as context, so rendering a longer conversation must only append tokens")

PROBE_CONVERSATION = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Alice has 3 apples."},
    # A reasoning block in an earlier turn exposes templates that strip it later on.
    {"role": "assistant", "content": "<think>\nNo question yet.\n</think>\n\nWhat would you like to know?"},
    {"role": "user", "content": "She buys 2 more. How many does she have?"},
    {"role": "assistant", "content": "She has 5 apples."},
]


_REASONING_CLOSE = "</think>"  # how PROBE_CONVERSATION's reasoning block ends
_REPLY_PLACEHOLDER = "reply"  # see continue_ids


class TemplateError(FicError):
    """The chat template breaks a rule FiC relies on (see the module docstring)."""


@dataclass
class Rendered:
    """One conversation as token ids with 0/1 masks of the same length.

    `assistant_mask` marks every trained assistant turn (its content and end-of-turn token,
    not the role header and not the separator after the end-of-turn token);
    `final_mask` marks only the last assistant turn.
    """

    input_ids: list[int]
    assistant_mask: list[int]
    final_mask: list[int]


def end_of_turn_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
    """Ids that end an assistant turn: the eos token, the known end-of-turn tokens this
    tokenizer has as added tokens, and the eos ids of `generation_config` if given."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    added = tokenizer.get_added_vocab()
    ids.update(added[token] for token in KNOWN_END_OF_TURN if token in added)
    if generation_config is not None and generation_config.eos_token_id is not None:
        eos = generation_config.eos_token_id
        ids.update([eos] if isinstance(eos, int) else eos)
    return ids


# --------------------------------------------------------------------------- rendering

def _template_messages(messages: Sequence[Mapping]) -> list[dict]:
    """Messages as the template sees them: FiC's own `train` key removed."""
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise FicError(f"message {index + 1} needs a 'role' string, got {message!r:.80}")
        if not isinstance(message.get("train", True), bool):
            raise FicError(f"message {index + 1}: 'train' must be true or false, got {message['train']!r}")
        out.append({key: value for key, value in message.items() if key != "train"})
    return out


def _token_ids(encoded: Any) -> list[int]:
    """A plain list of ids from whatever a tokenizer returned (list, dict, BatchEncoding)."""
    if isinstance(encoded, Mapping):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):  # a batch of one
        (encoded,) = encoded
    return [int(token) for token in encoded]


def _render(tokenizer: Any, messages: list[dict], generation_prompt: bool,
            tools: list[dict] | None) -> tuple[str, list[int]]:
    """Template text and its ids for one conversation (already passed through `_template_messages`)."""
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=generation_prompt)
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError, jinja2.TemplateError) as err:
        # OverflowError: a `range` past the sandbox's bound; the folder is named, as it is the user's
        raise TemplateError(f"the chat template cannot render this conversation: {one_line(err)[:300]}",
                            path=getattr(tokenizer, "name_or_path", None) or None) from None
    return text, _token_ids(tokenizer(text, add_special_tokens=False))


def _check_prefix(short: tuple[str, list[int]], long: tuple[str, list[int]], where: str) -> None:
    """Raise TemplateError unless the ids of `short` are a prefix of the ids of `long`."""
    (short_text, short_ids), (long_text, long_ids) = short, long
    if long_ids[:len(short_ids)] == short_ids:
        return
    if long_text.startswith(short_text):
        reason = ("the text is a prefix but the tokens are not: the tokenizer merges characters "
                  "across the turn boundary (e.g. a message starting with whitespace the template "
                  "already ends with, or a template/tokenizer pair that tokenises '\\n\\n' "
                  "differently at the end of the text)")
    else:
        at = next((k for k, (a, b) in enumerate(zip(short_text, long_text)) if a != b),
                  min(len(short_text), len(long_text)))
        reason = (f"the template changes earlier text: {short_text[max(0, at - 30):at + 30]!r} "
                  f"becomes {long_text[max(0, at - 30):at + 30]!r}")
    raise TemplateError(f"chat template breaks the prefix rule at {where}: {reason}. {_WHY}; "
                        "templates that rewrite earlier turns (e.g. Qwen3-style removal of <think> "
                        "from earlier assistant turns, or dates and turn counts in the system prompt) "
                        "cannot be used as they are")


def _assistant_span(tokenizer: Any, messages: list[dict], index: int, full: tuple[str, list[int]],
                    tools: list[dict] | None, eot: set[int]) -> tuple[int, int]:
    """Token range [start, end) of assistant message `index` inside `full`: from just after
    the generation prompt to its last end-of-turn token, inclusive."""
    where = f"message {index + 1} (assistant)"
    head = _render(tokenizer, messages[:index], True, tools)
    upto = _render(tokenizer, messages[:index + 1], False, tools)
    _check_prefix(head, upto, f"{where}: the generation prompt is not how the template starts this turn")
    _check_prefix(upto, full, f"{where}: later messages change how it is rendered")
    start, stop = len(head[1]), len(upto[1])
    if start == stop:
        raise TemplateError(f"the chat template renders {where} as no tokens at all, so its assistant "
                            "mask would be empty")
    closes = [k for k in range(start, stop) if full[1][k] in eot]
    if not closes:
        names = ", ".join(sorted(tokenizer.convert_ids_to_tokens(sorted(eot)))) or "none known"
        raise TemplateError(f"the chat template renders {where} without an end-of-turn token "
                            f"(expected one of: {names}); a model trained on it never learns to stop")
    return start, closes[-1] + 1


def render_chat(tokenizer: Any, messages: Sequence[Mapping], *, tools: list[dict] | None = None) -> Rendered:
    """Render a conversation to ids with assistant and final-turn masks, checking the rules.

    A message with `"train": False` stays in the context but out of both masks; the final
    assistant turn must be trained. A conversation without assistant turns gets all-zero
    masks. Raises TemplateError when the template breaks a rule, naming the turn.
    """
    msgs = _template_messages(messages)
    full = _render(tokenizer, msgs, False, tools)
    ids = full[1]
    assistant_mask, final_mask = [0] * len(ids), [0] * len(ids)
    turns = [i for i, message in enumerate(msgs) if message["role"] == "assistant"]
    if not turns:
        return Rendered(ids, assistant_mask, final_mask)
    trained = [i for i in turns if messages[i].get("train", True)]
    if not trained:
        raise FicError("every assistant turn has train: false, so there is nothing to train on")
    if trained[-1] != turns[-1]:
        raise FicError(f"the final assistant turn (message {turns[-1] + 1}) has train: false; "
                       "train: false is for earlier turns kept only as context")
    eot = end_of_turn_ids(tokenizer)
    for index in turns:
        start, end = _assistant_span(tokenizer, msgs, index, full, tools, eot)
        if index in trained:
            assistant_mask[start:end] = [1] * (end - start)
        if index == turns[-1]:
            final_mask[start:end] = [1] * (end - start)
    return Rendered(ids, assistant_mask, final_mask)


def reply_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids the template writes for an assistant reply `text` right after its generation prompt:
    the content and the end-of-turn token, exactly the span `render_chat` trains."""
    rendered = render_chat(tokenizer, [{"role": "user", "content": "."}, {"role": "assistant", "content": text}])
    return [i for i, m in zip(rendered.input_ids, rendered.final_mask) if m]


def prompt_ids(tokenizer: Any, messages: Sequence[Mapping], *, tools: list[dict] | None = None) -> list[int]:
    """Ids of the conversation followed by the generation prompt, ready for the assistant's reply."""
    return _render(tokenizer, _template_messages(messages), True, tools)[1]


def continue_ids(tokenizer: Any, messages: Sequence[Mapping], ids: Sequence[int],
                 new_messages: Sequence[Mapping], *, tools: list[dict] | None = None) -> list[int]:
    """Extend the exact ids of a conversation with new messages and the generation prompt.

    `ids` are the ids the conversation really has so far: prompt ids plus the model's own
    generated ids for its replies. `messages` is the same conversation as text. The rule:

    - B = ids of `messages` as the template renders them, E = ids of
      `messages + new_messages` with the generation prompt; B must be a prefix of E, and
      `delta = E[len(B):]` (the new turns and the generation prompt).
    - If `messages` ends with an assistant turn, B ends with that turn's closing: its last
      end-of-turn token t and the separator s the template writes after it ("\\n" for
      ChatML, nothing for Llama 3). The model stops at its own end-of-turn token, so when
      `ids` ends with an end-of-turn token the result is `ids + s + delta`; when the reply
      was cut off (no end-of-turn token at the end of `ids`) the turn is closed the way the
      template closes it: `ids + t + s + delta`.
    - Otherwise the result is `ids + delta`.

    When the model's ids equal the tokenisation of its text, the result equals
    `prompt_ids(messages + new_messages)`.

    Earlier assistant turns are rendered with a placeholder text: only the template's turn
    markup matters here, and a noisy reply that would re-tokenise differently at the turn
    boundary (leading newlines, odd whitespace) must not break the prefix check, since its
    text never enters the ids anyway.
    """
    msgs = [{**m, "content": _REPLY_PLACEHOLDER} if m["role"] == "assistant" else m
            for m in _template_messages(messages)]
    new = _template_messages(new_messages)
    base = _render(tokenizer, msgs, False, tools)
    extended = _render(tokenizer, msgs + new, True, tools)
    _check_prefix(base, extended, f"message {len(msgs) + 1}: adding new messages changes earlier ones")
    delta = extended[1][len(base[1]):]
    if msgs and msgs[-1]["role"] == "assistant":
        eot = end_of_turn_ids(tokenizer)
        _start, end = _assistant_span(tokenizer, msgs, len(msgs) - 1, base, tools, eot)
        closing = base[1][end - 1:]  # t + s
        delta = (closing[1:] if ids and ids[-1] in eot else closing) + delta
    return list(ids) + delta


_USER_TEXT_MARK = "[fic: the user text starts here]"  # see user_turn_ids


def user_turn_ids(tokenizer: Any, messages: Sequence[Mapping], *, tools: list[dict] | None = None) -> list[int]:
    """Ids of the conversation followed by the opening of a *user* turn, so that the model
    continues under the user role (the interaction-awareness probe, `fic probe`).

    Templates have no "user generation prompt", so the opening is read off the template
    itself: render the conversation plus a user message holding a marker text, and cut just
    before the marker. The earlier turns must render as they do without that message.
    """
    msgs = _template_messages(messages)
    base = _render(tokenizer, msgs, False, tools)
    text, _ = _render(tokenizer, msgs + [{"role": "user", "content": _USER_TEXT_MARK}], False, tools)
    at = text.find(_USER_TEXT_MARK)
    if at < 0:
        raise TemplateError("the chat template does not write a user message's text as given, so the "
                            "start of a user turn cannot be found")
    head = text[:at]
    head_ids = _token_ids(tokenizer(head, add_special_tokens=False))
    _check_prefix(base, (head, head_ids), f"message {len(msgs) + 1} (a new user turn)")
    return head_ids


def check_template(tokenizer: Any) -> list[str]:
    """Problems with the tokenizer's chat template, as sentences; empty when FiC can use it.

    Renders a probe conversation (system, user, assistant with a reasoning block, user,
    assistant) with and without the system message, and continues it token-in/token-out.
    """
    if not getattr(tokenizer, "chat_template", None):
        return ["the tokenizer has no chat template; FiC needs one to render conversations"]
    try:
        opening = _render(tokenizer, _template_messages(PROBE_CONVERSATION[:2]), True, None)[0]
    except TemplateError as err:
        return [str(err)]
    # A generation prompt that closes the reasoning block (thinking off) means the model's replies
    # never carry any: probing with one would test a conversation that cannot happen.
    conversation = PROBE_CONVERSATION
    if opening.rstrip().endswith(_REASONING_CLOSE):
        conversation = [{**m, "content": m["content"].rpartition(_REASONING_CLOSE)[2].lstrip("\n")} for m in conversation]
    for probe in (conversation, conversation[1:]):
        first = next(i for i, message in enumerate(probe) if message["role"] == "assistant")
        try:
            render_chat(tokenizer, probe)
            # The model's reply as it would generate it: the turn's ids up to its end-of-turn token.
            upto = render_chat(tokenizer, probe[:first + 1])
            reply_end = max(k for k, bit in enumerate(upto.final_mask) if bit) + 1
            continued = continue_ids(tokenizer, probe[:first + 1], upto.input_ids[:reply_end],
                                     probe[first + 1:first + 2])
        except TemplateError as err:
            return [str(err)]
        if continued != prompt_ids(tokenizer, probe[:first + 2]):
            return ["continuing a conversation from the model's own ids does not give the ids of the "
                    "rendered text conversation; " + _WHY]
    return []


# --------------------------------------------------------------------------- display

def format_masks(tokenizer: Any, rendered: Rendered, *, width: int = 100) -> str:
    """A plain-text view of which tokens are trained: one line per run of tokens with the
    same mask, marked [F] (final assistant turn, also in the assistant mask), [A] (other
    trained assistant turns) or [ ] (context only), with its token count. A run continues
    on the next lines after each newline (shown as a visible \\n, so whitespace the masks
    include or leave out can be seen) and when it is wider than `width`."""
    ids, assistant, final = rendered.input_ids, rendered.assistant_mask, rendered.final_mask
    lines = [f"{len(ids)} tokens: {sum(assistant)} in the assistant mask, {sum(final)} in the final mask",
             "[F] final assistant turn   [A] trained assistant turn   [ ] context, not trained"]
    text_width = max(20, width - len("[A] 12345 | "))
    start = 0
    while start < len(ids):
        key = (assistant[start], final[start])
        end = start
        while end < len(ids) and (assistant[end], final[end]) == key:
            end += 1
        mark = "[F]" if key[1] else "[A]" if key[0] else "[ ]"
        text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
        chunks = []
        for line in re.findall(r"[^\n]*\n|[^\n]+", text):
            line = line.replace("\r", "\\r").replace("\t", "\\t").replace("\n", "\\n")
            chunks.extend(line[k:k + text_width] for k in range(0, len(line), text_width))
        chunks = chunks or [""]
        lines.append(f"{mark} {end - start:>5} | {chunks[0]}")
        lines.extend(f"{mark}       | {chunk}" for chunk in chunks[1:])
        start = end
    return "\n".join(lines) + "\n"
