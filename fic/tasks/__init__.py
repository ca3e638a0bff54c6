"""The task registry: `fic.tasks.get(name)` returns the object that knows a task.

A task supplies its system prompt, how to render the full and concat prompts of an
instance, how to validate its LiC keys, how to extract and score an answer, and the gold
reply used for SFT. New tasks (database, actions, code) plug in with `register(task)`
without touching the core.
"""

from __future__ import annotations

from collections.abc import Iterable

from fic.core.errors import FicError
from fic.core.optional import installed, missing
from fic.tasks.actions import ActionsTask
from fic.tasks.base import Task
from fic.tasks.code import CodeTask
from fic.tasks.database import DatabaseTask
from fic.tasks.math import MathTask
from fic.tasks.text import Data2TextTask, SummaryTask, TranslationTask

_REGISTRY: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add a task under `task.name`; registering a name twice is a programming error."""
    if task.name in _REGISTRY:
        raise ValueError(f"task {task.name!r} is already registered")
    _REGISTRY[task.name] = task
    return task


def get(name: str) -> Task:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise FicError(f"unknown task {name!r}; known tasks: {', '.join(names())}") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def check_scoring(task_names: Iterable[str], field: str | None = None) -> None:
    """Refuse, naming the extra to install, when a task in `task_names` is scored with a module that
    is not installed: a stage that scores calls this before any model loads (and in --dry-run)."""
    for name in sorted(set(task_names)):
        for module in get(name).scoring_needs:
            if not installed(module):
                raise missing(module, f"scoring the {name} task", field=field)


register(MathTask())
register(DatabaseTask())
register(CodeTask())
register(Data2TextTask())
register(TranslationTask())
register(SummaryTask())
register(ActionsTask())

__all__ = ["Task", "check_scoring", "get", "names", "register"]
