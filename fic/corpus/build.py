"""`fic sft-data`: the multi-turn SFT warm-start corpus (FiC stage 1).

From sharded instances (or instances sharded here with the rule sharder) it writes one JSON
conversation per line, in three kinds:

- `deferral`: each user turn reveals one shard; every assistant turn before the last shard
  defers briefly or asks for the detail the next shard carries; the turn after the last shard
  is the task's gold reply (worked solution ending `#### <number>`).
- `recovery`: the same, but at one turn before the last shard the assistant answers too soon
  with a plausible wrong answer. That turn stays in the context with `train: false` (out of
  the loss) and the final turn gives the corrected solution, so the model learns to recover
  from its own premature answers instead of anchoring on them.
- `single_turn`: the full prompt in one turn and the gold reply, so single-turn skill is kept.
- `partial`: a single-turn request that is not complete yet (the first k shards in the task's
  concat rendering, k < N) and a reply that asks for or waits for what is missing. VASD's
  per-turn teacher (`terms.turns.replies: all`) reads exactly such requests, so stage 1 must teach the
  model what to do with them; the reply obeys the same no-leak check as every early reply.

Record: `{"id", "task_id", "task", "kind", "messages": [{"role", "content", "train"}],
"reply_kinds": [one of defer|ask|premature|answer per assistant turn]}`. Every message carries
`train` (true only on trained assistant turns), so `datasets` infers one schema. A data card
(`<out stem>.card.json` and `.card.md`) records sources, counts, seed, reply-kind shares and
the config, and the evaluation problems kept out (`exclude`, `fic.data.splits`): how many of the
loaded instances were found among them and dropped. No reply before the last shard may hold
the reference answer or a number the user has not given yet (`Task.leak`); the
builder enforces it on every reply it writes.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fic import tasks
from fic.backends import make_backend
from fic.core.bounds import MAX_REPEATS
from fic.core.config import config_to_dict, set_in, setting
from fic.core.errors import FicError
from fic.core.files import check_writable, write_together
from fic.core.generation import BackendConfig, SamplingParams
from fic.core.instance import Instance
from fic.core.parsing import number_values
from fic.core.progress import Progress
from fic.core.seeding import seeded_rng
from fic.data.sources import InstancesSection, describe_loaded, load_sharded
from fic.data.splits import ExcludeSection, build_exclusion
from fic.data.views import partial_instance, system_message, user_turns
from fic.tasks.deferrals import MENTION, choose_fresh

KINDS = ("deferral", "recovery", "single_turn", "partial")
REPLY_KINDS = ("defer", "ask", "premature", "answer")
LLM_BATCH = 64
# What a recovery conversation's final answer opens with (`recovery_ack`).
RECOVERY_ACKS = (
    "With all the details, here is the corrected solution:",
    "Thanks, that changes things. Here is the full solution:",
    "Now that I have everything, let me redo it properly:",
    "My earlier answer was premature. With all the information:",
    "I answered too soon before. Here is the complete solution:",
    "Let me correct my earlier answer using all the details:",
)

REPHRASE_PROMPT = (
    "You rewrite one message that a user sends to an assistant while explaining a problem bit by bit. "
    "Rewrite it casually and briefly, as the user would type it. Keep every fact and every number exactly "
    "as given; add nothing, leave nothing out, and do not ask questions. Reply with the rewritten message only.")
REPLY_PROMPT = (
    "You write the assistant's next reply in a chat where the user gives a {task} problem piece by piece. "
    "The information is still incomplete, so do not solve it, do not guess an answer, and do not write any "
    "number. Reply in one or two short sentences, with the reply text only.")
REPLY_ASKS = {
    "defer": "Write a brief reply that acknowledges the last message and asks the user to go on.",
    "ask": "Write a brief reply that asks the user for this missing detail: {hint}",
}


@dataclass
class UserRephrasingSection:
    """How user turns are worded."""

    kind: str = setting("verbatim", "verbatim: each user turn is its shard as written (what `fic eval` plays); "
                        "llm: shards 2..N are rephrased by a model, falling back to the shard when the "
                        "rewrite changes a number or is malformed.", choices=("verbatim", "llm"))
    backend: BackendConfig = setting(BackendConfig(), "The model that rephrases (kind llm).")
    temperature: float = setting(0.7, "Sampling temperature of the rephrasing model.", min=0.0, unbounded="a sampling temperature: logits are divided by it")
    max_new_tokens: int = setting(128, "Longest rephrased turn, in tokens.", min=1)


@dataclass
class EarlyRepliesSection:
    """Who writes the assistant turns before the last shard."""

    kind: str = setting("pool", "pool: brief phrasings written for FiC plus rule-made questions; llm: a model "
                        "writes each reply, rejected (pool used instead) when it leaks a number or is too long.",
                        choices=("pool", "llm"))
    backend: BackendConfig = setting(BackendConfig(), "The model that writes replies (kind llm).")
    temperature: float = setting(0.7, "Sampling temperature of the reply model.", min=0.0, unbounded="a sampling temperature: logits are divided by it")
    max_new_tokens: int = setting(64, "Longest model-written reply, in tokens.", min=1)
    max_words: int = setting(40, "Model-written replies longer than this are rejected: deferrals stay brief.",
                             min=1, unbounded="a rejection threshold: a reply's length is bounded by max_new_tokens")


@dataclass
class SFTDataConfig:
    """Settings of `fic sft-data`."""

    data: InstancesSection = setting(InstancesSection(source=["reasoning-gym:gsm_symbolic"], limit=1000),
                                     "The instances the corpus is written from.")
    seed: int = setting(0, "Seed of the conversation kinds and of every phrasing choice.")
    out: str = setting("data/gsm_symbolic.sft.jsonl", "Output JSONL; the data card goes next to it as "
                       "<stem>.card.json and <stem>.card.md.")
    conversations_per_instance: int = setting(1, "Conversations written per instance (each with its own "
                                              "kind and phrasing draw).", min=1, max=MAX_REPEATS)
    single_turn_share: float = setting(0.2, "Share of conversations that are single-turn full-view examples.",
                                       min=0.0, max=1.0)
    recovery_share: float = setting(0.3, "Share of conversations that are recovery conversations (an early "
                                    "wrong answer kept out of the loss, the corrected solution at the end).",
                                    min=0.0, max=1.0)
    partial_share: float = setting(0.0, "Share of conversations that are partial single-turn requests (the "
                                   "first shards as one request) answered by asking for or waiting for what is "
                                   "missing: what VASD's per-turn teacher reads.", min=0.0, max=1.0)
    ask_share: float = setting(0.3, "Share of assistant turns before the last shard that ask for the next "
                               "missing detail; the others are brief deferrals.", min=0.0, max=1.0)
    recovery_ack: bool = setting(True, "Open the corrected final reply of a recovery conversation with a "
                                 "short acknowledgement (\"With all the details, here is the corrected solution:\").")
    user: UserRephrasingSection = setting(UserRephrasingSection(), "User turns: verbatim shards or model rephrasings.")
    replies: EarlyRepliesSection = setting(EarlyRepliesSection(), "Replies before the last shard: pool or model-written.")
    exclude: ExcludeSection = setting(ExcludeSection(), "Evaluation data to keep out of the corpus (fic.data.splits): "
                                     "instances with the same task id or prompt are dropped and counted in the "
                                     "data card, or refused.")

    def check(self, source: str) -> None:
        if not self.data.source:
            raise FicError("expected at least one source of instances", path=source, field="data.source")
        if not self.out.strip():
            raise FicError("expected an output file path", path=source, field="out")
        shares = self.single_turn_share + self.recovery_share + self.partial_share
        if shares > 1:
            raise FicError(f"single_turn_share + recovery_share + partial_share must be at most 1, got {shares:g}",
                           path=source, field="recovery_share")
        for role in ("user", "replies"):
            part = getattr(self, role)
            if part.kind == "llm" and not part.backend.model:
                raise FicError(f"{role}.kind is llm but no model is set", path=source, field=f"{role}.backend.model")


def card_paths(out: str | Path) -> tuple[Path, Path]:
    out = Path(out)
    return out.with_suffix(".card.json"), out.with_suffix(".card.md")


def load_instances(cfg: SFTDataConfig) -> tuple[list[Instance], list[dict]]:
    """Instances from every source, sharded where needed, of several shards, none of the
    evaluation's, each with a gold reply that scores as correct; and what happened to each source."""
    instances, sources, _ = plan(cfg)
    return instances, sources


def plan(cfg: SFTDataConfig) -> tuple[list[Instance], list[dict], str]:
    """`load_instances`, and the start line: what was read and why, what is kept out, how many
    conversations will be written and where (`fic sft-data --dry-run` prints it and stops)."""
    exclusion = build_exclusion(cfg.exclude)
    kept, sources, seen = [], [], {}
    loaded = load_sharded(cfg.data, several_shards=True)
    for report in loaded.sources:
        dropped = Counter(report.dropped)
        usable, overlap = exclusion.apply(report.instances)
        for why, n in overlap.items():
            if n:
                dropped[f"an evaluation problem (same {why.replace('_', ' ')})"] += n
        count = 0
        for instance in usable:
            task = tasks.of(instance)
            if task.score(task.gold_reply(instance), instance) != 1.0:
                dropped["its gold reply does not score as correct"] += 1
                continue
            if instance.task_id in seen:
                raise FicError(f"duplicate task_id {instance.task_id!r} (also in {seen[instance.task_id]})",
                               path=report.spec, field="data.source")
            seen[instance.task_id] = report.spec
            kept.append(instance)
            count += 1
        sources.append({"spec": report.spec, "loaded": report.loaded, "sharded_here": report.sharded_here,
                        "kept": count, "dropped": dict(dropped), "evaluation_overlap": overlap,
                        **({"origin": report.origin} if report.origin is not None else {})})
    if not kept:
        raise FicError(f"no usable instances in {', '.join(cfg.data.source)} ({sources})", field="data.source")
    unusable = sum(s["loaded"] - s["kept"] for s in sources) - sum(len(r.rejected) for r in loaded.sources)
    line = (f"fic sft-data: {describe_loaded(loaded, cfg.data, limit_set_in=set_in(cfg, 'data.limit'))}"
            + (f"; {unusable} more left out (evaluation problems of exclude.sources, gold replies that do not "
               "score)" if unusable > 0 else "")
            + f"; evaluation data kept out: {', '.join(cfg.exclude.sources) or 'none named (exclude.sources)'}"
            f"; {len(kept) * cfg.conversations_per_instance} conversations from {len(kept)} instances to {cfg.out}")
    return kept, sources, line


def _message(role: str, content: str, train: bool = False) -> dict:
    return {"role": role, "content": content, "train": train}


def partial_conversation(instance: Instance, rng: random.Random, cfg: SFTDataConfig) -> tuple[list[dict], str]:
    """A partial single-turn request (the first k < N shards, concat view) and its reply: an ask
    for the next shard's detail or a deferral, naming no value not given yet."""
    task = tasks.of(instance)
    k = rng.randrange(1, len(instance.shards))
    partial = partial_instance(instance, [s.shard_id for s in instance.shards[:k]])
    sent = user_turns(instance, "sharded")
    revealed = {value for turn in sent[:k] for value in task.values_in(turn, instance)}
    kind = "ask" if rng.random() < cfg.ask_share else "defer"
    text, _ = task.early_reply(sent[k], revealed, rng, instance, ask=kind == "ask", used=set())
    return ([{**system_message(instance), "train": False}, _message("user", user_turns(partial, "concat")[0]),
             _message("assistant", text, True)], kind)


def conversation(instance: Instance, kind: str, slot: int, cfg: SFTDataConfig) -> tuple[dict, list[dict]]:
    """One record, plus the trained early replies a model may rewrite (with what each may say)."""
    task = tasks.of(instance)
    rng = seeded_rng(cfg.seed, instance.task_id, slot, kind)
    gold = task.gold_reply(instance)
    messages = [{**system_message(instance), "train": False}]
    if kind == "single_turn":
        messages += [_message("user", user_turns(instance, "full")[0]), _message("assistant", gold, True)]
        return _record(instance, kind, slot, messages, ["answer"]), []
    if kind == "partial":
        messages, reply_kind = partial_conversation(instance, rng, cfg)
        return _record(instance, kind, slot, messages, [reply_kind]), []
    turns = user_turns(instance, "sharded")
    premature_at = rng.randrange(len(turns) - 1) if kind == "recovery" else None
    revealed, used, reply_kinds, editable = set(), set(), [], []
    for i, turn in enumerate(turns):
        messages.append(_message("user", turn))
        revealed |= set(task.values_in(turn, instance))
        if i == len(turns) - 1:
            ack = choose_fresh(rng, RECOVERY_ACKS, used) + "\n" if kind == "recovery" and cfg.recovery_ack else ""
            messages.append(_message("assistant", ack + gold, True))
            reply_kinds.append("answer")
        elif i == premature_at:
            text = task.premature_reply(turns[:i + 1], instance, rng)
            if task.score(text, instance) >= 1.0:
                raise AssertionError(f"premature answer is the correct one: {text!r}")
            messages.append(_message("assistant", text, False))
            reply_kinds.append("premature")
        else:
            reply_kind = "ask" if rng.random() < cfg.ask_share else "defer"
            text, specific = task.early_reply(turns[i + 1], revealed, rng, instance, ask=reply_kind == "ask", used=used)
            messages.append(_message("assistant", text, True))
            reply_kinds.append(reply_kind)
            editable.append({"message": len(messages) - 1, "kind": reply_kind, "specific": specific,
                             "revealed": set(revealed), "instance": instance,
                             "hint": task.mask_values(turns[i + 1], revealed, instance)})
    return _record(instance, kind, slot, messages, reply_kinds), editable


def _record(instance: Instance, kind: str, slot: int, messages: list[dict], reply_kinds: list[str]) -> dict:
    return {"id": f"{instance.task_id}#{slot}", "task_id": instance.task_id, "task": instance.task,
            "kind": kind, "messages": messages, "reply_kinds": reply_kinds}


def assign_kinds(count: int, cfg: SFTDataConfig) -> list[str]:
    """Exactly the configured shares (rounded), in a seeded random order."""
    singles = round(count * cfg.single_turn_share)
    recoveries = min(round(count * cfg.recovery_share), count - singles)
    partials = min(round(count * cfg.partial_share), count - singles - recoveries)
    kinds = (["single_turn"] * singles + ["recovery"] * recoveries + ["partial"] * partials
             + ["deferral"] * (count - singles - recoveries - partials))
    seeded_rng(cfg.seed, "kinds").shuffle(kinds)
    return kinds


def make_corpus(instances: list[Instance], cfg: SFTDataConfig, *, user_backend: Any = None,
                reply_backend: Any = None, progress: bool = True) -> tuple[list[dict], dict]:
    """Build every conversation (no file I/O); return the records and the figures for the card.

    `user_backend` / `reply_backend` stand in for the configured backends (tests, dry runs);
    when a kind is llm and none is given, the backend is made from the config.
    """
    slots = [(instance, j) for instance in instances for j in range(cfg.conversations_per_instance)]
    kinds = assign_kinds(len(slots), cfg)
    records, editable, stats = [], [], Counter()
    for (instance, slot), kind in zip(tqdm(slots, desc="conversations", unit="conv", disable=not progress or None),
                                      kinds):
        record, edits = conversation(instance, kind, slot, cfg)
        records.append(record)
        editable += [{**edit, "record": len(records) - 1} for edit in edits]
        stats["ask_specific"] += sum(edit["specific"] for edit in edits)
    if cfg.user.kind == "llm":
        _rephrase_users(records, cfg, user_backend, stats, progress)
    if cfg.replies.kind == "llm":
        _write_replies(records, editable, cfg, reply_backend, stats, progress)
    return records, stats


def _chat(backend: Any, conversations: list[list[dict]], params: SamplingParams, desc: str,
          progress: bool) -> list[Any]:
    out = []
    bar = Progress(len(conversations), desc, "conv", enabled=progress)
    for start in range(0, len(conversations), LLM_BATCH):
        out += backend.chat(conversations[start:start + LLM_BATCH], params)
        bar.update(len(conversations[start:start + LLM_BATCH]))
    bar.close()
    return out


def _backend(given: Any, cfg: BackendConfig) -> Any:
    if given is not None:
        return given
    return make_backend(cfg)


def _rephrase_users(records: list[dict], cfg: SFTDataConfig, backend: Any, stats: Counter, progress: bool) -> None:
    """Rephrase user turns 2..N of multi-turn records; keep the shard when a rewrite changes its numbers."""
    targets = [(r, m) for r, record in enumerate(records) if record["kind"] != "single_turn"
               for m in [i for i, msg in enumerate(record["messages"]) if msg["role"] == "user"][1:]]
    if not targets:
        return
    backend = _backend(backend, cfg.user.backend)
    params = SamplingParams(cfg.user.max_new_tokens, cfg.user.temperature, 1.0, cfg.seed)
    prompts = [[{"role": "system", "content": REPHRASE_PROMPT},
                {"role": "user", "content": records[r]["messages"][m]["content"]}] for r, m in targets]
    for (r, m), generation in zip(targets, _chat(backend, prompts, params, "rephrasing user turns", progress)):
        original = records[r]["messages"][m]["content"]
        text = generation.text.strip().strip('"').strip()
        problem = "cut off at max_new_tokens" if generation.finish_reason != "stop" else \
            rephrase_problem(original, text, tasks.get(records[r]["task"]))
        if problem is None:
            records[r]["messages"][m]["content"] = text
            stats["user_rephrased"] += 1
        else:
            stats["user_rephrase_rejected"] += 1
            stats[f"user_rephrase_rejected/{problem}"] += 1


# Meta talk a small model adds instead of playing its part ("Here's the rewritten message:").
META = re.compile(r"\b(?:user|assistant|message|rewrit\w*|rephras\w*|concise|original|sorry|typo|"
                  r"as an ai)\b|not sure how|can't help|cannot help", re.IGNORECASE)
STOPWORDS = {"that", "this", "they", "them", "their", "there", "then", "than", "with", "have", "from", "were",
             "what", "when", "will", "your", "some", "into", "also", "just", "only", "each", "every", "been",
             "the", "and", "for", "per", "but", "are", "was", "has", "had", "its", "his", "her", "she", "him",
             "all", "any", "can", "not", "you", "our"}


def _content(text: str) -> set[str]:
    """Content words, cut to 4 letters so "plays"/"played" and "games"/"game" match."""
    return {w.lower()[:4] for w in re.findall(r"[A-Za-z]{3,}", text) if w.lower() not in STOPWORDS}


def _contexts(text: str, width: int) -> list[tuple]:
    """Each number with the content words of the `width` words after it ("6 days every week")."""
    return [(value, _content(" ".join(text[m.end():].split()[:width])))
            for m in MENTION.finditer(text) for value in number_values(m.group(0))]


def rephrase_problem(original: str, text: str, task: Any) -> str | None:
    """Why a rewrite of a user turn is refused, or None: it must keep every number, what each
    number counts, and most content words, and stay one brief in-role message."""
    if not text or "\n" in text or len(text) > 2 * len(original) + 60:
        return "empty, several lines or too long"
    if "####" in text or META.search(text) or ("?" in text and "?" not in original):
        return "talks about the task instead of stating it"
    if task.values_in(text) != task.values_in(original):
        return "changes, drops or adds a value"
    rewritten = _contexts(text, 4)
    for value, context in _contexts(original, 3):  # "6 days every week" must not become "6 days a month"
        need = -(-2 * len(context) // 3)
        if not any(v == value and len(context & c) >= need for v, c in rewritten):
            return "changes what a number counts"
    words = _content(original)
    if words and len(words & _content(text)) < 0.6 * len(words):
        return "drops content words"
    return None


def reply_problem(text: str, kind: str, edit: dict, max_words: int) -> str | None:
    """Why a model-written early reply is refused, or None: brief, in role, a question when it
    asks, and no leak (the task's `leak`: no value the user has not given, no answer)."""
    if not text or "\n" in text or len(text.split()) > max_words:
        return "empty, several lines or too long"
    if "___" in text or META.search(text):
        return "out of role"
    if kind == "ask" and "?" not in text:
        return "asked to ask but asks nothing"
    instance = edit["instance"]
    reason = tasks.of(instance).leak(text, edit["revealed"], instance)
    if reason is None:
        return None
    return ("holds the reference answer" if "reference" in reason else
            "holds a value not given yet" if "not given" in reason else reason)


def _write_replies(records: list[dict], editable: list[dict], cfg: SFTDataConfig, backend: Any, stats: Counter,
                   progress: bool) -> None:
    """Let a model write the early replies; a reply that leaks or runs long keeps the pool text."""
    if not editable:
        return
    backend = _backend(backend, cfg.replies.backend)
    params = SamplingParams(cfg.replies.max_new_tokens, cfg.replies.temperature, 1.0, cfg.seed)
    prompts = []
    for edit in editable:
        record = records[edit["record"]]
        said = [msg["content"] for msg in record["messages"][:edit["message"]] if msg["role"] == "user"]
        listing = "\n".join(f"- {text}" for text in said)
        prompts.append([{"role": "system", "content": REPLY_PROMPT.format(task=record["task"])},
                        {"role": "user", "content": f"The user's messages so far:\n{listing}\n\n"
                         + REPLY_ASKS[edit["kind"]].format(hint=edit["hint"])}])
    for edit, generation in zip(editable, _chat(backend, prompts, params, "writing replies", progress)):
        text = generation.text.strip().strip('"').strip()
        problem = "cut off at max_new_tokens" if generation.finish_reason != "stop" else \
            reply_problem(text, edit["kind"], edit, cfg.replies.max_words)
        if problem is not None:
            stats["replies_llm_rejected"] += 1
            stats[f"replies_llm_rejected/{problem}"] += 1
            continue
        records[edit["record"]]["messages"][edit["message"]]["content"] = text
        stats["replies_llm"] += 1


def card(records: list[dict], sources: list[dict], stats: Counter, cfg: SFTDataConfig) -> dict:
    """The data card: where the corpus came from and what is in it."""
    by_kind = Counter(record["kind"] for record in records)
    replies = Counter(kind for record in records for kind in record["reply_kinds"])
    total_replies = sum(replies.values())
    turns = {kind: [sum(m["role"] == "user" for m in r["messages"]) for r in records if r["kind"] == kind]
             for kind in KINDS}
    early_trained = replies["defer"] + replies["ask"]
    all_turns = [t for kind_turns in turns.values() for t in kind_turns]
    return {
        "file": str(cfg.out),
        "built_by": "fic sft-data",
        "seed": cfg.seed,
        "sources": sources,
        "evaluation_excluded": _exclusion_summary(sources, cfg),
        "instances": len({r["task_id"] for r in records}),
        "conversations": len(records),
        "conversations_by_kind": {kind: by_kind[kind] for kind in KINDS},
        "share_by_kind": {kind: round(by_kind[kind] / max(len(records), 1), 4) for kind in KINDS},
        "reply_kinds": {kind: replies[kind] for kind in REPLY_KINDS},
        "reply_kind_shares": {kind: round(replies[kind] / max(total_replies, 1), 4) for kind in REPLY_KINDS},
        "asks_specific": stats["ask_specific"],
        "user_turns": {"verbatim": sum(1 for r in records for m in r["messages"] if m["role"] == "user")
                       - stats["user_rephrased"], "rephrased": stats["user_rephrased"],
                       "rephrase_rejected": stats["user_rephrase_rejected"],
                       "rejected_because": _reasons(stats, "user_rephrase_rejected/")},
        "early_replies": {"pool": early_trained - stats["replies_llm"], "llm": stats["replies_llm"],
                          "llm_rejected": stats["replies_llm_rejected"],
                          "rejected_because": _reasons(stats, "replies_llm_rejected/")},
        "mean_user_turns": round(sum(all_turns) / max(len(all_turns), 1), 3),
        "mean_user_turns_by_kind": {k: round(sum(t) / len(t), 3) if t else 0.0 for k, t in turns.items()},
        "config": config_to_dict(cfg),
    }


def _reasons(stats: Counter, prefix: str) -> dict:
    return {key[len(prefix):]: n for key, n in stats.most_common() if key.startswith(prefix)}


def _exclusion_summary(sources: list[dict], cfg: SFTDataConfig) -> dict:
    """The card's record of evaluation data kept out: what was named, and the overlap found
    (by task id, prompt, template) and dropped over every source."""
    overlap = {why: sum(s["evaluation_overlap"][why] for s in sources) for why in ("task_id", "prompt", "template")}
    return {"sources": list(cfg.exclude.sources), "on_overlap": cfg.exclude.on_overlap,
            "templates": cfg.exclude.templates, "overlap": overlap, "dropped": sum(overlap.values())}


def card_markdown(info: dict) -> str:
    lines = [f"# SFT corpus `{Path(info['file']).name}`", "",
             f"Built by `fic sft-data` with seed {info['seed']}: {info['conversations']} conversations "
             f"from {info['instances']} instances; mean {info['mean_user_turns']} user turns.", "",
             "| source | loaded | sharded here | kept | dropped |", "|---|---|---|---|---|"]
    for s in info["sources"]:
        dropped = "; ".join(f"{n} x {why}" for why, n in s["dropped"].items()) or "-"
        lines.append(f"| `{s['spec']}` | {s['loaded']} | {s['sharded_here']} | {s['kept']} | {dropped} |")
    for s in info["sources"]:
        if s.get("origin"):
            o = s["origin"]
            lines.append(f"\n`{s['spec']}`: {o['repository'] or o['path']}, revision {o.get('commit') or o.get('revision') or 'not pinned'}, "
                         f"config {o.get('config') or '-'}, split {o.get('split') or '-'}, {o['rows']} rows; fields "
                         + ", ".join(f"`{k}` <- `{c}`" for k, c in o["fields"].items()) + ".")
    excluded = info["evaluation_excluded"]
    named = ", ".join(f"`{spec}`" for spec in excluded["sources"]) or "none named (`exclude.sources`)"
    lines += ["", f"Evaluation data kept out: {named}{' and their templates' if excluded['templates'] else ''}; "
              f"overlap found and dropped: {excluded['dropped']} "
              f"({', '.join(f'{n} by {why}' for why, n in excluded['overlap'].items())})."]
    lines += ["", "| conversation kind | count | share |", "|---|---|---|"]
    lines += [f"| {k} | {n} | {info['share_by_kind'][k]:.1%} |" for k, n in info["conversations_by_kind"].items()]
    lines += ["", "| reply kind | count | share |", "|---|---|---|"]
    lines += [f"| {k} | {n} | {info['reply_kind_shares'][k]:.1%} |" for k, n in info["reply_kinds"].items()]
    lines += ["", f"Asks naming the specific missing detail: {info['asks_specific']} of {info['reply_kinds']['ask']}.",
              f"User turns: {info['user_turns']}. Early replies: {info['early_replies']}.", "",
              "`premature` turns (recovery conversations) are in the context with `train: false`: out of the loss.",
              ""]
    return "\n".join(lines)


def build_corpus(cfg: SFTDataConfig, *, user_backend: Any = None, reply_backend: Any = None,
                 progress: bool = True) -> dict:
    """Load, build, and write the corpus and its data card atomically; return the card."""

    check_writable(cfg.out, field="out")  # before a source is generated or a model loads
    instances, sources, line = plan(cfg)
    print(line, flush=True)  # stdout: stderr is for the one-line error
    records, stats = make_corpus(instances, cfg, user_backend=user_backend, reply_backend=reply_backend,
                                 progress=progress)
    info = card(records, sources, stats, cfg)
    card_json, card_md = card_paths(cfg.out)
    # The corpus and its card are renamed into place together: never a corpus without its card.
    write_together({cfg.out: lambda h: h.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                    card_json: lambda h: h.write(json.dumps(info, indent=2, ensure_ascii=False) + "\n"),
                    card_md: lambda h: h.write(card_markdown(info))})
    return info
