"""One step's accumulation window before any model runs (`step_rows`, model-free): the played
rollouts, the step's anchor conversations and the plug-ins' rows as the student's rows, cut into
`train.grad_accum_steps` micro-batches, each with what every network that a term reads must
read for it (`Reads`: the teacher's (prompt, reply) sequences and positions, the reference's).
`fic.training.vasd.teacher.teacher_pass` turns them into batches with hidden states."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from fic.training.data import IGNORE, Example, padded_width
from fic.training.vasd import terms as plugins
from fic.training.vasd.prompts import teacher_prompts, teacher_views
from fic.training.vasd.rows import (
    Reply,
    Rollout,
    Tables,
    anchor_row,
    empty_row,
    gold_row,
    reply_targets,
    rollout_from,
    shared_prefix_rows,
    student_row,
    teacher_pairs,
    trains,
)
from fic.training.vasd.term import Term

# Why a rollout is left out of the divergence: it ended before the last shard (the conversation
# outgrew rollout.max_conversation_tokens), the teacher's prompt is over teacher.max_prompt_tokens,
# or its final reply was cut by rollout.max_new_tokens (unless loss.keep_truncated).
LEFT_OUT = ("cut_before_last_shard", "teacher_prompt_too_long", "truncated_final")


@dataclass
class Reads:
    """What one network reads for one micro-batch: sequences, and the positions of each whose
    hidden states the loss takes (rows in order: sequence by sequence, positions as listed);
    `share`: sequences that start like the one before them may ride on its row as branches."""

    sequences: list[list[int]]
    positions: list[list[int]]
    share: bool = False


@dataclass
class MicroBatch:
    """One micro-batch: the student's `rows`, and for each network a term reads (`Term.reads`)
    one `Reads` per slot (the teacher: one per view); `empty`: nothing of the step landed here,
    so its one row is a stand-in token."""

    rows: list[dict]
    reads: dict[str, list[Reads]]
    empty: bool = False


def distilled_replies(cfg: Any, rollout: Rollout, conv: Any, tokenizer: Any) -> tuple[list[Reply], str | None]:
    """The replies of a rollout the divergence is taken on (the final one, reading
    `teacher.view`; plug-ins may add or reweigh replies, e.g. per-turn views), or ([], the
    `LEFT_OUT` reason it is not distilled)."""
    replies = [Reply(rollout.final, teacher_prompts(tokenizer, conv.instance, teacher_views(cfg)))]
    for plugin in plugins.PLUGINS:
        if plugin.replies is not None:
            replies = plugin.replies(cfg, conv, rollout, tokenizer, replies)
    if max(len(prompt) for reply in replies for prompt in reply.prompts) > cfg.teacher.max_prompt_tokens:
        return [], "teacher_prompt_too_long"
    if not rollout.finished and not cfg.loss.keep_truncated:
        return [], "truncated_final"  # distilled anyway under keep_truncated: not left out
    return replies, None


def own_tables(cfg: Any, rollout: Rollout, terms: Sequence[Term]) -> Tables:
    """The terms a rollout's own row trains, with their targets and weights: the divergence at
    its distilled replies and each plug-in's own targets (`PlugIn.own`), those with any."""
    tables = {"distill": reply_targets(rollout)} if rollout.replies else {}
    for plugin in plugins.of(terms):
        if plugin.own is not None:
            tables[plugin.name] = plugin.own(cfg, rollout)
    return {name: table for name, table in tables.items() if trains(table[0])}


def step_rows(cfg: Any, convs: list, anchors: Sequence[Example], tokenizer: Any, terms: Sequence[Term], *,
              values: dict[str, list[float]] | None = None, share_prefixes: bool = False
              ) -> tuple[list[MicroBatch], Counter]:
    """The G micro-batches of one step, always G of them, and counts of the rollouts left out of
    the divergence, once each under the first reason that applies (`LEFT_OUT`), their total
    (`rollouts`) and the micro-batches that had nothing to train (`empty_micro_batches`).
    `values` (plug-in -> one per conv, e.g. the reward's advantages) land in `rollout.values`.

    Every row of the step (rollouts, anchors, plug-ins' gold rows) is one sequence; rows that
    train nothing are dropped, and the rest are cut, by length, into G groups of similar widths
    (`length_groups`), so a short gold row is never padded to the longest rollout. With
    `share_prefixes` a rollout's gold rows, which start with its own ids, ride on its row as
    branches (`shared_prefix_rows`), and so may its teacher sequences on one another (one system
    prompt, a few words of request apart). The loss is normalised over the whole window, so the
    grouping and the sharing change the passes' shapes, not the update."""
    names = {term.name for term in terms}
    counts: Counter = Counter({name: 0 for name in (*LEFT_OUT, "empty_micro_batches")})
    played = []  # (conv, rollout) of the conversations that reached the last shard
    for index, conv in enumerate(convs):
        if conv.stop_reason != "last_turn":
            counts["cut_before_last_shard"] += 1
            continue
        rollout = rollout_from(conv)
        rollout.values = {name: per_conv[index] for name, per_conv in (values or {}).items()}
        if "distill" in names:
            rollout.replies, reason = distilled_replies(cfg, rollout, conv, tokenizer)
            if reason:
                counts[reason] += 1
        played.append((conv, rollout))
    counts["rollouts"] = sum(counts[reason] for reason in LEFT_OUT)
    first = (cfg.anchor.first_tokens, cfg.anchor.first_token_weight)  # gold replies weigh their first tokens alike
    # (rollout and its own tables, or None; row): a rollout's first row is its own when it trains something
    items: list[tuple[tuple[Rollout, Tables] | None, dict]] = []
    for conv, rollout in played:
        own = own_tables(cfg, rollout, terms)
        rows = [student_row(rollout.ids, own)] if own else []
        for plugin in plugins.of(terms):
            if plugin.gold is not None:
                rows += [gold_row(plugin.name, gold, *first) for gold in plugin.gold(cfg, conv, tokenizer)]
        if share_prefixes and len(rows) > 1:
            rows = shared_prefix_rows(rows)
        items += [((rollout, own) if own and i == 0 else None, row) for i, row in enumerate(rows)]
    items += [(None, anchor_row(example, *first)) for example in anchors]
    views = len(teacher_views(cfg))
    micro_batches = []
    for group in length_groups([len(row["input_ids"]) for _, row in items], cfg.train.grad_accum_steps,
                               cfg.train.pad_to_multiple):
        chosen = [items[i] for i in group]
        part = [owned for owned, _ in chosen if owned is not None]  # in row order: the networks' rows follow
        rows = [row for _, row in chosen]
        if not rows:
            # Nothing of the step landed here. It still runs (one token, no target: every term a
            # zero with a gradient graph, the teacher and reference passes on a stand-in), so each
            # rank does the same G forward and backward passes with the same collective calls,
            # and the accumulation window stays in step with accelerate's gradient sync.
            counts["empty_micro_batches"] += 1
        reads = {}
        for term in terms:
            if term.reads == "teacher":
                pairs = [[pair for rollout, _ in part for pair in teacher_pairs(rollout, v)] for v in range(views)]
                reads["teacher"] = [Reads([p + r for p, r in slot],
                                          [list(range(len(p) - 1, len(p) - 1 + len(r))) for p, r in slot],
                                          share=share_prefixes) for slot in pairs]
            elif term.reads is not None:  # the student's own ids, at this term's targets
                reads[term.reads] = [Reads([rollout.ids for rollout, _ in part],
                                           [[t for t, y in enumerate(own[term.name][0]) if y != IGNORE]
                                            if term.name in own else [] for _, own in part])]
        micro_batches.append(MicroBatch(rows or [empty_row(tokenizer.pad_token_id)], reads, empty=not rows))
    return micro_batches, counts


def length_groups(lengths: list[int], groups: int, multiple: int = 0) -> list[list[int]]:
    """Indices of `lengths` cut into `groups` runs of the length-sorted order (some possibly
    empty) with the fewest padded positions in all (sum over runs of rows x the width the run is
    collated at: its longest row rounded up to a multiple of `multiple`, as `collate_rows` pads;
    ties: the smaller largest run), found exactly by dynamic programming over the cut points.
    Rows of one run are kept in their original order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    sizes = [lengths[i] for i in order]
    n = len(order)

    def padded(a: int, b: int) -> int:  # the run order[a:b] at its collated width (the last row: sorted)
        return (b - a) * padded_width([sizes[b - 1]], multiple) if b > a else 0

    # best[(g, end)]: the least (total padded, largest run) splitting order[:end] into g runs, and its cuts
    best: dict[tuple[int, int], tuple[tuple[int, int], list[int]]] = {(0, 0): ((0, 0), [])}
    for g in range(1, groups + 1):
        for end in range(n + 1):
            options = [((total + padded(start, end), max(largest, padded(start, end))), cuts + [end])
                       for start in range(end + 1) if (g - 1, start) in best
                       for (total, largest), cuts in [best[(g - 1, start)]]]
            if options:
                best[(g, end)] = min(options, key=lambda option: option[0])
    cuts = [0] + best[(groups, n)][1]
    return [sorted(order[cuts[k]:cuts[k + 1]]) for k in range(groups)]
