"""What the single-turn teacher reads before the student's reply ids: the task's system prompt and
one view of the whole request as one user turn (`teacher.view`), rendered by the chat template.
`gold-hinted` adds the reference answer after the full request (a teacher that knows what is right)."""

from __future__ import annotations

from typing import Any, Sequence

from fic import tasks
from fic.core.chat import prompt_ids
from fic.data.views import system_message, user_turns

HINT = "\n\n(For reference, the correct final answer is: {answer})"  # teacher.view: gold-hinted


def teacher_views(cfg: Any) -> list[str]:
    """The single-turn views the teacher reads (`teacher.view: both` reads two, their next-token
    distributions averaged)."""
    return ["full", "concat"] if cfg.teacher.view == "both" else [cfg.teacher.view]


def teacher_request(instance: Any, view: str) -> str:
    """The teacher's one user turn for a single-turn view; `gold-hinted` is the full view followed by
    the reference answer (`HINT`) and nothing else."""
    if view == "gold-hinted":
        return user_turns(instance, "full")[0] + HINT.format(answer=tasks.of(instance).reference_answer(instance))
    return user_turns(instance, view)[0]


def teacher_prompts(tokenizer: Any, instance: Any, views: Sequence[str]) -> list[list[int]]:
    """The teacher's prompt ids for each single-turn view: the task's system prompt, the view as
    one user turn (`teacher_request`), and the generation prompt, rendered by the chat template."""
    return [prompt_ids(tokenizer, [system_message(instance), {"role": "user", "content": teacher_request(instance, v)}])
            for v in views]
