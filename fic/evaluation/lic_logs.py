"""Lost in Conversation's log format: an evaluation's conversations as LiC's own logs, and back.

LiC (github.com/microsoft/lost_in_conversation) writes one JSON record per conversation
(`utils_log.log_conversation`) into `<log_folder>/<task>/<conv_type>/<conv_type>_<task>_<model>.jsonl`
(`utils_log.get_log_files`, the model name with `<>:"/\\|?*` made `_`), and its viewer
(`app_conv_viewer.py`) and analyses read them back. A record:

- `conv_id` (a 24-hex ObjectId), `conv_type` (`full`, `concat`, `shuffle-concat`, `sharded`, ...;
  `-t<T>` after a single-turn view whose assistant temperature is not 1.0, `-at<T>-ut<U>` after a
  multi-turn one whose assistant or user temperature is not), `task`, `task_id`, `dataset_fn` (the
  data file's name), `assistant_model`, `system_model` (who classified and extracted: `NA` for the
  single-turn views), `user_model` (`NA` likewise), `git_version`, `is_correct`, `score`;
- `trace`: the messages in order, each `{"role", "content", "timestamp"}` (`%Y-%m-%d %H:%M:%S`),
  role `system`, `user`, `assistant` or `log`; a `log` entry's content is an event:
  `{"type": "shard_revealed", "shard_id"}` after the user turn that revealed it,
  `{"type": "system-verification", "response": {"response_type": <label>}}` after each multi-turn
  reply, `{"type": "answer-evaluation", "exact_answer", "is_correct", "score", "evaluation_return"}`
  after each scored reply, `{"type": "conversation-completed", "is_correct": true}` when a correct
  answer ends it (`simulator_sharded.py`, `simulator_full.py`).

FiC's records carry everything LiC's do (its seven labels are LiC's, its timestamps LiC's
format), so `to_lic` loses nothing LiC reads; what only FiC has (the run index, the stop reason,
token counts, notes) goes under a `fic` key, as LiC keeps sample-specific extras beside its keys
(`additional_info`). `from_lic` reads a LiC record (FiC's or LiC's own) back into FiC's fields:
the round trip is tested against LiC's schema in `tests/evaluation/test_lic_logs.py`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from fic import __version__
from fic.conversation.simulator import NOT_CLASSIFIED
from fic.core.errors import FicError
from fic.core.files import write_jsonl
from fic.data.views import SINGLE_TURN_VIEWS, VIEWS

# The keys of LiC's record (`utils_log.log_conversation`), in its order.
LIC_KEYS = ("conv_id", "conv_type", "task", "task_id", "dataset_fn", "assistant_model", "system_model", "user_model",
            "git_version", "trace", "is_correct", "score")
LIC_EVENTS = ("shard_revealed", "system-verification", "answer-evaluation", "conversation-completed")
LOG_FOLDER = "lic_logs"  # below the run folder (LiC's own is logs/: point its --log_folder here)
# The data file of each of LiC's tasks (`tasks/<task>/task_<task>.py`: `get_dataset_file`). LiC's viewer
# (`app_conv_viewer.py`) keeps only the records whose `dataset_fn` is this file's name, and then looks
# each record's task_id up in that file: it shows conversations on LiC's own instances only.
LIC_DATASET_FILES = {"math": "sharded_math.json", "translation": "sharded_translation.json",
                     **dict.fromkeys(("code", "database", "actions", "data2text", "summary"),
                                     "sharded_instructions_600.json")}
# What FiC keeps of a turn beyond LiC's trace, under `fic.turns` (a single-turn view's shards: LiC logs none).
TURN_EXTRAS = ("shard_ids", "prompt_tokens", "reply_tokens", "finish_reason", "seed", "user_note", "label_note", "score_note")
RECORD_EXTRAS = ("run", "stop_reason", "num_turns", "num_shards", "first_answer_turn", "premature_answer",
                 "shards_at_first_answer", "last_shard_turn", "prompt_tokens", "generated_tokens")


def conv_type(view: str, temperature: float, user_temperature: float = 1.0) -> str:
    """LiC's name for a view played at these temperatures (`run_simulations.py`)."""
    if view in SINGLE_TURN_VIEWS:
        return view if temperature == 1.0 else f"{view}-t{temperature}"
    return view if temperature == user_temperature == 1.0 else f"{view}-at{temperature}-ut{user_temperature}"


def view_of(name: str) -> str:
    """The view a LiC `conv_type` names (`sharded-at0.0-ut1.0` -> sharded)."""
    for view in sorted(VIEWS, key=len, reverse=True):
        if name == view or re.fullmatch(rf"{re.escape(view)}-(t|at)[\d.]+(-ut[\d.]+)?", name):
            return view
    raise FicError(f"conv_type {name!r} names no view FiC plays ({', '.join(VIEWS)})", field="conv_type")


def conv_id(model: str, record: dict) -> str:
    """A 24-hex id, as LiC's ObjectIds are, fixed by the model and the conversation's key: exporting
    twice gives the same ids."""
    key = f"{model}\0{record['task_id']}\0{record['view']}\0{record.get('run', 0)}"
    return hashlib.sha1(key.encode()).hexdigest()[:24]


def to_lic(record: dict, run: dict) -> dict:
    """One FiC conversation record as LiC's. `run`: what the record does not say about its run:
    `model`, `dataset_fn` (a name, or None: LiC's own file of the record's task, `LIC_DATASET_FILES`),
    `temperature`, `user` (model or `verbatim`), `user_temperature`, `classifier` (model or `rule`)."""
    model = record.get("model") or run["model"]
    single = record["view"] in SINGLE_TURN_VIEWS
    trace = [{"role": "system", "content": record.get("system") or "", "timestamp": _first_time(record)}]
    correct = False
    for turn in record["turns"]:
        trace.append({"role": "user", "content": turn["user"], "timestamp": turn.get("sent_at", "")})
        if not single:
            trace += [_event({"type": "shard_revealed", "shard_id": i}, turn.get("sent_at", ""))
                      for i in turn.get("shard_ids", [])]
        when = turn.get("replied_at", "")
        trace.append({"role": "assistant", "content": turn["reply"], "timestamp": when})
        if not single:
            trace.append(_event({"type": "system-verification", "response": {"response_type": turn["label"]}}, when))
        if turn.get("score") is not None:
            correct = turn["score"] >= 1.0
            evaluation = {"score": turn["score"], **({"note": turn["score_note"]} if turn.get("score_note") else {})}
            trace.append(_event({"type": "answer-evaluation", "exact_answer": turn.get("answer"), "is_correct": correct,
                                 "score": turn["score"], "evaluation_return": evaluation}, when))
    if record.get("stop_reason") == "correct" and not single:  # LiC's full simulator logs no completion
        trace.append(_event({"type": "conversation-completed", "is_correct": True}, trace[-1]["timestamp"]))
    return {
        "conv_id": conv_id(model, record),
        "conv_type": conv_type(record["view"], run["temperature"], run["user_temperature"]),
        "task": record["task"], "task_id": record["task_id"],
        "dataset_fn": run["dataset_fn"] or LIC_DATASET_FILES.get(record["task"], ""),
        "assistant_model": model, "system_model": "NA" if single else run["classifier"],
        "user_model": "NA" if single else run["user"], "git_version": f"fic {__version__}", "trace": trace,
        "is_correct": correct, "score": float(record["score"]),
        "fic": {**{k: record[k] for k in RECORD_EXTRAS if k in record},
                "turns": [{k: t.get(k) for k in TURN_EXTRAS} for t in record["turns"]]},
    }


def _event(content: dict, when: str) -> dict:
    return {"role": "log", "content": content, "timestamp": when}


def _first_time(record: dict) -> str:
    return record["turns"][0].get("sent_at", "") if record["turns"] else ""


def from_lic(record: dict) -> dict:
    """A LiC record (exported by FiC or written by LiC) as FiC's conversation fields: the key, the
    model, the score and every turn (user, shards revealed, reply, label, answer, score, times)."""
    view = view_of(record["conv_type"])
    single = view in SINGLE_TURN_VIEWS
    turns: list[dict] = []
    for entry in record["trace"]:
        role, content = entry["role"], entry["content"]
        if role == "user":
            turns.append({"user": content, "shard_ids": [], "reply": "", "label": NOT_CLASSIFIED if single else "",
                          "answer": None, "score": None, "sent_at": entry.get("timestamp", ""), "replied_at": ""})
        elif role == "assistant" and turns:
            turns[-1]["reply"], turns[-1]["replied_at"] = content, entry.get("timestamp", "")
        elif role == "log" and turns:
            kind = content.get("type")
            if kind == "shard_revealed":
                turns[-1]["shard_ids"].append(content["shard_id"])
            elif kind == "system-verification":
                turns[-1]["label"] = content["response"]["response_type"]
            elif kind == "answer-evaluation":
                turns[-1]["answer"], turns[-1]["score"] = content.get("exact_answer"), content.get("score")
    extras = record.get("fic") or {}
    for turn, more in zip(turns, extras.get("turns", [])):
        turn.update(more)
    score = record.get("score")
    return {"task_id": record["task_id"], "task": record["task"], "view": view, "model": record["assistant_model"],
            "score": float(score if score is not None else bool(record.get("is_correct"))),
            **{k: v for k, v in extras.items() if k != "turns"}, "run": extras.get("run", 0),
            "system": next((e["content"] for e in record["trace"] if e["role"] == "system"), None), "turns": turns}


def log_path(folder: Path, record: dict) -> Path:
    """Where LiC keeps a record: `<folder>/<task>/<conv_type>/<conv_type>_<task>_<model>.jsonl`."""
    model = re.sub(r'[<>:"/\\|?*]', "_", record["assistant_model"])
    kind = record["conv_type"]
    return folder / record["task"] / kind / f"{kind}_{record['task']}_{model}.jsonl"


def run_settings(config: dict, metrics: dict | None, dataset_fn: str | None = None) -> dict:
    """What `to_lic` needs from an evaluation's `config.yaml` (and `metrics.json`). `dataset_fn` names
    the data file in every record; by default it is LiC's own file of each record's task when every
    source is a LiC file (`lic:`: LiC's instances, which its viewer can show), else the sources' names."""
    user, classifier = config.get("user") or {}, config.get("classifier") or {}
    sources = (config.get("data") or {}).get("source") or (metrics or {}).get("settings", {}).get("source") or []
    sources = [sources] if isinstance(sources, str) else sources
    names = [spec.partition(":")[2].rsplit("/", 1)[-1] if spec.split(":")[0] in ("lic", "jsonl", "gsm8k") and
             ":" in spec else spec for spec in sources]
    if dataset_fn is None and not (sources and all(spec.startswith("lic:") for spec in sources)):
        dataset_fn = ",".join(names)
    llm = user.get("kind") == "llm"
    return {"model": (config.get("model") or {}).get("model") or (metrics or {}).get("settings", {}).get("model"),
            "dataset_fn": dataset_fn, "temperature": float(config.get("temperature", 0.0)),
            "user": (user.get("backend") or {}).get("model") if llm else "verbatim",
            "user_temperature": float(user.get("temperature", 1.0)) if llm else 1.0,
            "classifier": (classifier.get("backend") or {}).get("model") if classifier.get("kind") == "llm"
            else "rule"}


def write_lic_logs(runs: list[tuple[list[dict], dict]], folder: Path) -> list[Path]:
    """The records of every (records, run settings) pair as LiC's, in one tree of LiC's files below
    `folder`: runs of one model, task and conv_type (a demo's test and test-unseen splits) share a
    file, as LiC's own runs do. Each file is written whole, atomically: exporting again replaces,
    never appends twice. Returns the files written."""
    files: dict[Path, list[dict]] = {}
    for records, run in runs:
        for record in records:
            lic = to_lic(record, run)
            files.setdefault(log_path(folder, lic), []).append(lic)
    for path, lines in files.items():
        write_jsonl(path, lines)
    return sorted(files)
