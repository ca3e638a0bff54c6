"""Training variants of chat templates that rewrite history (reasoning models' templates).

Qwen3-style templates render an assistant turn one way while it is the last and another once a user
speaks after it: they drop its reasoning block, or the empty `<think>` block the last turn gets.
QwQ and DeepSeek-R1 drop reasoning from every turn and open the reply with `<think>` in the
generation prompt. Such a template breaks the prefix rule FiC's token positions rely on
(`fic.core.chat`), so when the model's own template breaks a rule, `adopt_training_template` looks
for a variant that keeps them all, checked by the same `check_template`, in this order:

1. FiC's own variant for the Qwen3 family (Qwen3, Qwen3.5, Qwen3.6, Qwen3.8): every assistant turn
   is rendered the way the template renders the last one, its reasoning block (empty or not) kept
   when a user speaks after it. Where the generation prompt then opens a reasoning block that a
   reply without reasoning cannot continue token for token (Qwen3.5 4B and larger, whose thinking
   is on by default), the variant turns thinking off with the template's own switch
   (`enable_thinking=false`): FiC's conversations carry no reasoning, and the model then answers
   as it does with thinking off.
2. TRL's training template for the family (`trl.chat_template_utils.get_training_chat_template`),
   when trl is installed: it knows more families; FiC takes it only if it passes FiC's rules.

What neither fixes is refused by the loaders that train (`fic.core.model`), with both reasons.
The variant lives in memory only: checkpoints keep the model folder's own tokenizer files
(`fic.training.checkpoints.copy_tokenizer`), and every FiC stage that loads them adopts the same
variant again, so a model is trained and evaluated on one rendering.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fic.core.chat import check_template
from fic.core.optional import installed

# Qwen3-family conditions that render an assistant turn by its position: after the last user query
# (Qwen3, Qwen3.5, the `preserve_thinking` templates), and Qwen3's extra "last turn, or reasoning".
_POSITIONAL = (re.compile(r"loop\.index0\s*>\s*ns\.last_query_index"),
               re.compile(r"loop\.last\s+or\s+\(\s*not\s+loop\.last\s+and\s+reasoning_content\s*\)"))
THINKING_OFF = "{%- set enable_thinking = false %}\n"  # the Qwen templates' own switch, fixed

NOTE_ATTRIBUTE = "fic_template_note"  # set on a tokenizer whose template FiC replaced (see template_note)
PROBLEM_ATTRIBUTE = "fic_template_problems"  # set when no variant fixed it: [own problem, why not each]


@dataclass(frozen=True)
class Variant:
    """A training template: its text, whose it is, and what it changes."""

    template: str
    by: str
    changes: str


def fic_variants(template: str) -> list[Variant]:
    """FiC's own variants of `template`, in the order they are tried (none for a template that is
    not of the Qwen3 family)."""
    kept = template
    for pattern in _POSITIONAL:
        kept = pattern.sub("true", kept)
    if kept == template:
        return []
    history = "every assistant turn rendered as the last one is, its reasoning block kept in later turns"
    variants = [Variant(kept, "FiC", history)]
    if "enable_thinking" in kept:
        variants.append(Variant(THINKING_OFF + kept, "FiC", history + "; thinking off (enable_thinking=false), as "
                                "FiC's replies carry no reasoning and the generation prompt would open a block they "
                                "cannot continue token for token"))
    return variants


def trl_variant(tokenizer: Any) -> Variant | None:
    """TRL's training template for this tokenizer's family, when trl is installed and knows it."""
    if not installed("trl"):
        return None
    from trl.chat_template_utils import get_training_chat_template  # optional: only where trl is installed

    try:
        template = get_training_chat_template(tokenizer)
    except Exception:  # TRL says "not supported" with ValueError; a template it cannot render may raise anything
        return None
    if not template:
        return None
    return Variant(template, "TRL", "TRL's training template for the family (trl.chat_template_utils)")


def _own_template(tokenizer: Any) -> str:
    template = tokenizer.chat_template
    return template.get("default", "") if isinstance(template, dict) else template


def _with_template(tokenizer: Any, template: str) -> list[str]:
    """check_template's problems with `template` in place of the tokenizer's own (which is put back)."""
    own = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        return check_template(tokenizer)
    finally:
        tokenizer.chat_template = own


def adopt_training_template(tokenizer: Any) -> str | None:
    """Give `tokenizer` a chat template FiC can train on: its own when it keeps FiC's rules, else the
    first variant that does (FiC's, then TRL's). Returns the note that says which and why (None for
    the model's own), also kept on the tokenizer (`template_note`). When nothing passes, the template
    stays as it is and the problems are kept for the loaders that must refuse it (`template_problems`)."""
    if getattr(tokenizer, NOTE_ATTRIBUTE, None):  # adopted already
        return getattr(tokenizer, NOTE_ATTRIBUTE)
    problems = check_template(tokenizer)
    if not problems or not getattr(tokenizer, "chat_template", None):
        setattr(tokenizer, PROBLEM_ATTRIBUTE, problems)
        return None
    own = _own_template(tokenizer)
    tried = []
    candidates = fic_variants(own)
    trl = trl_variant(tokenizer)
    if trl is not None and all(trl.template != c.template for c in candidates):
        candidates.append(trl)
    for variant in candidates:
        failed = _with_template(tokenizer, variant.template)
        if not failed:
            tokenizer.chat_template = variant.template
            note = (f"chat template: {variant.by}'s training variant ({variant.changes}), because the model's own "
                    f"breaks FiC's rules: {_short(problems[0])}")
            setattr(tokenizer, NOTE_ATTRIBUTE, note)
            setattr(tokenizer, PROBLEM_ATTRIBUTE, [])
            return note
        tried.append(f"{variant.by}'s variant ({variant.changes}) fails too: {_short(failed[0])}")
    if not candidates:
        tried.append("neither FiC nor TRL has a training variant for it" if installed("trl") else
                     "FiC has no training variant for it (TRL's, which cover more families, need trl installed)")
    setattr(tokenizer, PROBLEM_ATTRIBUTE, [problems[0], *tried])
    return None


def template_note(tokenizer: Any) -> str | None:
    """What `adopt_training_template` said about this tokenizer: None where the model's own template is used."""
    return getattr(tokenizer, NOTE_ATTRIBUTE, None)


def template_problems(tokenizer: Any) -> list[str]:
    """Why no template of this tokenizer can be trained on ([] when one can): the model's own
    template's problem, then why each variant tried fails too."""
    if not hasattr(tokenizer, PROBLEM_ATTRIBUTE):
        adopt_training_template(tokenizer)
    return list(getattr(tokenizer, PROBLEM_ATTRIBUTE))


def _short(problem: str) -> str:
    """A problem sentence without the long explanation of why the rule matters (the first one says it)."""
    return problem.split(". FiC builds loss masks", 1)[0]
