"""`fic self-label --model PATH --source SPEC --out FILE`: instances whose reference answers are
the model's own filtered greedy calls, the originals dropped (`fic.corpus.self_label`)."""

from __future__ import annotations

import argparse

from fic.backends import make_backend
from fic.core.bounds import MAX_BATCH, MAX_SEED, MAX_TOKENS, check_flags
from fic.core.errors import FicError
from fic.core.files import check_writable
from fic.core.generation import BackendConfig
from fic.corpus.self_label import KEEP, VIEWS, card_path, label, replies, write_self_labelled
from fic.data.sources import load_source


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--model", required=True, help="the model that labels: a checkpoint folder (hf backend)")
    parser.add_argument("--source", required=True,
                        help="sharded instances of task actions, e.g. jsonl:FILE or actions-gen:test-unseen[768:1368]")
    parser.add_argument("--seed", type=int, default=0, help="seed of a generated source (default 0)")
    parser.add_argument("--out", required=True, help="output JSONL file (LiC schema); its card beside it")
    parser.add_argument("--keep", default="agreeing", choices=KEEP,
                        help="agreeing: the filter (both views agree, listed function, required arguments, values "
                        "stated in the request; self-training data); checked: the same filter on the full view's call alone "
                        "(for a model that asks rather than answers the concat view); any-call: every readable call of a listed "
                        "function, right or wrong, full view only (blinded prompts for VASD) (default agreeing)")
    parser.add_argument("--dtype", default="float32", help="weights dtype (default float32: replies that do not "
                        "depend on batch shapes)")
    parser.add_argument("--batch-size", type=int, default=32, help="prompts per generate call (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="reply length cap (default 64)")


def run(args: argparse.Namespace) -> int:
    check_flags(args, {"--seed": (0, MAX_SEED), "--batch-size": (1, MAX_BATCH), "--max-new-tokens": (1, MAX_TOKENS)})
    check_writable(args.out)
    instances = load_source(args.source, "actions", seed=args.seed)
    backend = make_backend(BackendConfig(model=args.model, dtype=args.dtype, batch_size=args.batch_size))
    full, concat = (replies(backend, instances, view, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
                    if view == "full" or args.keep == "agreeing" else None for view in VIEWS)
    records, dropped = label(instances, full, concat, args.keep)
    if not records:  # an empty corpus only fails later, in `fic sft-data`, far from its cause
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(dropped.items()))
        hint = ("; a model that asks a question in the concat view keeps nothing under agreeing: "
                "--keep checked applies the filter to the full view's call alone"
                if dropped["no call in the concat view's reply"] else "")
        raise FicError(f"no instance of {len(instances)} kept (dropped: {reasons}){hint}; nothing written",
                       path=args.out, field="--keep")
    card = write_self_labelled(args.out, records, dropped, model=args.model, source=args.source, keep=args.keep)
    reasons = ", ".join(f"{n} {why}" for why, n in card["dropped"].items()) or "none"
    print(f"wrote {card['kept']} of {card['instances']} instances to {args.out}, each answer the model's own call "
          f"(dropped: {reasons}); the original answers are in no file written; card: {card_path(args.out)}")
    return 0
