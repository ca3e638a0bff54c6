"""The parts of a VASD step that read the recipe's settings (`VASDConfig`): who plays teacher and
reference, the rollout engine, one step's micro-batches, and the figures logged about the
rollouts. The token layout and the loss module are in `fic.training.vasd.distill`.
"""

from __future__ import annotations

import copy
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch

from fic import tasks
from fic.backends.hf import HFBackend, column_major_linears
from fic.backends.vllm import colocated_engine, sync_weights
from fic.conversation.classify import make_classifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import make_user
from fic.core.chat import reply_ids
from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.core.seeding import seeded_rng
from fic.training.losses import decoder_and_head
from fic.training.vasd.config import EMA_WITH_REFERENCE, VASDConfig
from fic.training.vasd.distill import (
    LabelRow,
    batch_counts,
    collate_rows,
    hidden_at,
    partial_prompts,
    rollout_from,
    student_rows,
    teacher_prompts,
)

# Why a rollout is left out of the distillation: it ended before the last shard (the
# conversation outgrew rollout.max_conversation_tokens), the teacher's prompt is over
# teacher.max_prompt_tokens, or its final reply was cut by rollout.max_new_tokens (unless
# loss.keep_truncated).
LEFT_OUT = ("cut_before_last_shard", "teacher_prompt_too_long", "truncated_final")


def teacher_views(cfg: VASDConfig) -> list[str]:
    """The single-turn views the teacher reads (`teacher.view: both` reads two)."""
    return ["full", "concat"] if cfg.teacher.view == "both" else [cfg.teacher.view]


@dataclass
class TeacherParts:
    """The networks and heads that play teacher and reference, without a gradient.

    `net`/`ref_net` run the decoder over teacher (or student) ids; `context`/`ref_context` switch
    LoRA adapters off around it when that network is the adapter-free model; `copy` is a frozen
    or moving-average copy (full fine-tuning's frozen teacher, or any EMA teacher); `head` and
    `ref_head` map hidden rows to logits. No reference term: `ref_net` and `ref_head` are None."""

    net: Any
    context: Callable[[], Any]
    head: Callable
    copy: Any = None
    ref_net: Any = None
    ref_context: Callable[[], Any] = nullcontext
    ref_head: Callable | None = None
    ema: EmaTeacher | None = None  # teacher.mode=ema: the float32 average written into `copy`


def teacher_parts(cfg: VASDConfig, model: Any) -> TeacherParts:
    """Who plays teacher and reference for `cfg` (see `TeacherParts`). The reference always reads
    the starting weights: with LoRA the adapter-free model, in full fine-tuning a frozen copy,
    which is never the moving average (that would take a third copy: refused)."""
    lora = cfg.lora.enabled
    needs_reference = cfg.regularizer.kind in ("reference", "both")
    if needs_reference and not lora and cfg.teacher.mode == "ema":
        raise FicError(EMA_WITH_REFERENCE, field="teacher.mode")
    copy_model = None
    if cfg.teacher.mode == "ema" or (not lora and (cfg.teacher.mode == "frozen" or needs_reference)):
        copy_model = copy.deepcopy(model).eval()
        copy_model.requires_grad_(False)
    adapters_off = model.disable_adapter if lora else nullcontext
    frozen_net = model if lora else copy_model
    frozen_context = adapters_off if lora else nullcontext

    def head_of(net: Any, context: Any) -> Any:
        _, head = decoder_and_head(net)
        if not hasattr(head, "lora_A"):  # adapters only matter where the head has one
            return head

        def run(hidden: Any) -> Any:
            with context():
                return head(hidden)
        return run

    if cfg.teacher.mode == "live":
        net, context = model, nullcontext
    elif cfg.teacher.mode == "ema":
        net, context = copy_model, nullcontext
    else:
        net, context = frozen_net, frozen_context
    parts = TeacherParts(net=net, context=context, head=head_of(net, context), copy=copy_model,
                         ema=EmaTeacher(copy_model, model) if cfg.teacher.mode == "ema" else None)
    if needs_reference:
        parts.ref_net, parts.ref_context = frozen_net, frozen_context
        parts.ref_head = head_of(frozen_net, frozen_context)
    return parts


class EmaTeacher:
    """The moving average of the trained weights, accumulated in float32.

    `update` sets average = rate * average + (1 - rate) * model for every trained weight and
    writes it into the copy the teacher runs (cast to the copy's dtype). In bf16 the step
    (1 - rate) * (model - average) is mostly under half a unit in the last place and rounds away
    (after 50 updates at 0.99, 2.5% of the entries had moved, against 39% in float32), so weights
    below float32 get a float32 master (4 bytes per trained weight: the adapter with LoRA); float32
    weights are their own master. `state` (the masters, saved as `ema.safetensors`) and `load`
    make a resume exact."""

    def __init__(self, copy_model: Any, model: Any):
        trained = [n for n, p in model.named_parameters() if p.requires_grad]
        weights = dict(copy_model.named_parameters())
        self.weights = {n: weights[n] for n in trained}
        self.master = {n: p.data if p.dtype == torch.float32 else p.detach().float().clone()
                       for n, p in self.weights.items()}

    def update(self, model: Any, rate: float) -> None:
        current = dict(model.named_parameters())
        with torch.no_grad():
            for name, master in self.master.items():
                master.mul_(rate).add_(current[name].detach().float(), alpha=1 - rate)
                self._write(name)

    def state(self) -> dict:
        return {n: m.detach().cpu().contiguous() for n, m in self.master.items()}

    def load(self, state: dict) -> None:
        missing = sorted(set(self.master) - set(state))
        if missing:
            raise FicError(f"the EMA teacher's saved weights lack {len(missing)} trained weight(s), e.g. {missing[0]}",
                           field="resume")
        with torch.no_grad():
            for name, master in self.master.items():
                master.copy_(state[name].to(master.device, torch.float32))
                self._write(name)

    def _write(self, name: str) -> None:
        weight, master = self.weights[name], self.master[name]
        if weight.data_ptr() != master.data_ptr():
            weight.data.copy_(master)


def step_batches(cfg: VASDConfig, convs: list, anchors: list, tokenizer: Any, parts: TeacherParts, *, device: Any,
                 autocast: Any) -> tuple[list[dict], Counter]:
    """The G micro-batches of one step, always G of them: student rows with teacher (and
    reference) hidden states; and counts of the rollouts left out of the distillation, once each
    under the first reason that applies (`LEFT_OUT`), their total (`rollouts`) and the
    micro-batches that had nothing to train (`empty_micro_batches`)."""
    G, mbs = cfg.train.grad_accum_steps, cfg.train.micro_batch_size
    counts: Counter = Counter({name: 0 for name in (*LEFT_OUT, "empty_micro_batches")})
    rollouts, use = [], []
    for conv in convs:
        if conv.stop_reason != "last_turn":
            counts["cut_before_last_shard"] += 1
            rollouts.append(None)
            use.append(False)
            continue
        rollout = rollout_from(conv)
        rollout.teacher_prompts = teacher_prompts(tokenizer, conv.instance, teacher_views(cfg))
        if cfg.loss.turns == "all":
            rollout.partial_prompts = partial_prompts(tokenizer, conv)
        keep = True
        if max(len(p) for p in rollout.teacher_prompts + rollout.partial_prompts) > cfg.teacher.max_prompt_tokens:
            counts["teacher_prompt_too_long"] += 1
            keep = False
        elif not rollout.finished and not cfg.loss.keep_truncated:
            counts["truncated_final"] += 1  # distilled anyway under keep_truncated: not left out
            keep = False
        if keep:
            earlier = rollout.earlier if cfg.loss.turns == "all" else []
            rollout.distilled = [(span, cfg.loss.nonfinal_weight) for span in earlier] + [(rollout.final, 1.0)]
        rollouts.append(rollout)
        use.append(keep)
    counts["rollouts"] = sum(counts[reason] for reason in LEFT_OUT)
    batches = []
    for g in range(G):
        part = [(r, u) for r, u in zip(rollouts[g * mbs:(g + 1) * mbs], use[g * mbs:(g + 1) * mbs]) if r is not None]
        mine = [a for k, a in enumerate(anchors) if k % G == g]
        labels = [row for conv in convs[g * mbs:(g + 1) * mbs] for row in label_rows(cfg, conv, tokenizer)]
        reference = parts.ref_head is not None
        rows = student_rows([r for r, _ in part], mine, labels, reference=reference,
                            first_tokens=cfg.regularizer.first_tokens, first_weight=cfg.regularizer.first_token_weight,
                            decision_tokens=cfg.loss.decision_tokens, decision_weight=cfg.loss.decision_weight)
        if not rows:
            # Every rollout of this micro-batch was left out and no anchor landed here. It still
            # runs (one token, no target: every term a zero with a gradient graph), so each rank
            # does the same G forward and backward passes with the same collective calls, and
            # the accumulation window stays in step with accelerate's gradient sync.
            counts["empty_micro_batches"] += 1
            rows = [empty_row(tokenizer.pad_token_id)]
        batch = collate_rows(rows, tokenizer.pad_token_id, cfg.train.pad_to_multiple)
        views = []
        with parts.context(), autocast():
            for v in range(len(teacher_views(cfg))):
                pairs = [pair for r, _ in part for pair in r.teacher_rows(v)]
                sequences = [prompt + reply for prompt, reply in pairs]
                positions = [range(len(prompt) - 1, len(prompt) - 1 + len(reply)) for prompt, reply in pairs]
                views.append(hidden_at(parts.net, sequences, positions, tokenizer.pad_token_id, device,
                                       cfg.train.pad_to_multiple))
        batch["teacher_hidden"] = _stack_views(views)
        if reference:
            with parts.ref_context(), autocast():
                positions = [[t - 1 for s, e in r.earlier for t in range(s, e)] for r, _ in part]
                batch["reference_hidden"] = hidden_at(parts.ref_net, [r.ids for r, _ in part], positions,
                                                      tokenizer.pad_token_id, device, cfg.train.pad_to_multiple)
        batch["counts"] = batch_counts(batch)
        if not part and not mine and not labels:
            batch["counts"]["tokens"] = 0.0
        batches.append(batch)
    return batches, counts


def empty_row(pad_id: int) -> dict:
    """A one-token student row that trains nothing (the stand-in for an empty micro-batch); the
    token is attended, so no attention row is fully masked."""
    return student_rows([], [], [LabelRow([pad_id], [])], reference=False, first_tokens=0, first_weight=1.0)[0]


def label_rows(cfg: VASDConfig, conv: Any, tokenizer: Any) -> list[LabelRow]:
    """On-policy deferral labels (`labels.weight`): at up to `labels.max_turns` of the student's
    earlier turns, its own ids up to that turn's generation prompt and the gold reply for that
    state, an ask for the next shard's detail or a deferral (`Task.early_reply`, no value not
    given yet). Its earliest premature answers are labelled first: those are the states to fix."""
    if not cfg.labels.weight or len(conv.turns) < 2 or conv.stop_reason != "last_turn":
        return []
    task = tasks.get(conv.instance.task)
    earlier = list(range(len(conv.turns) - 1))
    chosen = sorted(earlier, key=lambda k: (conv.turns[k].label != "answer_attempt", k))[:cfg.labels.max_turns]
    rows = []
    for k in sorted(chosen):
        rng = seeded_rng(cfg.train.seed, "labels", conv.instance.task_id, conv.run, k)
        revealed = {v for turn in conv.turns[:k + 1] for v in task.values_in(turn.user, conv.instance)}
        text, _ = task.early_reply(conv.turns[k + 1].user, revealed, rng, conv.instance,
                                   ask=rng.random() < cfg.labels.ask_share, used=set())
        rows.append(LabelRow(list(conv.ids[:conv.turns[k].prompt_tokens]), reply_ids(tokenizer, text)))
    return rows


def _stack_views(views: list) -> Any:
    return torch.stack(views, dim=1)  # [answer tokens, views, hidden]


def rollout_figures(convs: list) -> dict:
    """What the rollouts did: accuracy, premature answers, over-deferral, lengths."""
    records = [c.to_record() for c in convs]
    finals = [c.turns[-1] for c in convs if c.turns]
    n = max(len(records), 1)
    first = [r["first_answer_turn"] for r in records if r["first_answer_turn"] is not None]
    return {
        "rollout_accuracy": sum(r["score"] for r in records) / n,
        "premature_answer_rate": sum(bool(r["premature_answer"]) for r in records) / n,
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
                        loss: Any, *, device: Any, autocast: Any) -> float | None:
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
                                          autocast=autocast)
                for batch in batches:
                    count += batch.pop("counts")["distill"]
                    total += float(loss(**{k: v.to(device) for k, v in batch.items()})["distill"])
    finally:
        loss.train(was_training)
    return total / count if count else None
