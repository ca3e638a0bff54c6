"""`fic probe --config YAML [key=value ...]`: interaction awareness, can the model write the
user's next turn? (the probe of arXiv 2604.02315, FiC's second lens on reading a conversation)

For every instance of every data source:

1. The single-turn reply: the model under test answers the question (the task's system
   prompt and full prompt, greedy), or the reply is read from `replies.path`. Its task score
   is the accuracy reported beside the probe.
2. The reply is shown as it is (`original`) and perturbed: `truncate` keeps the first
   `truncate_fraction` of its tokens (the model's tokenizer; words for a remote backend),
   `explicit_question` appends a generic question ("Does that make sense?") picked per instance.
3. `[user question; assistant reply]` is rendered with the role switch (`switch`):
   - `user_turn` (the paper's probe): the chat template renders the conversation and opens a
     *user* turn (`fic.core.chat.user_turn_ids`); the model continues under the user role.
     Needs token ids, so a local backend (hf, vllm).
   - `swap_roles`: the history with roles swapped (the question as the assistant's message, the
     reply as the user's) under a system message saying so; the model's reply is the user's
     next turn. Any backend.
   - `instruct`: one user message holding the transcript and a request to write the user's
     next message; the model answers as the assistant. Any backend.
4. Decoding sweep: each temperature of `temperatures`; `samples` draws per instance above 0,
   one greedy draw at 0. Seeds come from `fic.core.seeding`: sample k at temperature t is one
   generation call over every (source, instance, perturbation) row in data order (split into
   chunks of `batch_size`), seeded `derive_seed(seed, "probe", t, k, chunk)`. Backends seed per
   call (vLLM and openai give row i seed + i; hf draws the call's rows from one seeded stream),
   so a draw is fixed by the settings and the data: two checkpoints probed with the same
   settings draw with the same seeds on the same instances (what pairing needs); changing
   `limit` or `data` changes the draws. One call per (instance, temperature) would make draws
   independent of the other instances but take several times as many decoding steps.
5. A judge (`fic.probe.judge`: `rule` offline, or `llm` through any backend) labels each
   generated user turn with one of 8 labels; the report states which judge was used.
6. Outputs in `out`: `replies.jsonl`, `generations.jsonl` (every user turn with its seed,
   label and whether its text changed vs the unperturbed turn), `metrics.json`, `report.md`,
   `followup_vs_temperature.png`, `labels.png`, `config.yaml` (see `fic.probe.report`). What has
   finished is written as it goes: `replies.jsonl` once the replies are written, each generation
   call's user turns appended to `user_turns.jsonl` as the call returns; `fingerprint.json` binds
   the folder to the settings that made them. Re-running into the folder resumes (the calls it
   holds are not made again; other settings are refused, the judge excepted).
7. `baseline=RUN_DIR` (an earlier `fic probe` run with the same settings, e.g. of the base
   checkpoint) adds a side-by-side comparison with paired differences per instance.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from fic import tasks
from fic.backends import check_backend, make_backend
from fic.conversation.simulator import score_reply
from fic.core.bounds import MAX_BATCH, MAX_REPEATS, MAX_RETRIES
from fic.core.chat import prompt_ids, user_turn_ids
from fic.core.config import config_to_dict, differences, resolved_yaml, set_in, setting
from fic.core.errors import FicError
from fic.core.files import (
    append_jsonl,
    check_writable,
    folder_lock,
    removed_if_failed,
    write_json,
    write_jsonl,
    write_text,
)
from fic.core.generation import BackendConfig, Generation, SamplingParams
from fic.core.instance import Instance
from fic.core.progress import Progress
from fic.core.records import checked_log, fields_problem, of_type, read_json, read_records
from fic.core.seeding import derive_seed, pick
from fic.data.sources import InstancesSection, ShardedInstances, describe_loaded, load_unsharded
from fic.data.views import system_message, user_turns
from fic.probe.judge import JUDGE_KINDS, make_judge
from fic.probe.report import compare, summarize, write_report

SWITCHES = ("user_turn", "swap_roles", "instruct")
PERTURBATIONS = ("truncate", "explicit_question")
ORIGINAL = "original"
REPLIES_NAME, GENERATIONS_NAME, METRICS_NAME, CONFIG_NAME = ("replies.jsonl", "generations.jsonl", "metrics.json",
                                                             "config.yaml")
TURNS_NAME, FINGERPRINT_NAME = "user_turns.jsonl", "fingerprint.json"  # the resumable log and what binds it
EXPLICIT_QUESTIONS = ("Does that make sense?", "Do you have any questions?", "What do you think?",
                      "Is there anything you would like me to explain further?")
DEFAULT_INSTRUCTION = {
    "swap_roles": "You are the user in this conversation, talking with an AI assistant. Here your own messages "
                  "appear as the assistant's and the AI assistant's messages appear as the user's. Write your "
                  "next message to the assistant.",
    "instruct": "Write the next message the user sends to the assistant in this conversation. Reply with that "
                "message only, as the user would type it.",
}


@dataclass
class SingleTurnRepliesSection:
    path: str = setting("", "JSONL of single-turn replies, one {\"task_id\", \"reply\"} object a line (plus "
                        "\"dataset\", the source spec, when several sources share task ids), e.g. an earlier "
                        "probe's replies.jsonl; empty: the model under test answers each question (greedy).")
    max_new_tokens: int = setting(320, "Most tokens of a single-turn reply the model writes.", min=1)


@dataclass
class JudgeSection:
    kind: str = setting("rule", "rule: offline heuristics (fic.probe.judge); llm: a model labels each user turn "
                        "with one of the 8 labels as JSON, re-asked when its answer is unusable.", choices=JUDGE_KINDS)
    backend: BackendConfig = setting(BackendConfig(), "The judge model (kind llm only).")
    max_new_tokens: int = setting(96, "Most tokens of one judge answer.", min=1)
    retries: int = setting(2, "Times an unusable judge answer is sent back with what was wrong; then the rule "
                           "label is used and noted.", min=0, max=MAX_RETRIES)


@dataclass
class ProbeConfig:
    """Settings of `fic probe`."""

    model: BackendConfig = setting(BackendConfig(), "The model under test: it writes the single-turn replies "
                                   "and the user turns.")
    data: InstancesSection = setting(InstancesSection(source=["reasoning-gym:gsm_symbolic"], limit=20),
                                     "The instances; each source is reported as its own dataset.")
    replies: SingleTurnRepliesSection = setting(SingleTurnRepliesSection(), "Where the single-turn replies come from.")
    switch: str = setting("user_turn", "How the model is made to speak as the user: user_turn (the chat template "
                          "opens a user turn; local backends), swap_roles (history with roles swapped), instruct "
                          "(asked, as the assistant, to write the user's next message).", choices=SWITCHES)
    instruction: str = setting("", "swap_roles: its system message; instruct: the request after the transcript. "
                               "Empty: FiC's default text for the switch.")
    system_prompt: bool = setting(False, "Keep the task's system prompt in the probe's context (the paper shows "
                                  "only [question; reply]). Replies are always written with it.")
    temperatures: list[float] = setting([0.0, 1.0], "Decoding temperatures of the user turns (0: greedy).", min=0.0,
                                         unbounded="sampling temperatures: logits are divided by them")
    samples: int = setting(4, "User turns drawn per instance, perturbation and temperature above 0 (greedy draws "
                           "one).", min=1, max=MAX_REPEATS)
    top_p: float = setting(1.0, "Nucleus sampling threshold of the user turns.", min=0.0, max=1.0)
    max_new_tokens: int = setting(96, "Most tokens of one user turn.", min=1)
    perturbations: list[str] = setting(list(PERTURBATIONS), "Perturbed replies probed beside the original: "
                                       f"{', '.join(PERTURBATIONS)}.")
    truncate_fraction: float = setting(0.5, "truncate: the share of the reply's tokens kept.", min=0.01, max=0.99)
    explicit_questions: list[str] = setting(list(EXPLICIT_QUESTIONS), "explicit_question: the generic questions "
                                            "appended to the reply (one picked per instance).")
    judge: JudgeSection = setting(JudgeSection(), "Who labels the user turns.")
    baseline: str = setting("", "An earlier probe run folder with the same settings (e.g. of the base "
                            "checkpoint): the report adds paired differences against it.")
    out: str = setting("runs/probe", "Output folder. The replies and each generation call's user turns are saved as "
                       "they finish (replies.jsonl, user_turns.jsonl): re-running into it resumes, with the same "
                       "settings (else refused); the judge may change.")
    seed: int = setting(0, "Seed of the sampled user turns and of the per-instance question pick.")
    batch_size: int = setting(64, "Most prompts per generation call for replies and greedy user turns (the "
                              "backend splits further into model.batch_size).", min=1,
                              max=MAX_BATCH)

    def check(self, source: str) -> None:
        def bad(message: str, field: str) -> FicError:
            return FicError(message, path=source, field=field)

        if not self.model.model:
            raise bad("missing: the model to probe (a checkpoint folder or served model)", "model.model")
        if not self.data.source:
            raise bad("expected at least one source of instances", "data.source")
        if not self.temperatures:
            raise bad("expected at least one temperature", "temperatures")
        for index, value in enumerate(self.temperatures):
            if value < 0:
                raise bad(f"expected a value >= 0, got {value}", f"temperatures[{index}]")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise bad("a temperature is listed twice", "temperatures")
        for index, name in enumerate(self.perturbations):
            if name not in PERTURBATIONS:
                raise bad(f"expected one of {', '.join(PERTURBATIONS)}, got {name!r}", f"perturbations[{index}]")
        if len(set(self.perturbations)) != len(self.perturbations):
            raise bad("a perturbation is listed twice", "perturbations")
        if "explicit_question" in self.perturbations and not all(q.strip() for q in self.explicit_questions or [""]):
            raise bad("expected at least one non-empty question", "explicit_questions")
        if self.top_p <= 0:
            raise bad("expected a value in (0, 1]", "top_p")
        if self.switch == "user_turn" and self.model.kind == "openai":
            raise bad("user_turn opens a user turn in the chat template, which needs token ids; an openai "
                      "endpoint only answers as the assistant: use swap_roles or instruct", "switch")
        if self.judge.kind == "llm" and not self.judge.backend.model:
            raise bad("judge.kind is llm but no judge model is set", "judge.backend.model")
        if not self.out.strip():
            raise bad("missing: the output folder", "out")


# --------------------------------------------------------------------------- perturbations

def truncate(reply: str, fraction: float, tokenizer: Any = None) -> str:
    """The first `fraction` of the reply's tokens (at least one): the model's tokens when a
    tokenizer is given, else whitespace-separated words."""
    if tokenizer is not None:
        ids = tokenizer.encode(reply, add_special_tokens=False)
        return tokenizer.decode(ids[:max(1, int(len(ids) * fraction))], skip_special_tokens=True) if ids else ""
    words = re.findall(r"\S+\s*", reply)
    return "".join(words[:max(1, int(len(words) * fraction))]).rstrip() if words else ""


def explicit_question(reply: str, question: str) -> str:
    """The reply with a generic question appended as its last paragraph."""
    return f"{reply.rstrip()}\n\n{question}"


def shown_replies(reply: str, cfg: ProbeConfig, dataset: str, task_id: str, tokenizer: Any = None) -> dict[str, str]:
    """The reply under each condition: the original and each configured perturbation."""
    shown = {ORIGINAL: reply}
    for name in cfg.perturbations:
        if name == "truncate":
            shown[name] = truncate(reply, cfg.truncate_fraction, tokenizer)
        else:
            question = pick(cfg.explicit_questions, cfg.seed, "explicit_question", dataset, task_id)
            shown[name] = explicit_question(reply, question)
    return shown


# --------------------------------------------------------------------------- the role switch

def probe_messages(switch: str, query: str, reply: str, *, system: str | None = None,
                   instruction: str = "") -> list[dict]:
    """The chat messages of the probe for one reply. For `user_turn` they are the plain
    conversation (the template then opens a user turn); for the others the model's next
    assistant turn is the user's message."""
    if switch == "user_turn":
        head = [{"role": "system", "content": system}] if system else []
        return head + [{"role": "user", "content": query}, {"role": "assistant", "content": reply}]
    instruction = instruction or DEFAULT_INSTRUCTION[switch]
    if switch == "swap_roles":
        context = f"{instruction}\n\n{system}" if system else instruction
        return [{"role": "system", "content": context}, {"role": "assistant", "content": query},
                {"role": "user", "content": reply}]
    if switch == "instruct":
        transcript = (f"[system]\n{system}\n\n" if system else "") + f"[user]\n{query}\n\n[assistant]\n{reply}"
        return [{"role": "user", "content": f"Here is a conversation between a user and an AI assistant.\n\n"
                                            f"<conversation>\n{transcript}\n</conversation>\n\n{instruction}"}]
    raise FicError(f"unknown switch {switch!r}; expected one of {', '.join(SWITCHES)}", field="switch")


def probe_prompt_ids(tokenizer: Any, switch: str, messages: list[dict]) -> list[int]:
    """Token ids the model continues from: a user turn opened by the template for `user_turn`,
    the ordinary assistant generation prompt for the other switches."""

    return user_turn_ids(tokenizer, messages) if switch == "user_turn" else prompt_ids(tokenizer, messages)


# --------------------------------------------------------------------------- data and replies

def load_datasets(cfg: ProbeConfig) -> list[tuple[str, Instance]]:
    """(source spec, instance) pairs: the probe reports each source as its own dataset."""
    return _pairs(load_unsharded(cfg.data))


def _pairs(loaded: ShardedInstances) -> list[tuple[str, Instance]]:
    return [(report.spec, instance) for report in loaded.sources for instance in report.instances]


def draws(cfg: ProbeConfig) -> int:
    """User turns drawn per instance and condition: `samples` at each temperature above 0, one greedy."""
    return sum(1 if t == 0 else cfg.samples for t in cfg.temperatures)


def start_line(cfg: ProbeConfig, loaded: ShardedInstances) -> str:
    """What the probe will do, before any model loads: the instances read and why, where the
    single-turn replies come from, the user turns it will draw and who labels them, where it writes."""
    n = len(loaded.instances)
    conditions = [ORIGINAL, *cfg.perturbations]
    temperatures = ", ".join(f"{t:g}" for t in cfg.temperatures)
    replies = f"read from {cfg.replies.path}" if cfg.replies.path else "written by the model (greedy)"
    turns = (f"{len(conditions)} conditions ({', '.join(conditions)}) x {draws(cfg)} draws (temperatures "
             f"{temperatures}; {cfg.samples} samples above 0) = {n * len(conditions) * draws(cfg)} user turns, "
             f"labelled by the {cfg.judge.kind} judge")
    clauses = [describe_loaded(loaded, cfg.data, limit_set_in=set_in(cfg, "data.limit")),
               f"{n} single-turn replies {replies}", turns, f"outputs in {cfg.out}"]
    return "fic probe: " + "; ".join(clauses)


def plan(cfg: ProbeConfig) -> str:
    """The start line of a probe of `cfg` (`fic probe --dry-run`); no model loads, and what the run's
    start would refuse is refused (the out folder, a folder of another probe, a model folder that is
    not there, a missing extra)."""
    out = Path(cfg.out)
    check_writable(out, folder=True, field="out")
    check_backends(cfg)
    loaded = load_unsharded(cfg.data)
    if out.is_dir():
        check_resume(out, cfg, write=False)
    return start_line(cfg, loaded)


def _replies_from_file(path: str, datasets: list[tuple[str, Instance]]) -> dict:
    found, by_id = {}, {}
    for number, record in enumerate(read_records(path), start=1):
        reply, task_id = record.get("reply"), record.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            raise FicError("expected a task_id string", path=path, record=number, field="task_id")
        if not isinstance(reply, str):
            raise FicError(f"expected the reply as text, got {reply!r:.40}", path=path, record=number, field="reply")
        found[(record.get("dataset"), task_id)] = record
        by_id.setdefault(task_id, []).append(record)
    out = {}
    for dataset, instance in datasets:
        # Matched by source and task id; a task id only one record has matches whatever its source says.
        record = found.get((dataset, instance.task_id))
        if record is None and len(by_id.get(instance.task_id, [])) == 1:
            (record,) = by_id[instance.task_id]
        if record is None:
            raise FicError(f"no reply for task_id {instance.task_id!r} of {dataset}", path=path, field="task_id")
        out[(dataset, instance.task_id)] = (record["reply"], record.get("finish_reason", "stop"))
    return out


def single_turn_replies(cfg: ProbeConfig, model: Any, datasets: list[tuple[str, Instance]], given: dict | None,
                        progress: bool) -> list[dict]:
    """Each instance's single-turn reply with its task score: `given` ones (read from
    `replies.path`), else written by the model."""
    if given is not None:
        texts = [given[(d, i.task_id)] for d, i in datasets]
    else:
        conversations = [[system_message(i), {"role": "user", "content": user_turns(i, "full")[0]}]
                         for _, i in datasets]
        params = SamplingParams(max_new_tokens=cfg.replies.max_new_tokens, temperature=0.0, seed=cfg.seed)
        outputs: list[Generation] = []
        bar = Progress(len(conversations), "probe: single-turn replies", "reply", enabled=progress)
        for start in range(0, len(conversations), cfg.batch_size):
            outputs += model.chat(conversations[start:start + cfg.batch_size], params)
            bar.update(len(conversations[start:start + cfg.batch_size]))
        bar.close()
        texts = [(out.text, out.finish_reason) for out in outputs]
    records = []
    for (dataset, instance), (text, finish) in zip(datasets, texts):
        task = tasks.of(instance)
        records.append({"dataset": dataset, "task_id": instance.task_id, "task": instance.task,
                        "system": system_message(instance)["content"],  # the task's, with this instance's tools
                        "query": user_turns(instance, "full")[0], "reply": text, "finish_reason": finish,
                        # guarded: a reply that makes the scorer raise scores 0, the probe goes on
                        "score": score_reply(task, text, instance)[1], "source": cfg.replies.path or "model"})
    return records


# --------------------------------------------------------------------------- user turns

def _call(model: Any, keys: Sequence, messages: dict, prompts: dict, params: SamplingParams) -> list[Generation]:
    """Token ids to a local backend (the role switch is rendered here); messages to a remote one."""
    if model.tokenizer is None:
        return model.chat([messages[key] for key in keys], params)
    return model.generate([prompts[key] for key in keys], params)


def generate_user_turns(cfg: ProbeConfig, model: Any, replies: list[dict], progress: bool,
                        log_path: Path | None = None) -> list[dict]:
    """Every (instance, condition, temperature, sample) user turn, unlabelled. With `log_path`,
    each generation call's turns are appended to it (fsync'd) as the call returns, and the calls
    it already holds are not made again: an interrupted probe resumes where it stopped."""
    tokenizer = model.tokenizer
    if cfg.switch == "user_turn" and tokenizer is None:
        raise FicError(f"the {model.name} backend has no token ids; switch user_turn needs a local backend "
                       "(hf, vllm): use swap_roles or instruct", field="switch")
    conditions = [ORIGINAL, *cfg.perturbations]
    shown_text, messages, prompts = {}, {}, {}
    for r in replies:
        system = r["system"] if cfg.system_prompt else None
        shown = shown_replies(r["reply"], cfg, r["dataset"], r["task_id"], tokenizer)
        for condition in conditions:
            key = (r["dataset"], r["task_id"], condition)
            shown_text[key] = shown[condition]
            messages[key] = probe_messages(cfg.switch, r["query"], shown[condition], system=system,
                                           instruction=cfg.instruction)
            if tokenizer is not None:
                prompts[key] = probe_prompt_ids(tokenizer, cfg.switch, messages[key])

    # Calls hold the rows of every instance and perturbation together: a decoding step reads every
    # weight once whatever the batch, so on a CPU 60 rows cost a few times what 4 rows cost, not 15
    # times, and the number of steps decides the time. Sampled rows: one call per sample index, seeded by (temperature, sample,
    # chunk); greedy rows: one pass. Sampled calls find every prompt's keys and values stored by
    # the greedy pass (hf backend), so they read almost nothing but their own new tokens.
    calls = []
    keys = list(messages)  # (source, task_id, condition), in data order
    for temperature in cfg.temperatures:
        for sample in range(1 if temperature == 0 else cfg.samples):
            rows = [(key, sample) for key in keys]
            for chunk, start in enumerate(range(0, len(rows), cfg.batch_size)):
                seed = None if temperature == 0 else derive_seed(cfg.seed, "probe", temperature, sample, chunk)
                calls.append((temperature, seed, rows[start:start + cfg.batch_size]))
    logged = saved_turns(log_path) if log_path is not None else {}
    records = []
    total = sum(len(rows) for _, _, rows in calls)
    bar = Progress(total, "probe: user turns", "turn", enabled=progress)
    try:
        for number, (temperature, seed, rows) in enumerate(calls):
            if len(logged.get(number, [])) == len(rows):  # made before this run: kept
                records += logged[number]
                bar.update(len(rows))
                continue
            params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=temperature, top_p=cfg.top_p,
                                    seed=0 if seed is None else seed)
            keys = [key for key, _ in rows]
            outputs = _call(model, keys, messages, prompts, params)
            made = []
            for (key, sample), out in zip(rows, outputs):
                dataset, task_id, condition = key
                made.append({"call": number, "dataset": dataset, "task_id": task_id, "condition": condition,
                             "temperature": temperature, "sample": sample, "seed": seed,
                             "reply_shown": shown_text[key], "user_turn": out.text,
                             "finish_reason": out.finish_reason, "tokens": len(out.token_ids)})
            if log_path is not None:
                for record in made:
                    append_jsonl(log_path, record)
            records += made
            bar.update(len(rows))
    finally:
        bar.close()
    return records


# What a saved user turn must hold for a resume to keep it (and the later stages to read it).
TURN_FIELDS = (("call", of_type(int), "a call number"), ("dataset", of_type(str), "a string"),
               ("task_id", of_type(str), "a string"), ("condition", of_type(str), "a string"),
               ("temperature", of_type(int, float), "a number"), ("sample", of_type(int), "a sample number"),
               ("seed", of_type(int, type(None)), "an integer or null"), ("reply_shown", of_type(str), "a string"),
               ("user_turn", of_type(str), "a string"))


def saved_turns(log_path: Path) -> dict[int, list[dict]]:
    """The user turns an interrupted probe made, by generation call, each checked (`checked_log`)
    before any is kept or made again."""
    logged: dict[int, list[dict]] = {}
    for record in checked_log(log_path, fields_problem(TURN_FIELDS), "saved user turn", "make it again"):
        logged.setdefault(record["call"], []).append(record)
    return logged


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def mark_changed(records: list[dict]) -> None:
    """`changed`: whether a perturbed turn's text differs from the unperturbed one drawn with the
    same instance, temperature and sample index (None for the unperturbed turns)."""
    original = {(r["dataset"], r["task_id"], r["temperature"], r["sample"]): r["user_turn"]
                for r in records if r["condition"] == ORIGINAL}
    for r in records:
        key = (r["dataset"], r["task_id"], r["temperature"], r["sample"])
        r["changed"] = None if r["condition"] == ORIGINAL else not _same_text(r["user_turn"], original[key])


# --------------------------------------------------------------------------- baseline

def fingerprint(cfg: ProbeConfig) -> dict:
    """What must agree for two runs to be paired (the model and the replies may differ)."""
    judge = {"kind": cfg.judge.kind, **({"model": cfg.judge.backend.model} if cfg.judge.kind == "llm" else {})}
    return {"data": config_to_dict(cfg.data),
            "switch": cfg.switch, "instruction": cfg.instruction, "system_prompt": cfg.system_prompt,
            "temperatures": list(cfg.temperatures), "samples": cfg.samples, "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_new_tokens, "perturbations": list(cfg.perturbations),
            "truncate_fraction": cfg.truncate_fraction, "explicit_questions": list(cfg.explicit_questions),
            "seed": cfg.seed, "judge": judge}


def read_baseline(cfg: ProbeConfig) -> dict:
    """The baseline run's metrics and records, refused when its settings differ."""
    folder = Path(cfg.baseline)
    path = folder / METRICS_NAME
    if not path.is_file():
        raise FicError(f"not a probe run folder (no {METRICS_NAME})", path=str(folder), field="baseline")
    try:
        metrics = read_json(path)
    except FicError as err:
        raise FicError(err.message, path=str(path), field="baseline") from None
    theirs, ours = metrics.get("fingerprint"), fingerprint(cfg)
    if theirs != ours:
        if not isinstance(theirs, dict):
            raise FicError("has no probe settings (fingerprint)", path=str(path), field="baseline")
        diff = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        details = "; ".join(f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in diff[:3])
        raise FicError(f"the baseline was probed with other settings ({details}); pairing needs the same "
                       "instances, conditions and samples", path=str(folder), field="baseline")
    return {"metrics": metrics, "out": str(folder),
            "generations": read_records(folder / GENERATIONS_NAME), "replies": read_records(folder / REPLIES_NAME)}


# --------------------------------------------------------------------------- the run

def probe(cfg: ProbeConfig, *, model: Any = None, judge_backend: Any = None, progress: bool = True) -> dict:
    """Run the probe and write its outputs; return the metrics. Backends may be passed in
    (tests, a live model); else they are built from the config."""

    out = Path(cfg.out)
    check_writable(out, folder=True, field="out")  # before any data or model loads
    # A probe that fails before anything is saved leaves no new folder (lock, fingerprint) behind.
    with removed_if_failed(out, [FINGERPRINT_NAME]), folder_lock(out):
        return _probe(cfg, out, model, judge_backend, progress)


def resume_fingerprint(cfg: ProbeConfig) -> dict:
    """What decides the replies and user turns a folder holds: the pairing settings (without the
    judge, which labels afterwards and may change), the model, where the replies come from, and the
    chunking that seeds each call."""
    return {**{k: v for k, v in fingerprint(cfg).items() if k != "judge"}, "model": cfg.model.model,
            "replies": {"path": cfg.replies.path, "max_new_tokens": cfg.replies.max_new_tokens},
            "batch_size": cfg.batch_size}


def check_resume(out: Path, cfg: ProbeConfig, *, write: bool = True) -> None:
    """Bind a fresh folder to this probe's settings; refuse to resume one that holds another's
    (`write=False`, `--dry-run`: only refuse)."""
    path, wanted = out / FINGERPRINT_NAME, resume_fingerprint(cfg)
    holds = any((out / name).exists() for name in (REPLIES_NAME, TURNS_NAME))
    if holds and path.is_file():
        saved = read_json(path)
        if saved != wanted:
            raise FicError(f"this folder holds a probe of other settings ({differences(saved, wanted)}); resuming "
                           "would mix them. Use another out= or delete the folder", field="out")
    elif holds:
        raise FicError(f"holds probe outputs without {FINGERPRINT_NAME}; cannot tell which settings made them. Use "
                       "another out= or delete the folder", path=str(out), field="out")
    if write:
        out.mkdir(parents=True, exist_ok=True)
        write_json(path, wanted)


def check_backends(cfg: ProbeConfig, model: Any = None, judge_backend: Any = None) -> None:
    """The backends the probe will build (those not given), checked before anything loads."""
    if model is None:
        check_backend(cfg.model, "model")
    if cfg.judge.kind == "llm" and judge_backend is None:
        check_backend(cfg.judge.backend, "judge.backend")


def _probe(cfg: ProbeConfig, out: Path, model: Any, judge_backend: Any, progress: bool) -> dict:
    started, cpu_started = time.perf_counter(), time.process_time()
    baseline = read_baseline(cfg) if cfg.baseline else None
    loaded = load_unsharded(cfg.data)
    print(start_line(cfg, loaded), flush=True)  # stdout: stderr is for the one-line error
    datasets = _pairs(loaded)
    given = _replies_from_file(cfg.replies.path, datasets) if cfg.replies.path else None
    check_backends(cfg, model, judge_backend)
    check_resume(out, cfg)
    kept = read_records(out / REPLIES_NAME) if (out / REPLIES_NAME).is_file() else None
    if kept is not None and [(r["dataset"], r["task_id"]) for r in kept] != [(d, i.task_id) for d, i in datasets]:
        raise FicError(f"{REPLIES_NAME} holds replies to other instances (the data changed); use another out= or "
                       "delete the folder", path=str(out), field="data.source")
    made = saved_turns(out / TURNS_NAME)  # checked before any model call
    if kept is not None:
        print(f"fic probe: resuming in {out}: {len(kept)} single-turn replies and "
              f"{sum(map(len, made.values()))} user turns made before are kept", flush=True)
    model = model if model is not None else make_backend(cfg.model)
    if cfg.judge.kind == "llm":
        same = config_to_dict(cfg.judge.backend) == config_to_dict(cfg.model)
        judge_backend = judge_backend or (model if same else make_backend(cfg.judge.backend))
        judge = make_judge("llm", judge_backend, model=cfg.judge.backend.model,
                           max_new_tokens=cfg.judge.max_new_tokens, retries=cfg.judge.retries, seed=cfg.seed)
    else:
        judge = make_judge("rule")

    phases = {"setup": time.perf_counter() - started}
    clock = time.perf_counter()
    if kept is not None:
        replies = kept
    else:
        replies = single_turn_replies(cfg, model, datasets, given, progress)
        write_jsonl(out / REPLIES_NAME, replies)  # what has finished is on disk
    phases["replies"], clock = time.perf_counter() - clock, time.perf_counter()
    generations = generate_user_turns(cfg, model, replies, progress, log_path=out / TURNS_NAME)
    phases["user_turns"], clock = time.perf_counter() - clock, time.perf_counter()
    query = {(r["dataset"], r["task_id"]): r["query"] for r in replies}
    labels = judge.judge([(query[(g["dataset"], g["task_id"])], g["reply_shown"], g["user_turn"])
                          for g in generations])
    phases["judge"] = time.perf_counter() - clock
    for g, (label, note) in zip(generations, labels):
        g["label"], g["judge_note"] = label, note
    mark_changed(generations)

    metrics = summarize(replies, generations)
    metrics["judge"] = {"kind": judge.name, "description": judge.describe(), "labelled": len(generations),
                        "fallbacks": sum(bool(g["judge_note"]) and g["judge_note"].startswith("rule label")
                                         for g in generations)}
    metrics["fingerprint"] = fingerprint(cfg)
    metrics["settings"] = {
        "model": cfg.model.model, "data": list(cfg.data.source), "task": cfg.data.task, "instances": len(replies),
        "replies": f"from {cfg.replies.path}" if cfg.replies.path else "written by the model (greedy)",
        "switch": cfg.switch, "temperatures": list(cfg.temperatures), "samples": cfg.samples,
        "max_new_tokens": cfg.max_new_tokens, "perturbations": list(cfg.perturbations),
        "truncate_fraction": cfg.truncate_fraction, "explicit_questions": list(cfg.explicit_questions),
        "truncate_unit": "tokens" if model.tokenizer is not None else "words"}
    if baseline is not None:
        metrics["comparison"] = compare(baseline["generations"], generations, baseline["replies"], replies)
        metrics["baseline"] = {"out": baseline["out"], "model": baseline["metrics"]["settings"]["model"]}
    metrics["elapsed_s"] = time.perf_counter() - started
    metrics["phases_s"] = phases  # where the time went: loading, replies, user turns, judging
    # CPU seconds of this process (all its threads): on a machine shared with other jobs it says
    # more about the work than the wall time does.
    metrics["cpu_s"] = time.process_time() - cpu_started
    examples = {}
    for g in generations:
        examples.setdefault(g["label"], g)

    write_text(out / CONFIG_NAME, resolved_yaml(cfg))
    write_jsonl(out / GENERATIONS_NAME, generations)
    write_json(out / METRICS_NAME, metrics)
    write_report(out, metrics, examples, baseline["metrics"] if baseline else None)
    return metrics
