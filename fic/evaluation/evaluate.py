"""`fic eval --config YAML [key=value ...]`: play conversations in each view and report.

For every instance, view and run (N runs at one temperature) a conversation is played by
`fic.conversation.simulator` in lockstep batches; each finished conversation is appended (and fsync'd)
to `<out>/conversations.jsonl` at once. Then `<out>/metrics.json` (`fic.evaluation.metrics`),
`<out>/report.md` and its plots (`fic.evaluation.report`) are written atomically.

Output folder `out`:

- `config.yaml`: the resolved config of the latest run.
- `fingerprint.json`: the settings that decide what a conversation is (model, data, user,
  classifier, decoding, seed) and a hash of every instance's content. A re-run into the same
  folder resumes: conversations already in the log, keyed by (task_id, view, run), are
  skipped; adding views or runs is allowed, other changes are an error naming the keys that
  differ, and so is an edited data file (an instance changed, added or gone) even under the
  same name (use a new `out`).
- `.fic-lock`: held while a run writes (`fic.core.files.lock_folder`): a second evaluation
  into the same folder fails at once, naming the first's process.
- `conversations.jsonl`, `metrics.json`, `report.md`, `scores_by_view.png`, `answer_timing.png`,
  `tokens_per_conversation.png`.

Data: `data` is the `InstancesSection` every stage uses (`fic.data.sources`): `data.source`
one spec or several, `data.task` one task, a list, or `all` (every task of the file FiC knows;
metrics per task and across tasks). Instances
without shards are sharded on the fly with the rule sharder (those it cannot shard are
skipped and counted), whatever the views: a run of only the full view evaluates exactly the
instances a run with the sharded view does. With `data.seed` S they are the shards `fic shard
--seed S` writes. Before any model loads, the run says in one line what it read (how many of how
many instances, cut by which `data.limit` set where; sharded here with which seed), what it will
play and where it writes (`start_line`).

Baseline: the recovery rate R = P(model; sharded) / P(baseline; full) needs the single-turn
score of the model *before* training. `baseline` names that run's folder (or its
`metrics.json`); it must cover the same instances (task ids, per task) with the full view
under the same scoring settings (`SCORING_KEYS`), else the run is refused before it plays.
Without `baseline` there is no recovery rate: the run's own P(sharded) / P(full) is reported
as `sharded_over_full`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import reprlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fic import tasks
from fic.backends import check_backend, make_backend
from fic.conversation.classify import ClassifierSection, make_classifier
from fic.conversation.simulator import answerable_by, make_conversations, play
from fic.conversation.users import UserSimulatorSection, make_user
from fic.core.bounds import MAX_BATCH, MAX_REPEATS
from fic.core.config import config_to_dict, differences, set_in, setting
from fic.core.errors import FicError
from fic.core.files import append_jsonl, check_writable, folder_lock, removed_if_failed, write_json, write_text
from fic.core.generation import BackendConfig, SamplingParams
from fic.core.instance import Instance
from fic.core.progress import Progress
from fic.core.ranks import Ranks
from fic.core.records import checked_log, read_json
from fic.data.sources import InstancesSection, ShardedInstances, describe_loaded, load_sharded
from fic.data.views import VIEWS, check_views
from fic.evaluation.metrics import record_problem, summarize
from fic.evaluation.report import write_report
from fic.sandbox import python as sandbox
from fic.tasks.base import PROMPT_STYLES

LOG_NAME, METRICS_NAME, REPORT_NAME = "conversations.jsonl", "metrics.json", "report.md"
FINGERPRINT_NAME, CONFIG_NAME = "fingerprint.json", "config.yaml"
# Settings two runs must share for one's full-view P to be the other's denominator.
SCORING_KEYS = ("temperature", "top_p", "max_new_tokens", "stop_at_correct", "prompts")
# A baseline's value for a scoring key it does not record (written before the key existed).
SCORING_DEFAULTS = {"prompts": "fic"}
METRICS_FORMAT = 2  # metrics.json that records its instances and scoring settings (baseline checks)


@dataclass
class EvalConfig:
    model: BackendConfig = setting(BackendConfig(), "The assistant under evaluation.")
    data: InstancesSection = setting(InstancesSection(), "Instances to evaluate.")
    user: UserSimulatorSection = setting(UserSimulatorSection(), "The user simulator.")
    classifier: ClassifierSection = setting(ClassifierSection(), "The reply classifier.")
    judge: BackendConfig = setting(BackendConfig(), "The LLM judge of tasks scored by one (summary); without "
                                   "judge.model their replies score 0 with a note saying they were not judged.")
    views: list[str] = setting(["full", "concat", "sharded"], f"Views to play, from: {', '.join(VIEWS)}.")
    prompts: str = setting("fic", "The wording of system prompts and user turns (and of the llm user's and llm "
                           "classifier's prompts): fic, FiC's own; lic, Lost in Conversation's verbatim (its "
                           "system prompts, Q:/A: and schema frames, shuffle-concat shuffling every shard). What "
                           "still differs under lic: docs/evaluation.md.", choices=PROMPT_STYLES)
    runs: int = setting(1, "N: conversations per instance and view (LiC uses 10 at temperature 1.0).", min=1,
                        max=MAX_REPEATS)
    temperature: float = setting(0.0, "Assistant sampling temperature (0: greedy).", min=0.0, unbounded="a sampling temperature: logits are divided by it")
    top_p: float = setting(1.0, "Assistant nucleus sampling threshold.", min=0.0, max=1.0)
    max_new_tokens: int = setting(384, "Most tokens of one assistant reply.", min=1)
    stop_at_correct: bool = setting(True, "Stop a conversation at its first correct answer (LiC); false plays "
                                    "every turn and scores the last answer attempt.")
    baseline: str = setting("", "The base model's run folder (or its metrics.json): its full-view P is the "
                            "recovery rate's denominator. It must cover the same instances with the full view "
                            "and the same scoring settings. Empty: no recovery rate (the run's own "
                            "sharded/full ratio is reported as sharded_over_full).")
    out: str = setting("runs/eval", "Output folder; re-running into it resumes.")
    seed: int = setting(0, "Seed of sampling (per call) and of the shuffle-concat order.")
    batch_size: int = setting(64, "Most conversations advanced by one generation call (the backend splits "
                              "a call further into micro-batches of model.batch_size).", min=1,
                              max=MAX_BATCH)
    sandbox: str = setting("default", "Where model-written code runs (the code task): bubblewrap, or rlimits, the "
                           "weaker fallback without namespaces, warned about in the run's first lines, report and "
                           "metrics.json; default: FIC_SANDBOX if set, else bubblewrap (a run refuses to start where "
                           "bubblewrap cannot run). See docs/tasks.md.", choices=("default", "bubblewrap", "rlimits"))

    def check(self, source: str) -> None:
        if not self.model.model:
            raise FicError("missing: the assistant model to evaluate (a checkpoint folder)", path=source,
                           field="model.model")
        if not self.data.source:
            raise FicError("missing: where instances come from, e.g. lic:PATH or reasoning-gym:gsm_symbolic",
                           path=source, field="data.source")
        check_views(self.views, source)
        if self.top_p <= 0:
            raise FicError("expected a value in (0, 1]", path=source, field="top_p")
        for role in ("user", "classifier"):
            part = getattr(self, role)
            if part.kind == "llm" and not part.backend.model:
                raise FicError(f"{role}.kind is llm but no model is set", path=source,
                               field=f"{role}.backend.model")
        if not self.out:
            raise FicError("missing: the output folder", path=source, field="out")


# --------------------------------------------------------------------------- resume

def fingerprint(cfg: EvalConfig) -> dict:
    """What decides a conversation's content. Views and runs may grow between resumed runs."""
    def backend(b: BackendConfig) -> dict:
        return {"kind": b.kind, "model": b.model, "dtype": b.dtype}

    parts = {
        "model": backend(cfg.model),
        "data": _data_fingerprint(cfg.data),
        "user": {"kind": cfg.user.kind, **({"backend": backend(cfg.user.backend), "temperature":
                                            cfg.user.temperature, "max_new_tokens": cfg.user.max_new_tokens,
                                            "max_idle_turns": cfg.user.max_idle_turns}
                                           if cfg.user.kind == "llm" else {})},
        "classifier": {"kind": cfg.classifier.kind, **({"backend": backend(cfg.classifier.backend)}
                                                       if cfg.classifier.kind == "llm" else {})},
        **({"judge": backend(cfg.judge)} if cfg.judge.model else {}),
        "temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens,
        "stop_at_correct": cfg.stop_at_correct, "seed": cfg.seed, "prompts": cfg.prompts,
    }
    return parts


# What a fingerprint saved before a key existed meant by it (a folder made then still resumes).
FINGERPRINT_DEFAULTS = {"prompts": "fic"}
def _data_fingerprint(data: InstancesSection) -> dict:
    """The data section, without the hf: mapping keys when they are unset: folders written before
    FiC had them resume as they did."""
    parts = config_to_dict(data)
    defaults = config_to_dict(InstancesSection())
    for key in ("fields", "answer_from"):
        if parts[key] == defaults[key]:
            del parts[key]
    return parts


def instance_digests(instances: list[Instance]) -> dict[str, str]:
    """Each instance's content (after sharding), hashed: resuming checks what it resumes, not
    the data file's name (an edited file under the same name would otherwise mix two datasets)."""
    return {i.task_id: hashlib.sha256(json.dumps(i.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
            for i in instances}


def _instances_changed(saved: dict, now: dict) -> str | None:
    """What differs between the instances a folder was played on and today's, in words."""
    changed = sorted(k for k in saved.keys() & now.keys() if saved[k] != now[k])
    added, gone = sorted(now.keys() - saved.keys()), sorted(saved.keys() - now.keys())
    if not (changed or added or gone):
        return None
    parts = [f"{len(ids)} {what} (e.g. {ids[0]!r})" for ids, what in
             ((changed, "changed"), (added, "added"), (gone, "gone")) if ids]
    return "the instances are not those its conversations were played on: " + ", ".join(parts)


def check_resume(out: Path, cfg: EvalConfig, instances: list[Instance], *, write: bool = True) -> None:
    """Save the fingerprint on a fresh folder; on an existing one, refuse an incompatible config
    or instances whose content changed. `write=False` (`--dry-run`) only refuses."""
    path = out / FINGERPRINT_NAME
    wanted = {**fingerprint(cfg), "instances": instance_digests(instances)}
    log = out / LOG_NAME
    if not log.exists() or log.stat().st_size == 0:
        # Nothing played yet (e.g. the last try failed on a mistyped model path): the folder is
        # not bound to that config.
        if write:
            write_json(path, wanted)
        return
    if path.exists():
        try:
            saved = read_json(path)
        except FicError as err:
            raise FicError(f"unreadable fingerprint ({err.message}); delete the folder or pick another out",
                           path=str(path)) from None
        if not isinstance(saved, dict):
            raise FicError("unreadable fingerprint (not a JSON object); delete the folder or pick another out",
                           path=str(path))
        saved_instances = saved.pop("instances", None)
        wanted_instances = wanted.pop("instances")
        saved = {**FINGERPRINT_DEFAULTS, **saved}
        if saved != wanted:
            raise FicError(f"this folder holds conversations from a different config ({differences(saved, wanted)}); "
                           "resuming would mix them. Use another out= or delete the folder", field="out")
        if saved_instances is None and not write:
            return
        if saved_instances is None:  # a folder from before instance hashes: it resumes, as it did, and says so
            print(f"fic eval: {path} predates instance hashes: the data could not be checked against the "
                  "conversations already played; it is recorded now", file=sys.stderr, flush=True)
            write_json(path, {**saved, "instances": wanted_instances})
            return
        problem = _instances_changed(saved_instances, wanted_instances)
        if problem is not None:
            raise FicError(f"cannot resume in this folder: {problem}; resuming would mix them. Use another out= "
                           "or delete the folder", path=str(out), field="data.source")
    else:
        raise FicError(f"{LOG_NAME} exists without {FINGERPRINT_NAME}; cannot tell which config made it. "
                       "Use another out= or delete the folder", field="out")


# --------------------------------------------------------------------------- data and backends

def load_instances(cfg: EvalConfig) -> tuple[list[Instance], dict]:
    """The instances to play, sharded where needed; and counts of what was skipped and why."""
    instances, skipped, _ = load_instances_and_origins(cfg)
    return instances, skipped


def load_instances_and_origins(cfg: EvalConfig) -> tuple[list[Instance], dict, list[dict]]:
    """`load_instances`, and where each hf: source's instances came from (repository, revision,
    split, mapping) for metrics.json."""
    loaded = load_data(cfg)
    return loaded.instances, loaded.dropped, loaded.origins


def load_data(cfg: EvalConfig) -> ShardedInstances:
    """The instances to play, as `load_sharded` reports them.

    Unsharded instances are rule-sharded whatever the views, so that a full-view run and a
    sharded run of one source evaluate the same instances (one can be the other's baseline).
    A full-view run keeps instances of tasks that have no rule sharder as they are."""
    loaded = load_sharded(cfg.data, shard_all=any(view != "full" for view in cfg.views))
    if not loaded.instances:
        raise FicError(f"no instance could be sharded ({loaded.dropped})", field="data.source")
    return loaded


def saved_conversations(log_path: Path) -> dict[tuple, dict]:
    """The conversations a folder holds, by (task_id, view, run), each checked (`checked_log`)
    before any is replayed or summed."""
    def problem(record: Any) -> str | None:
        if (found := record_problem(record)) is not None:
            return found
        if isinstance(record.get("run"), bool) or not isinstance(record.get("run"), int):
            return f"field 'run': expected a run number, got {reprlib.repr(record.get('run'))}"
        return None

    return {(r["task_id"], r["view"], r["run"]): r
            for r in checked_log(log_path, problem, "saved conversation", "play it again")}


def replay_note(backends: list[Any]) -> str | None:
    """What a resume can promise when a local model computes in 16 bits: a row's bf16 logits depend
    on the rows batched with it (the shapes change the rounding), so replies played after a resume,
    or with another batch_size, may differ from an unbroken run's; in float32 they do not."""
    for backend in backends:
        dtype = str(getattr(getattr(backend, "model", None), "dtype", "")).removeprefix("torch.")
        if dtype in ("bfloat16", "float16"):
            return (f"resuming with {dtype} weights: a row's logits depend on the rows batched with it, so the "
                    "replies played from here may differ from those an unbroken run would have drawn; replies are "
                    "reproducible across a resume or another batch_size in float32 only (model.dtype=float32)")
    return None


def plan(cfg: EvalConfig) -> str:
    """The start line of a run of `cfg` (`fic eval --dry-run`): the data read, the conversations
    an output folder already holds counted; no model loads, and what the run's start would refuse
    is refused (the out folder, a folder of another config's conversations, a model folder that is
    not there, a missing extra, the sandbox, a saved conversation of the wrong shape)."""
    out = Path(cfg.out)
    check_writable(out, folder=True, field="out")
    loaded = load_data(cfg)
    check_backends(cfg)
    if out.is_dir():
        check_resume(out, cfg, loaded.instances, write=False)
    if any(tasks.of(i).runs_code for i in loaded.instances):
        with sandbox.use_mode("" if cfg.sandbox == "default" else cfg.sandbox):
            sandbox.check_mode()
    log_path = out / LOG_NAME
    played = set(saved_conversations(log_path)) if log_path.is_file() else set()
    return start_line(cfg, loaded, played)


def backend_roles(cfg: EvalConfig) -> dict[str, tuple[BackendConfig, str]]:
    """The backends a run of `cfg` builds, by role: (its config, its section's key)."""
    roles = {"assistant": (cfg.model, "model")}
    if cfg.user.kind == "llm":
        roles["user"] = (cfg.user.backend, "user.backend")
    if cfg.classifier.kind == "llm":
        roles["classifier"] = (cfg.classifier.backend, "classifier.backend")
    if cfg.judge.model:
        roles["judge"] = (cfg.judge, "judge")
    return roles


def check_backends(cfg: EvalConfig, given: dict | None = None) -> None:
    """Every backend the run will build (those not `given`), checked before anything loads."""
    for role, (bcfg, field) in backend_roles(cfg).items():
        if (given or {}).get(role) is None:
            check_backend(bcfg, field)


def start_line(cfg: EvalConfig, loaded: ShardedInstances, played: set | frozenset = frozenset()) -> str:
    """What the run will do, in one line, before any model loads: the instances read and why,
    the views and conversations (and how many the folder holds already), the most replies they
    can take, and where the outputs go."""
    conversations = make_conversations(loaded.instances, cfg.views, cfg.runs, view_seed=cfg.seed,
                                       max_idle_turns=cfg.user.max_idle_turns, prompts=cfg.prompts)
    left = [c for c in conversations if c.key not in played]
    replies = sum(c.most_turns(user_idles=cfg.user.kind == "llm") for c in left)
    held = f", {len(conversations) - len(left)} already in the folder" if len(left) < len(conversations) else ""
    return (f"fic eval: {describe_loaded(loaded, cfg.data, limit_set_in=set_in(cfg, 'data.limit'))}; views "
            f"{', '.join(cfg.views)} x {cfg.runs} run(s): {len(conversations)} conversations{held}, "
            f"{len(left)} to play in at most {replies} assistant replies; outputs in {cfg.out}")


def _backend_cache(cfg: EvalConfig, given: dict) -> dict:
    """One loaded backend per distinct config: a user or classifier on the assistant's own
    model shares its weights instead of loading them again."""
    loaded: dict[str, Any] = {}

    def get(role: str, bcfg: BackendConfig) -> Any:
        if given.get(role) is not None:
            return given[role]
        key = json.dumps(config_to_dict(bcfg), sort_keys=True)
        if key not in loaded:
            loaded[key] = make_backend(bcfg)
        return loaded[key]

    built = {role: get(role, bcfg) for role, (bcfg, _) in backend_roles(cfg).items()}
    return {"assistant": built["assistant"], "user": built.get("user"), "classifier": built.get("classifier"),
            "judge": built.get("judge", given.get("judge"))}


def read_baseline(spec: str) -> dict:
    path = Path(spec)
    if path.is_dir():
        path = path / METRICS_NAME
    if not path.exists():
        raise FicError("baseline metrics not found (expected a run folder or its metrics.json)", path=str(path),
                       field="baseline")
    try:
        metrics = read_json(path)
    except FicError as err:
        raise FicError(f"baseline metrics are unreadable ({err.message})", path=str(path), field="baseline") from None
    if not isinstance(metrics, dict) or (metrics.get("views", {}).get("full") or {}).get("P") is None:
        raise FicError("the baseline run has no full-view score; evaluate it with the full view",
                       path=str(path), field="baseline")
    if metrics.get("metrics_format") != METRICS_FORMAT:
        raise FicError("the baseline run does not record its instances and scoring settings (made by an older "
                       "FiC, whose scorer differs); evaluate the base model again", path=str(path), field="baseline")
    metrics["path"] = str(path)
    return metrics


def scoring_settings(cfg: EvalConfig) -> dict:
    return {key: getattr(cfg, key) for key in SCORING_KEYS}


def instance_ids(instances: list[Instance]) -> dict[str, list[str]]:
    """The evaluated task ids per task, as metrics.json records them."""
    ids: dict[str, list[str]] = {}
    for instance in instances:
        ids.setdefault(instance.task, []).append(instance.task_id)
    return {task: sorted(names) for task, names in sorted(ids.items())}


def check_baseline(baseline: dict, cfg: EvalConfig, instances: list[Instance]) -> None:
    """Refuse a baseline whose full-view P is not comparable with this run: other instances,
    no full view of a task, or other scoring settings."""
    path = baseline["path"]
    if "sharded" not in cfg.views and "full" not in cfg.views:
        raise FicError("a baseline gives the denominator of the recovery rate and of retention; this run has "
                       "neither the sharded nor the full view", field="baseline")
    theirs, ours = baseline.get("instances") or {}, instance_ids(instances)
    for task, ids in ours.items():
        if ((baseline.get("tasks") or {}).get(task, {}).get("full") or {}).get("P") is None:
            raise FicError(f"the baseline run has no full-view score for task {task!r}", path=path, field="baseline")
        missing, extra = sorted(set(ids) - set(theirs.get(task, []))), sorted(set(theirs.get(task, [])) - set(ids))
        if missing or extra:
            example = (f"e.g. {missing[0]!r} is not in the baseline" if missing
                       else f"e.g. {extra[0]!r} is only in the baseline")
            raise FicError(f"the baseline evaluated other {task} instances ({len(missing)} here only, "
                           f"{len(extra)} there only; {example}); evaluate both runs on the same data",
                           path=path, field="baseline")
    saved = (baseline.get("settings") or {}).get("scoring") or {}
    def theirs_of(key: str) -> Any:
        return saved.get(key, SCORING_DEFAULTS.get(key))

    differ = [key for key in SCORING_KEYS if theirs_of(key) != getattr(cfg, key)]
    if differ:
        details = "; ".join(f"{key}: {theirs_of(key)!r} there, {getattr(cfg, key)!r} here" for key in differ)
        raise FicError(f"the baseline was scored under other settings ({details}); use the same ones",
                       path=path, field="baseline")


# --------------------------------------------------------------------------- the run

def evaluate(cfg: EvalConfig, *, assistant: Any = None, user_backend: Any = None, classifier_backend: Any = None,
             judge_backend: Any = None, progress: bool = True, ranks: Ranks | None = None) -> dict:
    """Run (or resume) an evaluation; return the metrics. Backends may be passed in (tests, the
    trainer's live model); else they are built from the config.

    `ranks`: the processes of a training run whose model is sharded (ZeRO-3, FSDP). Each rank plays
    its share of the conversations, all in lockstep (`fic.conversation.simulator.play`); the main
    process alone writes the folder (its own conversations as they finish, the others' when the
    ranks are done) and every rank returns the same metrics."""
    ranks = ranks or Ranks()
    out = Path(cfg.out)
    with contextlib.ExitStack() as held:
        def take_folder() -> None:
            check_writable(out, folder=True, field="out")
            # A run that fails before any conversation is saved leaves no new folder (lock, config) behind;
            # a second evaluation into `out` fails at once instead of playing everything twice.
            held.enter_context(removed_if_failed(out, [CONFIG_NAME, FINGERPRINT_NAME]))
            held.enter_context(folder_lock(out))

        ranks.from_main(take_folder)
        held.enter_context(sandbox.use_mode("" if cfg.sandbox == "default" else cfg.sandbox))
        return _evaluate(cfg, out, assistant, user_backend, classifier_backend, judge_backend, progress, ranks)


def _evaluate(cfg: EvalConfig, out: Path, assistant: Any, user_backend: Any, classifier_backend: Any,
              judge_backend: Any, progress: bool, ranks: Ranks) -> dict:
    baseline = read_baseline(cfg.baseline) if cfg.baseline else None
    loaded = load_data(cfg)
    check_backends(cfg, {"assistant": assistant, "user": user_backend, "classifier": classifier_backend,
                         "judge": judge_backend})
    instances, skipped, origins = loaded.instances, loaded.dropped, loaded.origins
    if baseline is not None:
        check_baseline(baseline, cfg, instances)  # before any model loads
    runs_code = any(tasks.of(i).runs_code for i in instances)
    sandboxed = {"mode": sandbox.check_mode(), "isolation": sandbox.describe_isolation(),
                 "warning": sandbox.weak_warning()} if runs_code else None
    log_path = out / LOG_NAME

    def prepare_folder() -> dict:
        if sandboxed and sandboxed["warning"]:
            print(f"fic eval: {sandboxed['warning']}", file=sys.stderr, flush=True)
        out.mkdir(parents=True, exist_ok=True)
        check_resume(out, cfg, instances)
        write_text(out / CONFIG_NAME, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        played = saved_conversations(log_path)
        print(start_line(cfg, loaded, set(played)), flush=True)  # stdout: stderr is for the one-line error
        return played

    done = ranks.from_main(prepare_folder)  # the same finished conversations on every rank
    conversations = make_conversations(instances, cfg.views, cfg.runs, view_seed=cfg.seed, skip=set(done),
                                       max_idle_turns=cfg.user.max_idle_turns, prompts=cfg.prompts)
    everyone, conversations = conversations, ranks.share_of(conversations)
    total = len(instances) * len(cfg.views) * cfg.runs
    others: list[dict] = []  # a rank other than the main's: its finished records, sent to the main at the end
    if ranks.any(bool(conversations)):
        backends = _backend_cache(cfg, {"assistant": assistant, "user": user_backend,
                                        "classifier": classifier_backend, "judge": judge_backend})
        user = make_user(cfg.user.kind, backends["user"], temperature=cfg.user.temperature,
                         max_new_tokens=cfg.user.max_new_tokens) if cfg.user.kind == "llm" else make_user("verbatim")
        note = replay_note([backends["assistant"], *([backends["user"]] if cfg.user.kind == "llm" else [])])
        if done and note and ranks.main:
            print(f"fic eval: {note}", flush=True)
        classifier = (make_classifier("llm", backends["classifier"], max_new_tokens=cfg.classifier.max_new_tokens,
                                      seed=cfg.seed) if cfg.classifier.kind == "llm" else make_classifier("rule"))
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                                seed=cfg.seed)
        # Progress in replies (turns x conversations), not finished conversations: all conversations
        # advance together and most finish at the end, so finished ones said nothing until then.
        # A conversation that ends early counts its turns left as done: the time left is a bound.
        most = {id(c): c.most_turns(user_idles=cfg.user.kind == "llm") for c in conversations}
        bar = Progress(sum(most.values()), "eval", "replies", enabled=progress and ranks.main)

        def replies_done() -> int:
            return sum(most[id(c)] if c.done else len(c.turns) for c in conversations)

        def finished(conv) -> None:
            record = {**conv.to_record(), "model": cfg.model.model}  # every record names its model
            if not ranks.main:
                others.append(record)
                return
            append_jsonl(log_path, record)  # fsync'd: an interruption after this keeps it
            done[conv.key] = record
            bar.update(0, conversations=f"{len(done)}/{total}")

        def step(number: int, active: int) -> None:
            bar.update(replies_done() - bar.done)

        max_context = _max_context(backends["assistant"])
        try:
            play(conversations, backends["assistant"], user, classifier, params, batch_size=cfg.batch_size,
                 stop_at_correct=cfg.stop_at_correct, seed=cfg.seed, max_context=max_context,
                 on_finish=finished, on_step=step, judge=backends["judge"], ranks=ranks)
            bar.update(replies_done() - bar.done)
        except FicError as err:  # e.g. the server went away for good: say that nothing finished is lost
            saved = total - sum(1 for conv in everyone if not conv.done)
            # with none saved, a folder this run made is removed on the way out: name no folder then
            err.message += (f" ({saved} of {total} conversations are saved in {log_path}; run the same command "
                            "again to resume)" if saved else
                            " (no conversation had finished, so none is kept; run the same command again to start "
                            "over)")
            raise
        finally:
            bar.close()

        for records in ranks.gather(others) or []:  # the main process logs the other ranks' conversations
            for record in records:
                append_jsonl(log_path, record)
                done[(record["task_id"], record["view"], record["run"])] = record
    return ranks.from_main(lambda: _summarize(cfg, out, instances, done, baseline, skipped, origins, sandboxed,
                                              judge_backend))


def _summarize(cfg: EvalConfig, out: Path, instances: list[Instance], done: dict, baseline: dict | None,
               skipped: dict, origins: list, sandboxed: dict | None, judge_backend: Any) -> dict:
    """The metrics of the finished conversations, written with the report."""
    planned = {(i.task_id, view, run) for i in instances for view in cfg.views for run in range(cfg.runs)}
    records = [r for key, r in done.items() if key in planned]
    by_id = {i.task_id: i for i in instances}
    for r in records:  # a log written before records carried it
        if "answerable_at_first_answer" not in r:
            r["answerable_at_first_answer"] = answerable_by(by_id[r["task_id"]], r["view"], r["turns"],
                                                            r["first_answer_turn"])
    metrics = summarize(records, baseline)
    metrics["metrics_format"] = METRICS_FORMAT
    metrics["instances"] = instance_ids(instances)
    metrics["baseline_source"] = baseline["path"] if baseline is not None else None
    metrics["skipped_instances"] = skipped
    # Conversations that ended because the next prompt plus a reply would not fit the engine.
    metrics["context_full"] = sum(1 for r in records if r.get("stop_reason") == "context_full")
    # What a task's score does not measure in this run (database without Spider databases).
    judged = bool(cfg.judge.model) or judge_backend is not None
    by_name = {i.task: tasks.of(i) for i in instances}
    metrics["scoring_caveats"] = {name: caveats for name in sorted(by_name)
                                  if (caveats := by_name[name].scoring_caveats(judged))}
    if origins:
        metrics["data_origins"] = origins
    metrics["sandbox"] = sandboxed
    metrics["settings"] = {"model": cfg.model.model, "source": cfg.data.source, "task": cfg.data.task,
                           "views": cfg.views, "runs": cfg.runs, "temperature": cfg.temperature,
                           "prompts": cfg.prompts,
                           "user": cfg.user.kind, "classifier": cfg.classifier.kind,
                           "stop_at_correct": cfg.stop_at_correct, "max_new_tokens": cfg.max_new_tokens,
                           "scoring": scoring_settings(cfg)}
    write_json(out / METRICS_NAME, metrics)
    write_report(out, metrics, records)
    return metrics


def _max_context(backend: Any) -> int | None:
    """The most tokens (prompt and reply) the assistant's engine takes, for every backend: a vLLM
    engine's `max_model_len` (the one it was started with, else the model's own), a
    transformers model's `max_position_embeddings`, None where it is unknown (an HTTP endpoint).
    A conversation whose next prompt plus `max_new_tokens` would not fit ends as context-full
    (LiC) instead of aborting the run (vLLM refuses a prompt over its limit)."""
    engine = getattr(getattr(backend, "llm", None), "llm_engine", None)
    limits = (getattr(getattr(engine, "model_config", None), "max_model_len", None),
              getattr(getattr(getattr(backend, "model", None), "config", None), "max_position_embeddings", None))
    for value in limits:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
