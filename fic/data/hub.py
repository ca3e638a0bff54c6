"""`hf:` sources: any dataset `datasets` can open, mapped onto a task's LiC keys.

    hf:REPO[@REVISION][:CONFIG][:SPLIT]     a dataset on the Hugging Face hub (its cache, its offline mode)
    hf:PATH[:SPLIT]                         a folder from `save_to_disk`, a folder of data files, or one
                                            Parquet, CSV, JSON or JSONL file

With one part after REPO, it is the split when it names one (`train`, `test`, `validation`, `dev`,
or a slice such as `test[:100]`), else the config; `hf:REPO::SPLIT` says "no config" outright.
Without a split the dataset's only split is used, else `test`.

`fields` maps a task key to the column that holds it (`{question: problem, answer: solution}`);
a key not mapped is read from the column of its own name when there is one, so GSM8K needs no
mapping at all. Then each task's extractor turns columns into what the task checks:

- math: `answer` must end `#### <number>`. `answer_from` says how to get there: `hash` (the
  column is a GSM8K solution), `boxed` (a solution whose last `\\boxed{...}` is the answer;
  the solution is kept and `#### <number>` appended), `value` (the column is the final answer
  itself) or `auto` (the first of these that fits). An answer that is not a number
  (`\\frac{\\pi}{2}`, `(1, 2)`) cannot be scored by the math task: the record is skipped and counted.
- code: `test` may be a list of assert lines (MBPP's `test_list`), made into HumanEval's
  `check(candidate)`; `metadata.func_name` unmapped is the first function `canonical_solution`
  defines, else the one the asserts call.
- database: `schema_sql` unmapped is read from the Spider database (`FIC_SPIDER_DBS`).
- actions: columns stored as JSON text are decoded; the empty keys Arrow adds when it unifies
  differently shaped rows (every function's parameters in every row) are dropped; a plain-text
  question becomes BFCL's `[[{"role": "user", "content": ...}]]`.

A mapping error names the source, the record, the field (`data.fields.KEY`) and the columns the
dataset has. Every file of a local source is checked before `datasets` parses it, and the parse
runs first in a forked process, so that a parser's crash is one line (`fic.data.formats`); code
longer than `MAX_PARSED_CODE` is searched for its function name, not parsed (parsing megabytes takes minutes). `load_hf` returns the instances with `origin`, what a data card records: repository
or path, the revision asked for and the commit loaded, config, split, rows, mapping, skipped.
"""

from __future__ import annotations

import ast
import json
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fic import tasks
from fic.core.errors import FicError, one_line
from fic.core.instance import Instance
from fic.core.records import read_json
from fic.data.formats import check_local, parse_in_child
from fic.tasks.math import BOXED, boxed_content

# The keys a mapping may name, per task (`task_id` and `shards` for every task).
TASK_KEYS = {
    "math": ("question", "answer"),
    "code": ("metadata.func_name", "prompt", "question_content", "starter_code", "public_test_cases",
             "private_test_cases", "test", "canonical_solution"),
    "database": ("db_id", "schema_sql", "fully_specified_question", "reference_sql"),
    "actions": ("function", "fully_specified_question", "reference_answer", "tool_format"),
    "data2text": ("table_highlighted_html", "fewshot_descriptions", "metadata", "references"),
    "translation": ("document_de", "document_en"),
    "summary": ("topic", "query", "domain", "documents", "insights", "insightid2ref_citations"),
}
COMMON_KEYS = ("task_id", "shards")
# Keys a record must have a column for; the extractors make the others (or the task's check asks).
REQUIRED = {"math": ("question", "answer"), "database": ("db_id", "fully_specified_question", "reference_sql"),
            "actions": ("function", "fully_specified_question", "reference_answer"),
            "data2text": ("table_highlighted_html", "fewshot_descriptions"),
            "translation": ("document_de", "document_en"),
            "summary": ("topic", "query", "documents", "insights", "insightid2ref_citations")}
ANSWER_FROM = ("auto", "hash", "boxed", "value")
SPLIT_NAMES = re.compile(r"(?:train|test|validation|valid|dev|eval)\b.*|.*\[.*\]")
MAX_PARSED_CODE = 100_000   # characters of code parsed to find its function's name
PLAIN_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:/\d+)?")


@dataclass
class HubSpec:
    target: str  # the repository id or the local path
    local: bool
    revision: str | None = None
    config: str | None = None
    split: str | None = None


@dataclass
class HubLoad:
    instances: list[Instance]
    origin: dict
    skipped: Counter = field(default_factory=Counter)


def parse_spec(arg: str) -> HubSpec:
    """`REPO[@REV][:CONFIG][:SPLIT]` or `PATH[:SPLIT]` (the part after `hf:`)."""
    if not arg:
        raise FicError("source 'hf:' needs a dataset after ':' (hf:REPO[:CONFIG][:SPLIT] or hf:PATH)",
                       field="source")
    parts = re.split(r":(?![^\[]*\])", arg)  # a slice's colon (`test[:100]`) is no separator
    for cut in range(len(parts), 0, -1):  # the longest prefix that is a local path (paths may hold ':')
        head = ":".join(parts[:cut])
        if Path(head).exists():
            rest = parts[cut:]
            if len(rest) > 1:
                raise FicError(f"expected hf:PATH[:SPLIT] for a local dataset, got hf:{arg}", field="source")
            return HubSpec(head, True, split=rest[0] if rest and rest[0] else None)
    if len(parts) > 3:
        raise FicError(f"expected hf:REPO[:CONFIG][:SPLIT], got hf:{arg}", field="source")
    repo, revision = parts[0].partition("@")[::2]
    if repo.startswith((".", "/", "~")) or repo.endswith((".parquet", ".csv", ".json", ".jsonl")):
        raise FicError("no such file or folder (a local dataset must exist; a hub dataset is OWNER/NAME)",
                       path=repo, field="source")
    config = split = None
    if len(parts) == 3:
        config, split = parts[1] or None, parts[2] or None
    elif len(parts) == 2:
        config, split = (None, parts[1]) if SPLIT_NAMES.fullmatch(parts[1]) else (parts[1] or None, None)
    return HubSpec(repo, False, revision=revision or None, config=config, split=split)


SAVED = ("dataset_info.json", "state.json", "dataset_dict.json")  # the files of a `save_to_disk` folder


def open_dataset(spec: HubSpec, source: str) -> tuple[Any, dict]:
    """The `datasets.Dataset` a spec names (one split, sliced as `test[:100]` asks), and where it
    came from. An empty dataset or split, or a file datasets cannot parse, is one line (the
    reason datasets gives, with its line number, not its logger's lines first)."""
    import datasets  # heavy import, only for this source

    path = Path(spec.target)
    origin = {"source": source, "repository": None if spec.local else spec.target,
              "path": str(path) if spec.local else None, "revision": spec.revision, "config": spec.config}
    base = _split_name(spec.split, source) if spec.split else None
    split = spec.split
    if spec.local:
        check_local(path, source)
        if path.is_file() and path.stat().st_size == 0:
            raise FicError("the file is empty: no rows", path=str(path), field="source")
    quiet = spec.local and not datasets.utils.are_progress_bars_disabled()
    if quiet:  # a local file converts in a blink: no progress bars
        datasets.utils.disable_progress_bars()
    verbosity = datasets.utils.logging.get_verbosity()
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)  # its errors come as FiC's one line
    try:
        if spec.local and path.is_dir() and any((path / n).is_file() for n in SAVED):
            data, split = _load_saved(path, base, source)  # a `save_to_disk` folder: no cache, no conversion
        elif spec.local and path.is_file():
            suffix = _data_suffix(path)
            builder = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json",
                       ".ndjson": "json", ".arrow": "arrow", ".txt": "text"}.get(suffix)
            if builder is None:
                raise FicError("expected a save_to_disk folder, a data folder, or a .parquet, .arrow, .csv, .tsv, "
                               ".json, .jsonl or .txt file (or one of those as .gz, .bz2 or .xz)", path=str(path),
                               field="source")
            extra = {"delimiter": "\t"} if suffix == ".tsv" else {}
            split = base or "train"

            def load() -> Any:
                return datasets.load_dataset(builder, data_files={split: str(path)}, **extra)[split]

            parse_in_child(load, str(path), source)
            data = load()
        elif spec.local:  # a folder of data files: datasets chooses the reader and the splits
            def load() -> Any:
                return datasets.load_dataset(spec.target, spec.config, split=spec.split, revision=spec.revision)

            parse_in_child(load, str(path), source)
            data = load()
        else:
            data = datasets.load_dataset(spec.target, spec.config, split=spec.split, revision=spec.revision)
    except FicError:
        raise
    except Exception as err:  # offline without a cache, unknown repo/config/split, unreadable files
        raise _not_loaded(err, spec, source) from None
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if quiet:
            datasets.utils.enable_progress_bars()
    if isinstance(data, datasets.DatasetDict):
        split = _choose_split(list(data), spec.split, source)
        data = data[split]
    elif spec.local and spec.split and spec.split != split:  # a slice of a local split
        data = _sliced(data, spec.split, split or base, source)
        split = spec.split
    else:
        split = split or str(data.split or "") or None
    if len(data) == 0:
        raise FicError(f"{f'the split {split!r}' if split else 'the dataset'} is empty: no rows", path=source,
                       field="source")
    origin["split"] = split
    origin["config"] = spec.config or getattr(data.info, "config_name", None)
    origin["rows"] = len(data)
    origin["fingerprint"] = getattr(data, "_fingerprint", None)
    origin["commit"] = _commit(data) if not spec.local else None
    return data, origin


def _split_name(split: str, source: str) -> str:
    """`test` of `test[:100]` (and of `test`)."""
    found = re.fullmatch(r"([\w.-]+)(\[[^\]]*\])?", split)
    if found is None:
        raise FicError(f"expected a split name or a slice such as test[:100], got {split!r}", path=source,
                       field="source")
    return found.group(1)


def _choose_split(names: list[str], wanted: str | None, source: str) -> str:
    """The split a spec names among `names`, else the only one, else `test`."""
    split = wanted or (names[0] if len(names) == 1 else "test" if "test" in names else None)
    if split not in names:
        what = f"no split {split!r}" if split else "several splits and none named"
        raise FicError(f"{what}; the dataset has {', '.join(names)} (add :SPLIT to the spec)", path=source,
                       field="source")
    return split


def _load_saved(path: Path, base: str | None, source: str) -> tuple[Any, str | None]:
    """A `save_to_disk` folder's dataset (of one split: only that one is loaded) and that split.
    datasets cannot load an empty one (IndexError): that is said first."""
    import datasets

    split, folder = None, path
    if (path / "dataset_dict.json").is_file():
        splits = read_json(path / "dataset_dict.json").get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise FicError("expected a list of split names under 'splits'", path=str(path / "dataset_dict.json"),
                           field="source")
        split = _choose_split(splits, base, source)
        folder = path / split
    state = folder / "state.json"
    if state.is_file() and read_json(state).get("_data_files") == []:
        raise FicError(f"{f'the split {split!r}' if split else 'the dataset'} is empty: no rows", path=source,
                       field="source")
    return datasets.load_from_disk(str(folder)), split


def _sliced(data: Any, wanted: str, split: str, source: str) -> Any:
    """`data` (the split `split`) cut as `wanted` (`test[:100]`, `test[10%:20%]`) says."""
    import datasets

    try:
        parts = datasets.ReadInstruction.from_spec(wanted).to_absolute({split: len(data)})
    except (ValueError, AssertionError) as err:
        raise FicError(f"cannot cut the split as {wanted!r} ({one_line(err)[:200]})", path=source,
                       field="source") from None
    if len(parts) != 1 or parts[0].splitname != split:
        raise FicError(f"expected one slice of {split!r}, such as {split}[:100], got {wanted!r}", path=source,
                       field="source")
    return data.select(range(parts[0].from_, parts[0].to))


def _not_loaded(err: BaseException, spec: HubSpec, source: str) -> FicError:
    """One line for a dataset datasets could not load: its own reason (a parser's, with the line
    it stopped at, is the cause of its DatasetGenerationError)."""
    cause = err.__cause__ or err.__context__ if type(err).__name__ == "DatasetGenerationError" else None
    reason = one_line(cause or err)[:300]
    if "corresponds to no data" in reason:
        return FicError("the dataset is empty: no rows", path=source, field="source")
    where = "the local dataset" if spec.local else "the Hugging Face hub"
    hint = "" if spec.local else ("; offline, set HF_DATASETS_OFFLINE=1 to read datasets' cache, or pass a "
                                  "local copy as hf:PATH")
    return FicError(f"could not load {spec.target!r} from {where} ({reason}){hint}", path=source, field="source")


def _data_suffix(path: Path) -> str:
    """The format suffix of a data file: `.jsonl` of `data.jsonl.gz`."""
    suffixes = [s.lower() for s in path.suffixes]
    if len(suffixes) > 1 and suffixes[-1] in (".gz", ".bz2", ".xz"):
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""


def _commit(data: Any) -> str | None:
    """The commit a hub dataset was read at: datasets keeps its cache under the commit's hash."""
    for cache in getattr(data, "cache_files", None) or []:
        name = Path(cache.get("filename", "")).parent.name
        if re.fullmatch(r"[0-9a-f]{40}", name):
            return name
    return None


def load_hf(arg: str, task: str, *, fields: dict[str, str] | None = None, answer_from: str = "auto",
            limit: int | None = None) -> HubLoad:
    """Up to `limit` instances of `task` from the dataset `hf:arg`, mapped by `fields`."""
    source = f"hf:{arg}"
    if task not in TASK_KEYS:
        tasks.get(task)  # an unknown name is an error naming the known tasks
        raise FicError(f"hf: sources do not map the {task} task", field="task")
    if answer_from not in ANSWER_FROM:
        raise FicError(f"expected one of {', '.join(ANSWER_FROM)}, got {answer_from!r}", field="answer_from")
    fields = dict(fields or {})
    known = TASK_KEYS[task] + COMMON_KEYS
    for key in fields:
        if key not in known:
            raise FicError(f"the {task} task has no key {key!r}; its keys: {', '.join(known)}", path=source,
                           field=f"fields.{key}")
    spec = parse_spec(arg)
    data, origin = open_dataset(spec, source)
    columns = list(data.column_names)
    mapping = _resolve(task, fields, columns, source)
    origin.update({"task": task, "fields": mapping, "answer_from": answer_from if task == "math" else None})
    name = spec.target if not spec.local else Path(spec.target).stem
    filter_task = "task" in columns and "task" not in mapping.values()
    instances, skipped, seen = [], Counter(), {}
    for number, row in enumerate(data, start=1):
        if limit is not None and len(instances) >= limit:
            break
        if filter_task and isinstance(row.get("task"), str) and row["task"] != task:
            continue
        record = _record(row, mapping, task, answer_from, source, number, columns, skipped)
        if record is None:
            continue
        record.setdefault("task_id", f"{name}/{origin['split'] or 'all'}/{number - 1}")
        record["task_id"] = str(record["task_id"])
        instance = _instance(record, task, source, number, mapping, columns)
        if instance.task_id in seen:
            raise FicError(f"duplicate task_id {instance.task_id!r} (first at record {seen[instance.task_id]}); "
                           "map task_id to a column of unique ids", path=source, record=number, field="fields.task_id")
        seen[instance.task_id] = number
        instances.append(instance)
    origin["skipped"] = dict(skipped)
    if not instances:
        reasons = f" (skipped: {dict(skipped.most_common(3))}; mapped {mapping})" if skipped else ""
        raise FicError(f"no {task!r} instances in the dataset{reasons}", path=source)
    return HubLoad(instances, origin, skipped)


def _columns(columns: list[str]) -> str:
    shown = ", ".join(columns[:20]) + (f", ... ({len(columns)} in all)" if len(columns) > 20 else "")
    return f"the dataset has columns: {shown}"


def _resolve(task: str, fields: dict[str, str], columns: list[str], source: str) -> dict[str, str]:
    """task key -> column: the mapping given, else the column of the key's own name."""
    mapping = {}
    for key in TASK_KEYS[task] + COMMON_KEYS:
        column = fields.get(key, key if key in columns else None)
        if column is None:
            continue
        if column not in columns:
            raise FicError(f"no column {column!r}; {_columns(columns)}", path=source, record=1,
                           field=f"fields.{key}")
        mapping[key] = column
    needed = list(REQUIRED.get(task, ()))
    if task == "code":
        for group in (("prompt", "question_content"), ("public_test_cases", "private_test_cases", "test")):
            if not any(k in mapping for k in group):
                needed.append(group[0] if group[0] == "prompt" and "question_content" not in columns else group[-1])
    for key in needed:
        if key not in mapping:
            raise FicError(f"missing: the {task} task needs {key!r}; map it to a column (data.fields.{key}=COLUMN; "
                           f"fic shard: --fields {key}=COLUMN); {_columns(columns)}", path=source, record=1, field=f"fields.{key}")
    return mapping


def _record(row: dict, mapping: dict[str, str], task: str, answer_from: str, source: str, number: int,
            columns: list[str], skipped: Counter) -> dict | None:
    record: dict[str, Any] = {}
    for key, column in mapping.items():
        value = row.get(column)
        if value is None:
            if key in REQUIRED.get(task, ()) or key == "task_id":
                raise FicError(f"empty (column {column!r} is null here)", path=source, record=number,
                               field=f"fields.{key}")
            continue
        head, _, sub = key.partition(".")
        if sub:
            record.setdefault(head, {})[sub] = value
        else:
            record[key] = value
    if "shards" in record:
        record["shards"] = [{k: v for k, v in s.items() if v is not None} if isinstance(s, dict) else s
                            for s in record["shards"]]
    extract = {"math": _math, "code": _code, "database": _database, "actions": _actions}.get(task)
    if extract is None:
        return record
    problem = extract(record, mapping, answer_from)
    if problem is None:
        return record
    kind, message = problem
    if kind == "skip":
        skipped[message] += 1
        return None
    raise FicError(message, path=source, record=number, field=f"fields.{kind}")


def _instance(record: dict, task: str, source: str, number: int, mapping: dict, columns: list[str]) -> Instance:
    """The record as an Instance, checked as `fic.data.sources.read_instance` checks LiC records."""
    def error(message: str, field_name: str | None = None) -> FicError:
        return FicError(message, path=source, record=number, field=field_name)

    try:
        instance = Instance.from_dict(record, path=source, record_no=number, require_shards=False, default_task=task)
        checker = tasks.get(task)
        checker.validate_fields(instance.fields, error)
        checker.validate_shards(instance, error)
        return instance
    except FicError as err:
        key = (err.field or "").split("[")[0].split(".")[0]
        column = mapping.get(key) or mapping.get(err.field or "")
        if column is not None:
            err.message += f" (read from column {column!r}; check data.fields, {_columns(columns)})"
        err.field = f"fields.{err.field}" if err.field and key in mapping else err.field
        raise FicError(err.message, path=err.path, record=err.record, field=err.field) from None


# --------------------------------------------------------------------------- the extractors

def number_of(text: str) -> str | None:
    """`text` as a plain number the math task can score (`5`, `-2.5`, `3/4`, `\\frac{3}{4}`,
    `\\$1,200`, `50\\%`), cleaned; None for anything else (an expression, a tuple, words)."""
    text = str(text).strip().strip("$").strip()
    text = re.sub(r"\\(?:text|mathrm|textbf|mbox)\s*\{\s*\}", "", text)
    text = re.sub(r"\\[,!;: ]|\\\$|\\%|%|\^\s*\{?\\circ\}?", "", text).replace("{,}", ",").strip()
    frac = re.fullmatch(r"(-?)\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}", text)
    if frac:
        return f"{frac.group(1)}{frac.group(2)}/{frac.group(3)}"
    text = text.replace(" ", "").rstrip(".")
    return text.replace(",", "") if PLAIN_NUMBER.fullmatch(text) else None


def _last_boxed(text: str) -> str | None:
    """The balanced content of the last `\\boxed{...}`, or None."""
    start = text.rfind(BOXED)
    return None if start < 0 else boxed_content(text, start)


def _math(record: dict, mapping: dict, answer_from: str) -> tuple[str, str] | None:
    raw = record.get("answer")
    text = raw if isinstance(raw, str) else json.dumps(raw) if not isinstance(raw, (int, float)) else str(raw)
    column = mapping.get("answer")
    how = answer_from
    if how == "auto":
        how = "hash" if "####" in text else "boxed" if BOXED in text else "value"
        if how == "value" and (len(text) > 60 or "\n" in text.strip()):  # prose, not an answer: a wrong column
            return "answer", (f"expected a solution with '#### <number>' or \\boxed{{...}}, or a short answer value, "
                              f"in column {column!r}, got {text[:60]!r}")
    if how == "hash":
        if "####" not in text:
            return "answer", (f"expected a solution ending '#### <number>' in column {column!r}, got {text[:60]!r}; "
                              "set data.answer_from=boxed or value")
        return None
    if how == "boxed":
        boxed = _last_boxed(text)
        if boxed is None:
            return "answer", (f"expected a solution with \\boxed{{...}} in column {column!r}, got {text[:60]!r}; "
                              "set data.answer_from=hash or value")
        value = number_of(boxed)
        if value is None:
            return "skip", "its answer is not a number (the math task scores numbers)"
        record["answer"] = f"{text.rstrip()}\n#### {value}"
        return None
    value = number_of(text)
    if value is None:
        return "skip", "its answer is not a number (the math task scores numbers)"
    record["answer"] = f"#### {value}"
    return None


def _code(record: dict, mapping: dict, answer_from: str) -> tuple[str, str] | None:
    test = record.get("test")
    if isinstance(test, list):  # MBPP: assert lines calling the function by its name
        lines = [str(line).strip() for line in test if str(line).strip()]
        record["test"] = "def check(candidate):\n" + "".join(f"    {line}\n" for line in lines)
    for key in ("public_test_cases", "private_test_cases"):
        if isinstance(record.get(key), list):
            record[key] = json.dumps(record[key])
    meta = record.setdefault("metadata", {})
    if not isinstance(meta, dict):
        return "metadata.func_name", f"expected a mapping, got {meta!r:.60}"
    if not meta.get("func_name"):
        name = _defined(record.get("canonical_solution")) or _called(record.get("test")) or \
            _defined(record.get("prompt"), last=True)
        if name is None:
            return "metadata.func_name", ("missing: no function name; map metadata.func_name to a column "
                                          "(HumanEval: entry_point)")
        meta["func_name"] = name
    return None


def _defined(code: Any, *, last: bool = False) -> str | None:
    if not isinstance(code, str):
        return None
    try:
        if len(code) > MAX_PARSED_CODE:
            raise ValueError("too long to parse")
        names = [n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # also null bytes, deep nesting
        names = re.findall(r"^def\s+(\w+)\s*\(", code, re.MULTILINE)
    return (names[-1] if last else names[0]) if names else None


def _called(test: Any) -> str | None:
    found = re.search(r"\bassert\s+(?:not\s+)?\(?\s*(?:math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(", test or "")
    return found.group(1) if found and found.group(1) not in ("candidate", "set", "abs", "sorted") else None


def _database(record: dict, mapping: dict, answer_from: str) -> tuple[str, str] | None:
    if record.get("schema_sql"):
        return None
    folder = tasks.get("database").folder()
    path = folder / str(record["db_id"]) / f"{record['db_id']}.sqlite" if folder is not None else None
    if path is None or not path.is_file():
        where = f"no database {path}" if path is not None else "no Spider databases folder (FIC_SPIDER_DBS)"
        return "schema_sql", f"missing: map schema_sql to a column, or give the databases to read it from ({where})"
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = connection.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE "
                                  "'sqlite_%' ORDER BY rowid").fetchall()
    finally:
        connection.close()
    record["schema_sql"] = ";\n".join(sql.strip() for (sql,) in rows) + ";"
    return None


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _actions(record: dict, mapping: dict, answer_from: str) -> tuple[str, str] | None:
    for key in ("function", "fully_specified_question", "reference_answer"):
        value = record.get(key)
        if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                return key, f"looks like JSON but is not valid ({err.msg}, column {mapping.get(key)!r})"
            except (ValueError, RecursionError, MemoryError) as err:  # a huge number, deep nesting
                return key, f"looks like JSON but cannot be read ({one_line(err)[:120]}, column {mapping.get(key)!r})"
        record[key] = _without_nulls(value)
    if isinstance(record["function"], dict):
        record["function"] = [record["function"]]
    question = record["fully_specified_question"]
    if isinstance(question, str):
        record["fully_specified_question"] = [[{"role": "user", "content": question}]]
    elif isinstance(question, list) and question and isinstance(question[0], dict):
        record["fully_specified_question"] = [question]
    for schema in record["function"] if isinstance(record["function"], list) else []:
        if isinstance(schema, dict) and isinstance(schema.get("parameters"), dict):
            schema["parameters"].setdefault("properties", {})
    return None
