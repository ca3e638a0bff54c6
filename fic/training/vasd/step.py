"""VASD's step as one unit (`VASDStep`), taken by the recipe (`fic/train_vasd.py`) and timed by
`fic bench vasd`: rollouts on the current weights, the teacher (and reference) passes, the
student's forward and backward over the accumulation window, the optimizer step and the
rollout engine's refresh. Also the pieces it is made of: one step's micro-batches, the on-policy
labels, the rollout engine, and the figures logged about the rollouts.

Who plays teacher and reference is `fic.training.vasd.teacher`; the token layout and the loss
module are `fic.training.vasd.distill`.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from fic import tasks
from fic.backends import make_backend
from fic.backends.hf import HFBackend, column_major_linears
from fic.backends.vllm import colocated_engine, sync_weights
from fic.conversation.classify import make_classifier
from fic.conversation.simulator import answerable_by, make_conversations, play, unanswerable_answer_rate
from fic.conversation.users import make_user
from fic.core.chat import continue_ids, reply_ids
from fic.core.errors import FicError, cut_short_on_sigterm
from fic.core.generation import SamplingParams
from fic.core.seeding import derive_seed, seeded_rng
from fic.training import loop
from fic.training.data import DataOrder, Example, padded_width
from fic.training.losses import causal_lm, window_backward
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.distill import (
    TERMS,
    DistillLoss,
    GoldRow,
    Rollout,
    batch_counts,
    collate_rows,
    hidden_at,
    partial_prompts,
    rollout_from,
    shared_prefix_rows,
    student_rows,
    teacher_prompts,
)
from fic.training.vasd.reward import leave_one_out, reward_figures, rollout_reward
from fic.training.vasd.teacher import TeacherParts, teacher_parts, teacher_views

# Why a rollout is left out of the distillation: it ended before the last shard (the
# conversation outgrew rollout.max_conversation_tokens), the teacher's prompt is over
# teacher.max_prompt_tokens, or its final reply was cut by rollout.max_new_tokens (unless
# loss.keep_truncated).
LEFT_OUT = ("cut_before_last_shard", "teacher_prompt_too_long", "truncated_final")
EMA_FILE = "ema.safetensors"


class VASDStep:
    """One VASD optimizer step, `step(k)`, and what it holds between steps: the trained model
    behind `accelerator.prepare` (`loss_model`, `optimizer`, `scheduler`), the teacher and
    reference (`parts`), the rollout engine (`generator`, a bfloat16 decoding copy refreshed
    from the float32 masters after every update where the run computes in bf16), the simulated
    user and the data orders of rollout tasks and anchors. Where the run computes on a bfloat16
    copy of the weights (`fic.training.precision.Bf16Copy`), the teacher and student passes run
    on it and the frozen or moving-average teacher is held in bfloat16.

    A step's phases are methods, so the recipe reads them in order and `fic bench` can time
    each: `rollouts` (play the sharded conversations on-policy, every shard), `micro_batches`
    (student rows with the teacher's and reference's hidden states), `student` (forward and
    backward of every loss term over the window, each term normalised by its positions on all
    ranks), `update` (clip, step, EMA, refresh the rollout engine)."""

    def __init__(self, cfg: VASDConfig, accelerator: Any, model: torch.nn.Module, tokenizer: Any,
                 instances: list, anchors: list[Example], steps: int):
        if loop.is_zero3(accelerator) and (cfg.teacher.mode == "ema" or (not cfg.lora.enabled and
                                                                          cfg.teacher.mode == "frozen")):
            raise FicError("under ZeRO-3 the teacher must not be a second copy of the model: use LoRA (the frozen "
                           "teacher is the adapter-free model) or teacher.mode=live", field="teacher.mode")
        self.cfg, self.accelerator, self.tokenizer, self.instances, self.anchors = (
            cfg, accelerator, tokenizer, instances, anchors)
        self.parts = teacher_parts(cfg, model, torch.bfloat16 if loop.computes_on_copy(cfg, accelerator) else None)
        world, rank = accelerator.num_processes, accelerator.process_index
        per_rank = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
        self.n_anchor = round(cfg.regularizer.anchor_share * per_rank) if anchors else 0
        self.group = cfg.reward.group_size if cfg.reward.weight else 1  # rollouts of one task a step
        self.order = DataOrder(len(instances), per_rank // self.group, world, rank, cfg.data.seed, cfg.rollout.shuffle)
        self.anchor_order = (DataOrder(len(anchors), self.n_anchor, world, rank, cfg.data.seed + 1, True)
                             if self.n_anchor else None)
        loss = DistillLoss.for_run(cfg, model, self.parts, anchors=self.n_anchor > 0)
        self.loss_model, self.optimizer, self.scheduler = loop.prepare(accelerator, loss, cfg, steps)
        self.policy = accelerator.unwrap_model(self.loss_model).model
        self.copy = loop.compute_copy(cfg, accelerator, self.policy)
        compute = loop.compute_dtype(accelerator, self.copy, self.policy)
        self.generator, self.masters = make_rollout_backend(cfg, self.policy, tokenizer, compute)
        self.user = (make_user("llm", make_backend(cfg.rollout.user.backend), temperature=cfg.rollout.user.temperature,
                               max_new_tokens=cfg.rollout.user.max_new_tokens)
                     if cfg.rollout.user.kind == "llm" else make_user("verbatim"))
        self.classifier = make_classifier("rule")
        self.params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                     top_p=cfg.rollout.top_p)
        self.share_prefixes = cfg.train.share_prefixes and shares_prefixes(self.policy)
        if cfg.train.share_prefixes and not self.share_prefixes:
            accelerator.print("train.share_prefixes: this model's attention is not sdpa, so every row is its own "
                              "sequence")

    @property
    def loss(self) -> DistillLoss:
        return self.accelerator.unwrap_model(self.loss_model)

    def describe(self) -> str:
        cfg, world = self.cfg, self.accelerator.num_processes
        per_rank = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
        groups = f" ({per_rank // self.group} tasks x {self.group})" if self.group > 1 else ""
        return (f"{len(self.instances)} rollout tasks, {len(self.anchors)} anchor conversations; {per_rank} rollouts"
                f"{groups} (+{self.n_anchor} anchors) x {world} process(es) a step; teacher {cfg.teacher.mode}/"
                f"{cfg.teacher.view}, {cfg.loss.divergence} ({cfg.loss.estimator}), loss terms "
                + ", ".join(f"{name} x{weight:g}" for name, weight in self.loss.weights.items()))

    # ------------------------------------------------------------------ one step

    def step(self, step: int) -> tuple[dict, list]:
        """Optimizer step `step` (1-based): its figures (losses, rollout figures, what was left
        out and why, seconds per phase) and the rollouts it played."""
        seconds: dict[str, float] = {}

        def timed(name: str, began: float) -> None:
            seconds[name] = time.perf_counter() - began

        with cut_short_on_sigterm():  # nothing of a step is kept until it is over
            began = time.perf_counter()
            convs = self.rollouts(step)
            timed("rollout_s", began)
            advantages, reward = self.advantages(convs)
            began = time.perf_counter()
            batches, left_out = self.micro_batches(convs, step, advantages)
            timed("teacher_s", began)
            began = time.perf_counter()
            window = self.student(batches)
            timed("student_s", began)
            began = time.perf_counter()
            figures = self.update(convs)
            timed("optimizer_s", began)
        return {"loss": window["loss"], **{figure: window.get(name) for name, figure in TERMS.items()},
                "answer_tokens": int(window.get("n_distill", 0)), **figures, **rollout_figures(convs), **reward,
                **{f"left_out_{k}": v for k, v in left_out.items() if k != "empty_micro_batches"},
                "empty_micro_batches": left_out["empty_micro_batches"], **seconds}, convs

    def rollouts(self, step: int) -> list:
        """The current weights play this rank's rollout tasks of `step`, sharded, every shard,
        sampled from a seed of (train.seed, step, rank); with the reward on, each task
        `reward.group_size` times in a row (runs of their own: each samples from its own seeds)."""
        cfg = self.cfg
        convs = make_conversations([self.instances[i] for i in self.order.micro_batch(step - 1)], ["sharded"],
                                   self.group)
        with self.accelerator.autocast():  # the run's compute precision (bf16 where it is fast)
            play(convs, self.generator, self.user, self.classifier, self.params, batch_size=len(convs),
                 stop_at_correct=False, seed=derive_seed(cfg.train.seed, "rollout", step, self.accelerator.process_index),
                 max_context=cfg.rollout.max_conversation_tokens)
        return convs

    def advantages(self, convs: list) -> tuple[list[float] | None, dict]:
        """With the reward on: each rollout's group-relative advantage (`fic.training.vasd.reward`)
        and the step's reward figures; else (None, {})."""
        reward = self.cfg.reward
        if not reward.weight:
            return None, {}
        rewards = [rollout_reward(conv, reward.premature_penalty, reward.penalize, reward.unanswered_reward)
                   for conv in convs]
        advantages = leave_one_out(rewards, self.group)
        return advantages, reward_figures(rewards, advantages, self.group)

    def micro_batches(self, convs: list, step: int, advantages: list[float] | None = None
                      ) -> tuple[list[dict], Counter]:
        """The window's micro-batches for `convs` plus this step's anchors (see `step_batches`),
        the teacher and reference read without dropout."""
        chosen = [self.anchors[i] for i in self.anchor_order.micro_batch(step - 1)] if self.anchor_order else []
        self.policy.eval()
        try:
            with self.copy:  # a live teacher reads the weights the student computes with
                return step_batches(self.cfg, convs, chosen, self.tokenizer, self.parts,
                                    device=self.accelerator.device, autocast=self.accelerator.autocast,
                                    share_prefixes=self.share_prefixes, advantages=advantages)
        finally:
            self.policy.train()

    def student(self, batches: list[dict]) -> dict:
        counts = [b.pop("counts") for b in batches]
        with self.copy:
            return window_backward(self.accelerator, self.loss_model, batches, counts, self.loss.weights,
                                   self.copy.accumulate)

    def update(self, convs: list) -> dict:
        figures = loop.optimizer_step(self.accelerator, self.loss_model, self.optimizer, self.scheduler,
                                      self.cfg.optim.max_grad_norm)
        self.copy.refresh()
        if self.parts.ema is not None:
            self.parts.ema.update(self.policy, self.cfg.teacher.ema_rate)
        sync_rollout_backend(self.generator, self.policy, self.cfg, convs, self.accelerator.print,
                             masters=self.masters)
        return figures

    # ------------------------------------------------------------------ checkpoints

    def save_extra(self, folder: Path) -> None:
        """What a checkpoint holds beyond the accelerator's state: the EMA teacher's masters."""
        if self.parts.ema is not None:
            save_file(self.parts.ema.state(), str(folder / EMA_FILE))

    def resumed(self, folder: Path | None) -> None:
        """After `loop.restore` loaded checkpoint `folder` (None: a new run): the EMA teacher takes
        its saved masters, and the rollout engine, built from the weights before the load, takes
        the restored ones."""
        if folder is None:
            return
        if self.parts.ema is not None:
            self.parts.ema.load(load_file(str(folder / EMA_FILE)))
        sync_rollout_backend(self.generator, self.policy, self.cfg, [], self.accelerator.print, masters=self.masters)


def step_batches(cfg: VASDConfig, convs: list, anchors: list, tokenizer: Any, parts: TeacherParts, *, device: Any,
                 autocast: Any, share_prefixes: bool = False, advantages: list[float] | None = None
                 ) -> tuple[list[dict], Counter]:
    """The G micro-batches of one step, always G of them: student rows with teacher (and
    reference) hidden states; and counts of the rollouts left out of the distillation, once each
    under the first reason that applies (`LEFT_OUT`), their total (`rollouts`) and the
    micro-batches that had nothing to train (`empty_micro_batches`). `advantages` (one per conv,
    the reward mode's) put reward targets on a rollout's own row.

    Every row of the step (rollouts, anchors, labels, corrections) is one sequence; rows that
    train nothing are dropped, and the rest are cut, by length, into G groups of similar widths
    (`length_groups`), so a short label row is never padded to the longest rollout. With
    `share_prefixes` a rollout's label and correction rows, which start with its own ids, ride on
    its row as branches (`shared_prefix_rows`), and so do a rollout's teacher rows on one another
    (one system prompt, a few words of request apart): the same losses and gradients, the shared
    context computed once. The loss is normalised over the whole window, so the grouping and the
    sharing change the passes' shapes, not the update."""
    G = cfg.train.grad_accum_steps
    counts: Counter = Counter({name: 0 for name in (*LEFT_OUT, "empty_micro_batches")})
    played = []  # (conv, rollout) of the conversations that reached the last shard
    for index, conv in enumerate(convs):
        if conv.stop_reason != "last_turn":
            counts["cut_before_last_shard"] += 1
            continue
        rollout = rollout_from(conv)
        rollout.advantage = advantages[index] if advantages is not None else 0.0
        if cfg.loss.weight > 0:
            distilled, reason = distilled_spans(cfg, rollout, conv, tokenizer)
            if reason:
                counts[reason] += 1
            rollout.distilled = distilled
        played.append((conv, rollout))
    counts["rollouts"] = sum(counts[reason] for reason in LEFT_OUT)
    reference = parts.ref_head is not None
    shape = {"reference": reference, "first_tokens": cfg.regularizer.first_tokens,
             "first_weight": cfg.regularizer.first_token_weight, "decision_tokens": cfg.loss.decision_tokens,
             "decision_weight": cfg.loss.decision_weight}
    # (rollout or None, row): a rollout's row trains something when it is distilled or read by the reference
    items: list[tuple[Rollout | None, dict]] = []
    for conv, rollout in played:
        trains = bool(rollout.distilled or (reference and rollout.earlier) or rollout.advantage)
        rows = student_rows([rollout] if trains else [], [], label_rows(cfg, conv, tokenizer),
                            correction_rows(cfg, conv, tokenizer), **shape)
        if share_prefixes and len(rows) > 1:
            rows = shared_prefix_rows(rows)
        items += [(rollout if trains and i == 0 else None, row) for i, row in enumerate(rows)]
    items += [(None, row) for row in student_rows([], anchors, **shape)]
    batches = []
    for group in length_groups([len(row["input_ids"]) for _, row in items], G, cfg.train.pad_to_multiple):
        chosen = [items[i] for i in group]
        part = [rollout for rollout, _ in chosen if rollout is not None]  # in row order: the teacher's rows follow
        rows = [row for _, row in chosen]
        if not rows:
            # Nothing of the step landed here. It still runs (one token, no target: every term a
            # zero with a gradient graph), so each rank does the same G forward and backward
            # passes with the same collective calls, and the accumulation window stays in step
            # with accelerate's gradient sync.
            counts["empty_micro_batches"] += 1
            rows = [empty_row(tokenizer.pad_token_id)]
        batch = collate_rows(rows, tokenizer.pad_token_id, cfg.train.pad_to_multiple)
        views = []
        with parts.context(), autocast():
            for v in range(len(teacher_views(cfg))):
                pairs = [pair for r in part for pair in r.teacher_rows(v)]
                sequences = [prompt + reply for prompt, reply in pairs]
                positions = [range(len(prompt) - 1, len(prompt) - 1 + len(reply)) for prompt, reply in pairs]
                views.append(hidden_at(parts.net, sequences, positions, tokenizer.pad_token_id, device,
                                       cfg.train.pad_to_multiple, share_prefixes=share_prefixes))
        batch["teacher_hidden"] = torch.stack(views, dim=1)  # [answer tokens, views, hidden]
        if reference:
            with parts.ref_context(), autocast():
                positions = [[t - 1 for s, e in r.earlier for t in range(s, e)] for r in part]
                batch["reference_hidden"] = hidden_at(parts.ref_net, [r.ids for r in part], positions,
                                                      tokenizer.pad_token_id, device, cfg.train.pad_to_multiple)
        batch["counts"] = batch_counts(batch)
        if not chosen:
            batch["counts"]["tokens"] = 0.0
        batches.append(batch)
    return batches, counts


def shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether rows with branches can run on `model`: its attention takes `branch_mask`, a
    boolean 4D mask, as it is (sdpa, every backbone's default here; eager adds the mask)."""
    return getattr(causal_lm(model).config, "_attn_implementation", None) == "sdpa"


def distilled_spans(cfg: VASDConfig, rollout: Rollout, conv: Any, tokenizer: Any
                    ) -> tuple[list[tuple[tuple[int, int], float]], str | None]:
    """The (span, weight) pairs of a rollout the divergence is taken on, with the teacher's
    prompts filled in, or ([], the `LEFT_OUT` reason it is not distilled). With `loss.turns: all`
    every earlier reply is distilled too (its first `loss.nonfinal_tokens`, where set)."""
    rollout.teacher_prompts = teacher_prompts(tokenizer, conv.instance, teacher_views(cfg))
    if cfg.loss.turns == "all":
        rollout.partial_prompts = partial_prompts(tokenizer, conv)
    if max(len(p) for p in rollout.teacher_prompts + rollout.partial_prompts) > cfg.teacher.max_prompt_tokens:
        return [], "teacher_prompt_too_long"
    if not rollout.finished and not cfg.loss.keep_truncated:
        return [], "truncated_final"  # distilled anyway under keep_truncated: not left out
    earlier = rollout.earlier if cfg.loss.turns == "all" else []
    if cfg.loss.nonfinal_tokens:
        earlier = [(start, min(end, start + cfg.loss.nonfinal_tokens)) for start, end in earlier]
    return [(span, cfg.loss.nonfinal_weight) for span in earlier] + [(rollout.final, 1.0)], None


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


def empty_row(pad_id: int) -> dict:
    """A one-token student row that trains nothing (the stand-in for an empty micro-batch); the
    token is attended, so no attention row is fully masked."""
    return student_rows([], [], [GoldRow([pad_id], [])], reference=False, first_tokens=0, first_weight=1.0)[0]


def _revealed(task: Any, conv: Any, k: int) -> set:
    """The values the user had given by turn k of a played conversation."""
    return {v for turn in conv.turns[:k + 1] for v in task.values_in(turn.user, conv.instance)}


def label_rows(cfg: VASDConfig, conv: Any, tokenizer: Any) -> list[GoldRow]:
    """On-policy deferral labels (`labels.weight`): at earlier turns of the student's rollout
    (`labels.select`), its own ids up to that turn's generation prompt and the gold reply for that
    state, an ask for the next shard's detail or a deferral (`Task.early_reply`, no value not
    given yet)."""
    if not cfg.labels.weight or len(conv.turns) < 2 or conv.stop_reason != "last_turn":
        return []
    task = tasks.of(conv.instance)
    earlier = list(range(len(conv.turns) - 1))
    premature = [k for k in earlier if conv.turns[k].label == "answer_attempt"]
    if cfg.labels.select == "premature":
        chosen = premature[:cfg.labels.max_turns] or [earlier[-1]]
    elif cfg.labels.select == "unanswerable":
        chosen = [k for k in premature
                  if answerable_by(conv.instance, conv.view, conv.turns, k) is not True][:cfg.labels.max_turns]
    else:
        chosen = sorted(earlier, key=lambda k: (k not in premature, k))[:cfg.labels.max_turns]
    rows = []
    for k in sorted(chosen):
        rng = seeded_rng(cfg.train.seed, "labels", conv.instance.task_id, conv.run, k)
        text, _ = task.early_reply(conv.turns[k + 1].user, _revealed(task, conv, k), rng, conv.instance,
                                   ask=rng.random() < cfg.labels.ask_share, used=set())
        rows.append(GoldRow.single(list(conv.ids[:conv.turns[k].prompt_tokens]), reply_ids(tokenizer, text)))
    return rows


def correction_rows(cfg: VASDConfig, conv: Any, tokenizer: Any) -> list[GoldRow]:
    """On-policy corrections (`corrections.weight`), the corpus builder as the expert. A rollout
    that answered before the last shard: its own ids up to its first premature turn, then the
    gold replies from there on (asks or deferrals while details are missing, the gold answer at
    the end) with the user turns it was sent between them. Otherwise, a rollout whose final reply
    is not a correct answer: the gold answer in its own context, its earlier replies kept. The
    student's own replies are context only; the gold replies are trained."""
    if not cfg.corrections.weight or not conv.turns or conv.stop_reason != "last_turn":
        return []
    task = tasks.of(conv.instance)
    last = len(conv.turns) - 1
    premature = [k for k in range(last) if conv.turns[k].label == "answer_attempt"]
    if premature:
        start = premature[0]
    elif (conv.turns[last].score or 0.0) < 1.0:
        start = last
    else:
        return []
    ids = list(conv.ids[:conv.turns[start].prompt_tokens])
    messages = list(conv.messages[:2 + 2 * start])  # the system message, then (user, assistant) pairs to user `start`
    spans, used = [], set()
    for k in range(start, last + 1):
        if k < last:
            rng = seeded_rng(cfg.train.seed, "corrections", conv.instance.task_id, conv.run, k)
            text, _ = task.early_reply(conv.turns[k + 1].user, _revealed(task, conv, k), rng, conv.instance,
                                       ask=rng.random() < cfg.corrections.ask_share, used=used)
            used.add(text)
        else:
            text = task.gold_reply(conv.instance)
        reply = reply_ids(tokenizer, text)
        spans.append((len(ids), len(ids) + len(reply)))
        ids += reply
        messages.append({"role": "assistant", "content": text})
        if k < last:
            user = {"role": "user", "content": conv.turns[k + 1].user}
            ids = continue_ids(tokenizer, messages, ids, [user])
            messages.append(user)
    return [GoldRow(ids, spans)]


def rollout_figures(convs: list) -> dict:
    """What the rollouts did: accuracy, premature answers, over-deferral, lengths."""
    records = [c.to_record() for c in convs]
    finals = [c.turns[-1] for c in convs if c.turns]
    n = max(len(records), 1)
    first = [r["first_answer_turn"] for r in records if r["first_answer_turn"] is not None]
    return {
        "rollout_accuracy": sum(r["score"] for r in records) / n,
        "premature_answer_rate": sum(bool(r["premature_answer"]) for r in records) / n,
        "unanswerable_answer_rate": unanswerable_answer_rate(records),
        "final_not_answer_rate": sum(t.label != "answer_attempt" for t in finals) / max(len(finals), 1),
        "first_answer_turn": sum(first) / len(first) if first else None,
        "rollout_tokens": sum(r["generated_tokens"] for r in records) / n,
        "truncated_final_rate": sum(t.finish_reason != "stop" for t in finals) / max(len(finals), 1),
    }


def sample_rows(convs: list, limit: int = 4) -> list[list]:
    rows = []
    for conv in convs[:limit]:
        dialogue = "\n".join(f"[user] {t.user}\n[assistant:{t.label}] {t.reply}" for t in conv.turns)
        rows.append([conv.instance.task_id, round(conv.score(), 3), dialogue])
    return rows


def make_rollout_backend(cfg: VASDConfig, policy: Any, tokenizer: Any,
                         compute_dtype: torch.dtype) -> tuple[Any, dict | None]:
    """The engine that plays the rollouts with the current weights, and the master weights its
    copy is refreshed from (None: it plays on the policy itself, or is a vLLM engine).

    hf: when the run computes in bfloat16 over float32 master weights (full fine-tuning, no
    ZeRO-3), the rollouts run on a bfloat16 copy of the policy laid out for decoding
    (`column_major_linears` on a CPU), refreshed from the masters after every optimizer step
    (`sync_rollout_backend`): the same numbers autocast would compute, without casting every
    weight again at every decoding step and through the slow small-batch product path (a 16-row
    decoding product 5x faster in bf16 column-major than in float32, measured). Otherwise the
    policy itself plays."""
    if cfg.rollout.backend == "vllm":
        return colocated_engine(policy, tokenizer, cfg.model.path, cfg.rollout.gpu_memory_utilization,
                                cfg.rollout.max_conversation_tokens), None
    model = policy
    weights = next(policy.parameters())
    if compute_dtype == torch.bfloat16 and weights.dtype == torch.float32 and not cfg.lora.enabled:
        model = copy.deepcopy(policy).to(torch.bfloat16).eval().requires_grad_(False)
        if weights.device.type == "cpu":
            column_major_linears(model)
    backend = HFBackend(model, tokenizer, batch_size=cfg.rollout.batch_size, kv_reuse_mb=cfg.rollout.kv_reuse_mb)
    return backend, None if model is policy else dict(policy.state_dict(keep_vars=True))


def sync_rollout_backend(generator: Any, policy: Any, cfg: VASDConfig, convs: list, say: Any, *,
                         masters: dict | None = None) -> None:
    """After an optimizer step: the hf backend's bfloat16 copy (if it has one) takes the new
    master weights, and it forgets the keys and values computed with the old ones; a vLLM engine
    gets the new weights."""
    if cfg.rollout.backend == "hf":
        if masters is not None:
            with torch.no_grad():  # copy_ casts and keeps the copy's own (column-major) layout
                for name, param in generator.model.named_parameters():
                    param.copy_(masters[name])
        generator.weights_changed()
    else:
        sync_weights(generator, policy, convs, cfg.rollout.logprob_check_tolerance, say)


def held_out_divergence(cfg: VASDConfig, instances: list, generator: Any, tokenizer: Any, parts: TeacherParts,
                        loss: Any, *, device: Any, autocast: Any, share_prefixes: bool = False) -> float | None:
    """The distillation term per answer token on held-out tasks, without a gradient: the live
    model plays them greedily (sharded, every shard) and the teacher reads their single-turn
    views, as in training. Lower means the student's final replies moved towards the teacher's."""
    convs = make_conversations(instances, ["sharded"], 1)
    play(convs, generator, make_user("verbatim"), make_classifier("rule"),
         SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0), batch_size=len(convs),
         stop_at_correct=False, max_context=cfg.rollout.max_conversation_tokens)
    per_step = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
    total, count = 0.0, 0.0
    was_training = loss.training
    loss.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(convs), per_step):
                batches, _ = step_batches(cfg, convs[start:start + per_step], [], tokenizer, parts, device=device,
                                          autocast=autocast, share_prefixes=share_prefixes)
                for batch in batches:
                    count += batch.pop("counts")["distill"]
                    total += float(loss(**{k: v.to(device) for k, v in batch.items()})["distill"])
    finally:
        loss.train(was_training)
    return total / count if count else None
