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

A chat template is code from the model folder, so its rendering is bounded: at most
`RENDER_SECONDS` a conversation (in the main thread, where a timer can interrupt it; one
arithmetic operation on huge numbers is not interrupted), at most `MAX_RENDER_MEMORY` of memory
taken while it renders (on Linux, the address space's limit raised that far above what the
process holds, for the render only: a `'x' * 3000000000` or output built faster than the timer
fires is refused as it allocates) and at most `MAX_RENDER_CHARS` of output, checked before the
tokenizer reads it. A template that loops, recurses without end,
overflows or does not parse is a `TemplateError` naming the model folder (and the record it was
rendering, where there is one); one that cannot take a record's values names the record.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from time import monotonic as _monotonic
from typing import Any, Iterator, Sequence

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
RENDER_SECONDS = 10.0         # one conversation renders in milliseconds
MAX_RENDER_CHARS = 64 << 20   # 2**24 tokens (the longest context a setting allows) at 4 characters a token
MAX_RENDER_MEMORY = 1 << 30   # bytes a render may take: MAX_RENDER_CHARS as 4-byte characters, four times over


class TemplateError(FicError):
    """The chat template breaks a rule FiC relies on (see the module docstring), or cannot render a
    conversation. `broken`: the template itself is at fault whatever the conversation (it loops,
    recurses without end, overflows the output bound or does not parse), so the error names the
    model folder, not the record."""

    broken = False


def _broken(message: str, folder: str | None) -> TemplateError:
    err = TemplateError(message, path=folder)
    err.broken = True
    return err


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


def render_text(tokenizer: Any, messages: list[dict], generation_prompt: bool, tools: list[dict] | None = None) -> str:
    """The chat template's text for one conversation (already passed through `_template_messages`),
    rendered under the time, memory and output bounds of the module's note: a template at fault
    whatever the conversation is a `TemplateError` with `broken` set, naming the model folder."""
    folder = getattr(tokenizer, "name_or_path", None) or None
    try:
        with _time_bound(RENDER_SECONDS), _memory_bound(MAX_RENDER_MEMORY):
            text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                 add_generation_prompt=generation_prompt)
    except _RenderTimeout:
        raise _broken(f"the chat template did not render a conversation of {len(messages)} messages within "
                      f"{RENDER_SECONDS:g} s (a loop that does not end?)", folder) from None
    except MemoryError:
        raise _broken(f"the chat template took more than {MAX_RENDER_MEMORY >> 20:,} MiB of memory to render a "
                      f"conversation of {len(messages)} messages (a string built without end?)", folder) from None
    except (ValueError, TypeError, OverflowError, RecursionError, jinja2.TemplateError) as err:
        # OverflowError: a `range` past the sandbox's bound. Nesting without end or no parse is the
        # template's own fault; a value it cannot handle (a number as content) may be the record's.
        if isinstance(err, jinja2.TemplateSyntaxError):
            raise _broken(f"the chat template is not valid Jinja (line {err.lineno}: {one_line(err.message or '')[:300]})",
                          folder) from None
        message = f"the chat template cannot render this conversation: {one_line(err)[:300]}"
        if isinstance(err, RecursionError):
            raise _broken(message, folder) from None
        raise TemplateError(message, path=folder) from None
    if not isinstance(text, str) or len(text) > MAX_RENDER_CHARS:
        what = f"{len(text):,} characters, more than the {MAX_RENDER_CHARS:,}" if isinstance(text, str) else \
            f"a {type(text).__name__}, not text;"
        raise _broken(f"the chat template rendered a conversation of {len(messages)} messages as {what} FiC "
                      "reads", folder)
    return text


def _render(tokenizer: Any, messages: list[dict], generation_prompt: bool,
            tools: list[dict] | None) -> tuple[str, list[int]]:
    """Template text and its ids for one conversation (already passed through `_template_messages`)."""
    text = render_text(tokenizer, messages, generation_prompt, tools)
    return text, _token_ids(tokenizer(text, add_special_tokens=False))


def record_error(err: FicError, source: str, record: int) -> FicError:
    """The error of rendering record `record` of the data file `source`: a broken template
    (`TemplateError.broken`) names the model folder, with the record it was rendering; anything
    else (a message without a role, content the template cannot take) names the file and the record."""
    if isinstance(err, TemplateError) and err.broken:
        return _broken(f"{err.message} (rendering record {record} of {source})", err.path)
    return FicError(err.message, path=source, record=record, field=err.field or "messages")


@contextlib.contextmanager
def _memory_bound(extra: int) -> Iterator[None]:
    """In the block, allocations past `extra` bytes more than the process's address space holds
    raise MemoryError (RLIMIT_AS's soft limit, lowered for the block and given back after; never
    above the hard limit, never looser than a limit already set). A bound for the whole process, so
    it is held only for a render: milliseconds in which no other thread allocates much. Where
    there is no such limit (not Linux), the block runs with the time and output bounds alone."""
    try:
        import resource

        with open("/proc/self/statm", "rb") as handle:
            held = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        yield
        return
    bound = held + extra
    if hard != resource.RLIM_INFINITY:
        bound = min(bound, hard)
    if soft != resource.RLIM_INFINITY and soft <= bound:
        yield  # a tighter limit is already set
        return
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class _RenderTimeout(Exception):
    """A chat template ran past `RENDER_SECONDS`."""


@contextlib.contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    """Raise `_RenderTimeout` in the block after `seconds` (a real-time timer: the template's
    Python-level loops are interrupted between bytecodes). Only the main thread gets signals;
    elsewhere the block runs unbounded. A timer set before is given back its remaining time."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise _RenderTimeout()

    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    began = _monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (_monotonic() - began), 1e-3))


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
