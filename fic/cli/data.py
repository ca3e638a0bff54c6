"""The data verbs: `prepare-model`, `shard`, `views`, `masks`."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from fic.backends import make_backend
from fic.core.bounds import MAX_INSTANCES, MAX_REPEATS, MAX_RETRIES, MAX_SEED, MAX_TOKENS, check_flags
from fic.core.chat import format_masks, record_error, render_chat
from fic.core.config import config_to_dict, load_config
from fic.core.errors import FicError
from fic.core.files import check_writable, write_json, write_jsonl
from fic.core.generation import BackendConfig
from fic.core.instance import Instance
from fic.core.records import read_records
from fic.data.hub import ANSWER_FROM
from fic.data.llm_sharder import shard_with_llm
from fic.data.sources import (
    InstancesSection,
    ShardedInstances,
    Sharder,
    describe_loaded,
    load_sharded,
    read_instance,
)
from fic.data.views import VIEWS, format_view, render_view
from fic.evaluation.shard_validation import validate_shards
from fic.tasks.base import PROMPT_STYLES


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    if verb == "prepare-model":
        parser.add_argument("--out", default=None, help="output folder (default: models/smollm2-135m-instruct)")
        parser.add_argument("--force", action="store_true", help="rebuild even if the folder is already prepared")
    elif verb == "shard":
        parser.add_argument("--data", default=None, metavar="FILE",
                            help="a data YAML naming the dataset once (the keys of any recipe's `data:` section: "
                            "source, task, limit, seed, fields, answer_from); the same file goes in every verb's "
                            "config as `data: FILE` (docs/data.md). Instead of --source, --task, --fields, "
                            "--answer-from, --limit and --seed")
        parser.add_argument("--source", default=None,
                            help="lic:PATH, gsm8k[:SPLIT|:PATH], reasoning-gym:NAME, actions-gen:SPLIT[START:STOP] "
                            "(with --task actions), jsonl:PATH, or hf:REPO[@REVISION][:CONFIG][:SPLIT] / hf:PATH "
                            "(a dataset on the hub, a save_to_disk folder, a Parquet, CSV or JSON file)")
        parser.add_argument("--task", default=None, help="task of the instances (default: math)")
        parser.add_argument("--fields", default=None, metavar="KEY=COLUMN,...",
                            help="hf: sources: which column holds each task key, e.g. question=problem,answer=solution "
                            "(keys not given are read from the column of their own name)")
        parser.add_argument("--answer-from", default=None, choices=ANSWER_FROM,
                            help="hf: sources, task math: the answer column is a solution ending '#### n' (hash), "
                            "one with \\boxed{} (boxed), the answer itself (value), or the first that fits (auto)")
        parser.add_argument("--out", required=True, help="output JSONL file (LiC schema, one instance a line); beside "
                            "it STEM.rejected.jsonl (what was left out, with why) and, for an hf: source, "
                            "STEM.card.json (where it came from), STEM being the file without its extension")
        parser.add_argument("--sharder", default="rule", choices=["rule", "llm"],
                            help="how to shard instances that have no shards yet: rule (math, offline) or llm "
                            "(a model, any task; needs --sharder-config) (default: rule)")
        parser.add_argument("--sharder-config", default=None, metavar="FILE",
                            help="backend YAML of the sharder model (keys of `model:` in an eval recipe: "
                            "kind, model, device, ...)")
        parser.add_argument("--retries", type=int, default=2,
                            help="llm sharder: ask again this many times when the output fails a check (default: 2)")
        parser.add_argument("--limit", type=int, default=None, help="at most this many instances")
        parser.add_argument("--seed", type=int, default=None,
                            help="seed for generated sources and phrasing (default: 0; a verb that reads the same "
                            "unsharded source shards it with its data.seed: the same seed gives the same shards)")
        parser.add_argument("--reshard", action="store_true",
                            help="re-shard instances that already have shards instead of keeping them")
        parser.add_argument("--validate", default=None, metavar="MODEL_CONFIG",
                            help="backend YAML of a model: keep an instance only if its concat and shuffle-concat "
                            "scores reach --validate-threshold x its full score over --validate-runs runs")
        parser.add_argument("--validate-runs", type=int, default=3, help="validation runs per view (default: 3)")
        parser.add_argument("--validate-temperature", type=float, default=1.0,
                            help="validation sampling temperature (default: 1.0; 0 is greedy)")
        parser.add_argument("--validate-threshold", type=float, default=0.8,
                            help="share of the full score concat and shuffle-concat must reach (default: 0.8, LiC)")
        parser.add_argument("--validate-max-new-tokens", type=int, default=384,
                            help="most tokens of one validation reply (default: 384)")
    elif verb == "views":
        parser.add_argument("--data", required=True, help="sharded instances (JSONL or LiC JSON)")
        parser.add_argument("--view", required=True, help="full, concat, shuffle-concat, sharded, recap or snowball")
        parser.add_argument("--out", default=None, help="output JSONL file of rendered views")
        parser.add_argument("--show", type=int, default=0, metavar="N", help="print the first N rendered views")
        parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle-concat order")
        parser.add_argument("--prompts", default="fic", choices=PROMPT_STYLES,
                            help="wording: fic (FiC's own, default) or lic (Lost in Conversation's verbatim)")
    elif verb == "masks":
        parser.add_argument("--model", required=True, help="model or tokenizer folder whose chat template is used")
        parser.add_argument("--data", required=True,
                            help="JSONL of conversations with a 'messages' list (e.g. an SFT corpus)")
        parser.add_argument("--show", type=int, default=1, metavar="N", help="how many conversations to print")
        parser.add_argument("--trust-remote-code", action="store_true", help="allow custom tokenizer code")


def run(args: argparse.Namespace) -> int:
    return {"prepare-model": prepare_model, "shard": shard, "views": views, "masks": masks}[args.verb](args)


def prepare_model(args: argparse.Namespace) -> int:
    from fic.bundled.prepare import prepare_model as prepare
    from fic.core.model import BUNDLED_MODEL_DIR  # lazy: loads torch; shard and views need none

    out = Path(args.out) if args.out else BUNDLED_MODEL_DIR
    check_writable(out, folder=True, field="--out")
    out = prepare(out, force=args.force)
    print(f"bundled model ready in {out}")
    return 0


def shard(args: argparse.Namespace) -> int:

    _check_shard_args(args)
    check_writable(args.out, field="--out")  # before a generator runs or a model loads
    section = shard_section(args)

    def llm_sharder(instances: list[Instance]) -> tuple[list[Instance], list[tuple[Instance, str]]]:
        # The model loads only once the data has loaded and something needs sharding.
        backend = _backend_from_yaml(args.sharder_config, "--sharder-config")
        return shard_with_llm(instances, backend, retries=args.retries, seed=section.seed)

    # --validate plays and scores the views; writing the file alone scores nothing
    everything = _load_for_shard(section, llm_sharder if args.sharder == "llm" else None, args.reshard,
                                 scored=bool(args.validate))
    (loaded,) = everything.sources
    print("fic shard: " + describe_loaded(everything, section, section="", limit_set_in=args.data or
                                          ("command line" if args.limit is not None else None),
                                          sharder=f"the {args.sharder} sharder"))
    if loaded.origin is not None:
        print(describe_origin(loaded.origin))
    kept, rejected, reasons = loaded.instances, [], Counter()

    def reject(instance, reason: str, stage: str, **extra) -> None:
        reasons[f"{stage}: {reason}" if stage != "shard" else reason] += 1
        rejected.append({**instance.to_dict(), "rejected_reason": reason, "rejected_stage": stage, **extra})

    for instance, reason in loaded.rejected:
        reject(instance, reason, "shard")
    if kept and args.validate:

        verdicts = validate_shards(kept, _backend_from_yaml(args.validate, "--validate"), runs=args.validate_runs,
                                   temperature=args.validate_temperature, threshold=args.validate_threshold,
                                   max_new_tokens=args.validate_max_new_tokens, seed=section.seed)
        kept = [v.instance for v in verdicts if v.keep]
        for verdict in verdicts:
            if not verdict.keep:
                reject(verdict.instance, verdict.reason, "validate", validation_scores=verdict.scores)
        unsolved = sum(1 for v in verdicts if v.keep and v.scores["full"] == 0)
        print(f"validation kept {len(kept)} of {len(verdicts)}"
              + (f" ({unsolved} kept without evidence: the model never solved their full view)" if unsolved else ""))
    rejected_path = Path(args.out).with_suffix(".rejected.jsonl")
    if rejected:  # written first: when nothing is kept, the reasons are what the user needs
        write_jsonl(rejected_path, rejected)
    if not kept:
        raise FicError(f"no instance was kept ({dict(reasons.most_common(3))}); see {rejected_path}",
                       field="--source")
    count = write_jsonl(args.out, (instance.to_dict() for instance in kept))
    print(f"wrote {count} sharded instances to {args.out}")
    if loaded.origin is not None:  # where they came from, which the JSONL alone no longer says
        card = Path(args.out).with_suffix(".card.json")
        write_json(card, {"file": args.out, "built_by": "fic shard", "origin": loaded.origin, "written": count,
                          "rejected": len(rejected), "sharder": args.sharder, "seed": section.seed,
                          "data": config_to_dict(section)})
        print(f"data card: {card}")
    if rejected:
        summary = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common(5))
        print(f"dropped {len(rejected)} ({summary}); see {rejected_path}")
    return 0


SECTION_OPTIONS = {"source": "--source", "task": "--task", "fields": "--fields", "answer_from": "--answer-from",
                   "limit": "--limit", "seed": "--seed"}


def shard_section(args: argparse.Namespace) -> InstancesSection:
    """The data section `fic shard` reads: a data YAML (`--data`), else the options."""
    given = [option for name, option in SECTION_OPTIONS.items() if getattr(args, name) is not None]
    if args.data is not None:
        if given:
            raise FicError(f"--data names the whole dataset; set {given[0].lstrip('-').replace('-', '_')} in "
                           f"{args.data} instead of {given[0]}", field=given[0])
        section = load_config(InstancesSection, args.data)
        if len(section.source) != 1:
            raise FicError(f"fic shard writes one source to one file; the data YAML names {len(section.source)}",
                           path=args.data, field="source")
        return section
    if args.source is None:
        raise FicError("give --source SPEC (or --data FILE, a data YAML)", field="--source")
    return InstancesSection(source=[args.source], task=args.task or "math", limit=args.limit, seed=args.seed or 0,
                            fields=parse_fields(args.fields), answer_from=args.answer_from or "auto")


def _load_for_shard(section: InstancesSection, sharder: Sharder | None, reshard: bool,
                    scored: bool) -> ShardedInstances:
    try:
        section.check("command line")
        return load_sharded(section, sharder=sharder, reshard=reshard, progress=True, scored=scored)
    except FicError as err:  # the settings of `fic shard` are options, not config keys
        name = (err.field or "").removeprefix("data.")
        option = {"source": "--source", "task": "--task", "answer_from": "--answer-from"}.get(name)
        if name.startswith("fields"):
            option = f"--fields {name[len('fields.'):]}" if "." in name else "--fields"
        message = err.message.replace("data.answer_from=", "--answer-from ")
        message = re.sub(r"\(data\.fields\.(\w+)=COLUMN; fic shard: (--fields \w+=COLUMN)\)", r"(\2)", message)
        raise FicError(message, path=None if err.path == "command line" else err.path, record=err.record,
                       field=option or err.field) from None


def parse_fields(text: str | None) -> dict[str, str]:
    """`question=problem,answer=solution` as a mapping; a malformed pair is a one-line error."""
    if not text:
        return {}
    mapping = {}
    for pair in text.split(","):
        key, _, column = pair.partition("=")
        if not key.strip() or not column.strip():
            raise FicError(f"expected KEY=COLUMN pairs separated by commas, got {pair!r}", field="--fields")
        mapping[key.strip()] = column.strip()
    return mapping


def describe_origin(origin: dict) -> str:
    """One line: which dataset, revision, config and split, and how its columns were mapped."""
    where = origin["repository"] or origin["path"]
    revision = origin.get("commit") or origin.get("revision")
    parts = [f"{where}{'@' + revision if revision else ''}"]
    parts += [f"{k} {origin[k]}" for k in ("config", "split") if origin.get(k)]
    mapping = ", ".join(f"{key}<-{column}" for key, column in origin["fields"].items())
    skipped = "; ".join(f"{n} skipped: {why}" for why, n in origin.get("skipped", {}).items())
    return f"{origin['source']}: {', '.join(parts)}, {origin['rows']} rows; fields {mapping}" + \
        (f"; {skipped}" if skipped else "")


def _check_shard_args(args: argparse.Namespace) -> None:
    check_flags(args, {"--limit": (1, MAX_INSTANCES), "--retries": (0, MAX_RETRIES), "--validate-runs": (1, MAX_REPEATS),
                       "--validate-max-new-tokens": (1, MAX_TOKENS), "--seed": (0, MAX_SEED)})
    if args.sharder == "llm" and not args.sharder_config:
        raise FicError("--sharder llm needs --sharder-config FILE (a backend YAML: kind, model, ...)",
                       field="--sharder-config")
    if args.sharder_config and args.sharder != "llm":
        raise FicError("--sharder-config is only used with --sharder llm", field="--sharder-config")
    if args.validate_temperature < 0:
        raise FicError(f"expected a value >= 0, got {args.validate_temperature}", field="--validate-temperature")
    if not 0 < args.validate_threshold <= 1:
        raise FicError(f"expected a value in (0, 1], got {args.validate_threshold}", field="--validate-threshold")


def _backend_from_yaml(path: str, option: str):
    """A backend from a YAML of BackendConfig keys; a file missing or wrong is a FicError naming it."""

    if not Path(path).is_file():
        raise FicError("backend config not found", path=path, field=option)
    cfg = load_config(BackendConfig, path)
    if not cfg.model:  # nested backends are checked by their owner, which knows whether one is used
        raise FicError("missing the model to load or call", path=path, field="model")
    return make_backend(cfg)


def read_sharded_file(path: str) -> list[Instance]:
    """Sharded instances of any task from a JSONL or LiC JSON file."""

    return [read_instance(record, path=path, record_no=number)
            for number, record in enumerate(read_records(path), start=1)]


def views(args: argparse.Namespace) -> int:

    if args.view not in VIEWS:
        raise FicError(f"expected one of {', '.join(VIEWS)}, got {args.view!r}", field="--view")
    if args.out:
        check_writable(args.out, field="--out")
    records = [render_view(instance, args.view, seed=args.seed, prompts=args.prompts)
               for instance in read_sharded_file(args.data)]
    for record in records[: args.show]:
        print(format_view(record) + "\n")
    if args.out:
        write_jsonl(args.out, records)
        print(f"wrote {len(records)} {args.view} views to {args.out}")
    elif not args.show:
        raise FicError("nothing to do: give --out FILE and/or --show N", field="--out")
    return 0


def masks(args: argparse.Namespace) -> int:
    from fic.core.model import load_tokenizer  # lazy: loads torch and transformers
    from fic.core.templates import template_note

    tokenizer = load_tokenizer(args.model, trust_remote_code=args.trust_remote_code, quiet=True)
    # the template the masks come from, first: a training variant renders differently from the folder's own
    note = template_note(tokenizer) or "chat template: the model folder's own"
    print(f"fic masks: {note} ({args.model})")
    records = read_records(args.data)
    for number, record in enumerate(records[: args.show], start=1):
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages:
            raise FicError("expected a non-empty 'messages' list", path=args.data, record=number, field="messages")
        try:
            rendered = render_chat(tokenizer, messages)
        except FicError as err:  # the template's or the record's fault: say which record of which file
            raise record_error(err, args.data, number) from None
        print(f"== {args.data} record {number}")
        print(format_masks(tokenizer, rendered) + "\n")
    return 0
