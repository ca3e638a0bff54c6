"""The one in-memory type for a task instance, in the Lost-in-Conversation (LiC) schema.

A record on disk is `{"task_id", "task", "shards": [{"shard_id", "shard"}], ...task keys}`.
Every data source produces `Instance`s carrying the task's LiC keys (for math: `question`
and `answer`), so sharded and not-yet-sharded instances from any source are interchangeable
downstream. `Instance.from_dict(d).to_dict() == d` for every valid record.

This module is plain data: it checks the LiC structure (ids, shards) only. Whether the task
exists and its own keys are right is checked where records are read (`fic.data.sources`), so that
the task registry can import this module without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fic.core.errors import FicError


@dataclass
class Shard:
    shard_id: int
    shard: str
    extra: dict[str, Any] = field(default_factory=dict)  # other keys LiC keeps per shard (e.g. doc_idxs)

    def to_dict(self) -> dict:
        return {"shard_id": self.shard_id, "shard": self.shard, **self.extra}


@dataclass
class Instance:
    task_id: str
    task: str
    shards: list[Shard]
    fields: dict[str, Any] = field(default_factory=dict)  # the task's own LiC keys, kept as they came
    # The `fic.tasks.Task` that `task` names, resolved once (by the loader, else on first use:
    # `fic.tasks.of`) and carried from then on; not part of the record. Typed Any: the core sits
    # below the task registry.
    resolved_task: Any = field(default=None, repr=False, compare=False)

    @property
    def is_sharded(self) -> bool:
        return bool(self.shards)

    @property
    def shard_texts(self) -> list[str]:
        return [s.shard for s in self.shards]

    def to_dict(self) -> dict:
        record: dict[str, Any] = {"task_id": self.task_id, "task": self.task}
        if self.shards:
            record["shards"] = [s.to_dict() for s in self.shards]
        record.update(self.fields)
        return record

    @classmethod
    def from_dict(cls, record: dict, *, path: str | None = None, record_no: int | None = None,
                  require_shards: bool = True, default_task: str | None = None) -> Instance:
        """Check a LiC-schema dict's structure and build an Instance; errors name the file,
        record and field. Task keys are not checked here (see `fic.data.sources.read_instance`)."""
        def error(message: str, field_name: str | None = None) -> FicError:
            return FicError(message, path=path, record=record_no, field=field_name)

        if not isinstance(record, dict):
            raise error(f"expected a JSON object, got {type(record).__name__}")
        task_name = record.get("task", default_task)
        if task_name is None:
            raise error("missing; expected the task name (e.g. \"math\")", "task")
        if not isinstance(task_name, str):
            raise error(f"expected a string, got {task_name!r}", "task")
        task_id = record.get("task_id")
        if task_id is None:
            raise error("missing; expected a unique id string", "task_id")
        if isinstance(task_id, bool) or not isinstance(task_id, (str, int)) or str(task_id) == "":
            raise error(f"expected a non-empty string, got {task_id!r}", "task_id")

        shards: list[Shard] = []
        if "shards" in record:
            shards = _parse_shards(record["shards"], error)
        elif require_shards:
            raise error("missing; expected a list of {\"shard_id\": int, \"shard\": str}", "shards")

        fields = {k: v for k, v in record.items() if k not in ("task_id", "task", "shards")}
        return cls(task_id=str(task_id) if not isinstance(task_id, str) else task_id, task=task_name,
                   shards=shards, fields=fields)


def _parse_shards(raw: Any, error) -> list[Shard]:
    if not isinstance(raw, list) or not raw:
        raise error(f"expected a non-empty list of shards, got {raw!r:.60}", "shards")
    shards, seen = [], set()
    for i, item in enumerate(raw):
        where = f"shards[{i}]"
        if not isinstance(item, dict):
            raise error(f"expected an object with shard_id and shard, got {item!r:.60}", where)
        if "shard_text" in item and "shard" not in item:
            raise error("uses 'shard_text'; the LiC data names this key 'shard'", where + ".shard_text")
        shard_id, text = item.get("shard_id"), item.get("shard")
        if isinstance(shard_id, bool) or not isinstance(shard_id, int):
            raise error(f"expected an integer, got {shard_id!r}", where + ".shard_id")
        if shard_id in seen:
            raise error(f"duplicate shard_id {shard_id}", where + ".shard_id")
        # Whether the text may be empty is the task's call (`Task.validate_shards`): summary
        # shards point at documents instead, and LiC's translation file has empty last chunks.
        if not isinstance(text, str):
            raise error(f"expected text, got {text!r:.60}", where + ".shard")
        seen.add(shard_id)
        extra = {k: v for k, v in item.items() if k not in ("shard_id", "shard")}
        shards.append(Shard(shard_id, text, extra))
    return shards
