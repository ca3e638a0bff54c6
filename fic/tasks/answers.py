"""How a structured reply shows that it commits to no answer yet: the answer is a template
(placeholders in it), or the words before it present it as an example, a form to fill in, or
what the answer will be once the user says more. The structured tasks (calls, code, SQL) use
these in `Task.committed_answer`; the rule classifier (`fic.conversation.labels`) reads the same
waiting words in prose replies.
"""

from __future__ import annotations

import re

# Words that say the reply is waiting for the user before it can answer.
WAITING = re.compile(
    r"\b(?:once (?:you(?:'ve| have)? (?:tell|told|give|gave|given|share|shared|send|sent|provide|provided|let|"
    r"confirm|confirmed|clarify|clarified)|I (?:have|know|get|hear|receive))|"
    r"as soon as (?:you|I (?:have|know|get))|when you (?:tell|give|share|send|provide|let)|"
    r"after you (?:tell|give|share|send|provide)|wait(?:ing)? for (?:the|your|more|you)|hold off|"
    r"before I can|(?:can(?:no|')?t|unable to) (?:finish|complete|solve|answer|compute|calculate)(?: this| it| the)? "
    r"yet|not enough to (?:solve|answer|compute|calculate))\b",
    re.IGNORECASE)
# A structured answer that is no answer: a template (placeholders in it, "<city>",
# "YYYY-MM-DD", "..."), or one the words before it present as an example, a form to fill in,
# or what the answer will be once the user says more ("Once you tell me the date, the call
# would be ...").
TEMPLATE_FRAMING = re.compile(
    r"\b(?:for example|for instance|e\.g\.|template|skeleton|placeholders?|would look (?:something )?like|"
    r"something like|general (?:form|structure|shape)|(?:structure|format) (?:would be|is|looks like)|"
    r"fill in|stub)\b", re.IGNORECASE)
PLACEHOLDER = re.compile(
    r"^\s*(?:<[^<>]*>|\{[^{}]*\}|\[[^\[\]]*\]|\.{3}|…|\?+|_+|x{2,}|tbd|todo|unknown|placeholder|"
    r"your[_ ]\w+|\w+_here)\s*$|YYYY|MM-DD|HH:MM", re.IGNORECASE)


def framed_as_template(text: str, start: int) -> bool:
    """Whether the words just before position `start` (the answer's start) present it as an
    example, a form to fill in, or what the answer will be once the user says more."""
    before = text[max(0, start - 200):start]
    return TEMPLATE_FRAMING.search(before) is not None or WAITING.search(before) is not None


def is_placeholder(value: object) -> bool:
    """Whether a value in an answer is a slot to fill ("<city>", "YYYY-MM-DD", "...", "???")."""
    if isinstance(value, str):
        return PLACEHOLDER.search(value) is not None
    if isinstance(value, (list, tuple)):
        return any(is_placeholder(v) for v in value)
    if isinstance(value, dict):
        return any(is_placeholder(v) for v in value.values())
    return False
