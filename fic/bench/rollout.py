"""`fic bench rollout`: conversations played one at a time vs in lockstep batches.

The same conversations (instances in one view, verbatim user, rule classifier, greedy
decoding, every turn played up to `--turns`) are played twice with one loaded model: first
one conversation at a time (a generation call per turn of each conversation), then all
together by the lockstep simulator (a generation call per turn for all of them). Printed:
conversations/s and generated tokens/s of each, their ratio (`ratio` = lockstep
conversations/s over one-at-a-time conversations/s), the share of replies that came out
identical both ways (greedy batched decoding equals unbatched up to floating-point ties), and
the prompt tokens each way fed the model. Both ways use the hf backend's key/value reuse
between turns (`--kv-reuse-mb`, 0 for none) and start from an empty store.
"""

from __future__ import annotations

import argparse
import copy
import time

from fic.backends import make_backend
from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import Conversation, play
from fic.conversation.users import VerbatimUser
from fic.core.errors import FicError
from fic.core.generation import BackendConfig, SamplingParams
from fic.data.sources import load_source, shard_rule
from fic.tasks.sharding import ShardingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="models/smollm2-135m-instruct",
                        help="checkpoint folder (default: the bundled model; make it with `fic prepare-model`)")
    parser.add_argument("--source", default="reasoning-gym:gsm_symbolic",
                        help="instances (fic.data.sources spec; unsharded ones are sharded with the rule sharder)")
    parser.add_argument("--task", default="math", help="task of the instances (default: math)")
    parser.add_argument("--view", default="sharded", help="view to play (default: sharded)")
    parser.add_argument("--conversations", type=int, default=16, help="conversations (default: 16)")
    parser.add_argument("--turns", type=int, default=3, help="most turns played per conversation (default: 3)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="most tokens per reply (default: 32)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default: auto)")
    parser.add_argument("--dtype", default="auto", help="weights dtype (default: auto)")
    parser.add_argument("--seed", type=int, default=0, help="seed of generated sources (default: 0)")
    parser.add_argument("--kv-reuse-mb", type=float, default=2048,
                        help="memory for keys and values kept between turns; 0 re-reads every "
                             "conversation in full each turn (default: 2048)")


def _instances(args: argparse.Namespace) -> list:

    # Ask for more than needed: some generated problems cannot be sharded.
    found = []
    for instance in load_source(args.source, args.task, limit=4 * args.conversations, seed=args.seed):
        if args.view != "full" and not instance.is_sharded:
            try:
                instance = shard_rule(instance, seed=args.seed)
            except ShardingError:
                continue
        found.append(instance)
    if not found:
        raise FicError("no usable instance in the source", field="--source")
    # Fewer instances than conversations: repeat them (greedy decoding plays them the same way).
    return [found[i % len(found)] for i in range(args.conversations)]


def measure(args: argparse.Namespace) -> dict:

    for name in ("conversations", "turns", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise FicError(f"expected a positive number, got {getattr(args, name)}", field="--" + name.replace("_", "-"))
    if args.kv_reuse_mb < 0:
        raise FicError(f"expected 0 (no reuse) or more MiB, got {args.kv_reuse_mb}", field="--kv-reuse-mb")
    instances = _instances(args)
    backend = make_backend(BackendConfig(model=args.model, device=args.device, dtype=args.dtype,
                                         batch_size=args.conversations, kv_reuse_mb=args.kv_reuse_mb))
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    user, classifier = VerbatimUser(), RuleClassifier()

    def fresh() -> list:
        return [Conversation(copy.deepcopy(instance), args.view, run=i) for i, instance in enumerate(instances)]

    def timed(groups: list[list]) -> tuple[float, list, int]:
        played = []
        # Both ways start with nothing reused: the store would otherwise hold the first way's turns.
        store = getattr(backend, "kv_store", None)
        if store is not None:
            store.clear()
        fed_before = getattr(backend, "fed_tokens", 0)
        start = time.perf_counter()
        for group in groups:
            played += play(group, backend, user, classifier, params, batch_size=len(group),
                           stop_at_correct=False, max_turns=args.turns)
        return time.perf_counter() - start, played, getattr(backend, "fed_tokens", 0) - fed_before

    # Warm-up: the first forward pass pays for allocations and kernel selection.
    play(fresh()[:1], backend, user, classifier, SamplingParams(max_new_tokens=4), max_turns=1)
    one_s, one, fed_one = timed([[conv] for conv in fresh()])
    batch_s, batched, fed_batch = timed([fresh()])
    n = len(instances)
    tokens_one = sum(t.reply_tokens for conv in one for t in conv.turns)
    tokens_batch = sum(t.reply_tokens for conv in batched for t in conv.turns)
    pairs = [(a.reply, b.reply) for x, y in zip(one, batched) for a, b in zip(x.turns, y.turns)]
    return {
        "conversations": n,
        "turns": sum(len(conv.turns) for conv in batched),
        "max_new_tokens": args.max_new_tokens,
        "kv_reuse": getattr(backend, "kv_store", None) is not None,
        "one_at_a_time_prompt_tokens_fed": fed_one,
        "lockstep_prompt_tokens_fed": fed_batch,
        "one_at_a_time_s": one_s,
        "lockstep_s": batch_s,
        "one_at_a_time_conversations_per_s": n / one_s,
        "lockstep_conversations_per_s": n / batch_s,
        "one_at_a_time_tokens_per_s": tokens_one / one_s,
        "lockstep_tokens_per_s": tokens_batch / batch_s,
        "tokens_per_s_ratio": (tokens_batch / batch_s) / (tokens_one / one_s) if tokens_one else None,
        "same_replies": sum(a == b for a, b in pairs) / len(pairs) if pairs else None,
        "ratio": (n / batch_s) / (n / one_s),
    }
