"""Generated `actions` instances with a shape a test needs."""

from __future__ import annotations

from fic import tasks
from fic.core.instance import Instance
from fic.data.action_templates import SEEN
from fic.data.actions_gen import generate


def late_optional_instance():
    """A generated actions instance whose last shard is an optional argument, said after every
    required one (two required at least): the request is answerable a turn before its end."""
    templates = {t.name: t for t in SEEN}
    task = tasks.get("actions")
    for record in generate("train", 200, seed=0):
        instance = Instance.from_dict(record)
        (name, _), = record["reference_answer"][0].items()
        required = {p.name for p in templates[name].params if p.required}
        order = [task.params_named(text, set(), instance)[0] for text in instance.shard_texts[1:]]
        if len(required) >= 2 and order[-1] not in required and required <= set(order[:-1]):
            return instance, order, required
    raise AssertionError("no such instance in 200")
