"""VASD's step as one unit (`VASDStep`), taken by the recipe (`fic/train_vasd.py`) and timed by
`fic bench vasd`, in four phases: rollouts -> teacher -> student -> update. Also the held-out
divergence the recipe logs (`held_out_divergence`).

The pieces: the rollout engine (`rollouts`), the window's rows before any model runs (`window`,
`rows`), who plays teacher and reference and the teacher pass (`teacher`), the loss module
(`loss`) and its terms (`terms`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from fic.backends import make_backend
from fic.conversation.classify import make_classifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import make_user
from fic.core import progress
from fic.core.errors import FicError, cut_short_on_sigterm
from fic.core.generation import SamplingParams
from fic.core.ranks import Ranks, phase
from fic.core.seeding import derive_seed
from fic.training import loop
from fic.training.data import DataOrder, Example
from fic.training.losses import causal_lm, to_device, window_backward
from fic.training.vasd import terms as plugins
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.loss import DistillLoss
from fic.training.vasd.rollouts import make_rollout_backend, play_greedy, rollout_figures, sync_rollout_backend
from fic.training.vasd.teacher import TeacherParts, copies_model, teacher_parts, teacher_pass
from fic.training.vasd.terms import run_terms
from fic.training.vasd.window import step_rows

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
    each: `rollouts` (play the sharded conversations on-policy, every shard), `teacher` (the
    window's student rows, `fic.training.vasd.window.step_rows`, with the hidden states of every
    network a term reads, `teacher_pass`), `student` (forward and backward of every loss term
    over the window, each term normalised by its count on all ranks), `update` (clip, step, EMA,
    refresh the rollout engine). Between rollouts and teacher the plug-ins give each rollout its
    value (`values`: the reward's advantages)."""

    def __init__(self, cfg: VASDConfig, accelerator: Any, model: torch.nn.Module, tokenizer: Any,
                 instances: list, anchors: list[Example], steps: int):
        if loop.shards_weights(accelerator) and copies_model(cfg):
            raise FicError("with the weights partitioned over the ranks (ZeRO-3, FSDP) the teacher and reference must "
                           "not be a second copy of the model: use LoRA (the frozen teacher and the reference are the "
                           "adapter-free model) or teacher.mode=live without terms.reference", field="teacher.mode")
        if loop.shards_weights(accelerator) and cfg.logging.term_grad_norms_every:
            raise FicError("each term's gradient norm needs the whole weights on every rank: with ZeRO-3 or FSDP set "
                           "logging.term_grad_norms_every=0", field="logging.term_grad_norms_every")
        self.cfg, self.accelerator, self.tokenizer, self.instances, self.anchors = (
            cfg, accelerator, tokenizer, instances, anchors)
        self.parts = teacher_parts(cfg, model, torch.bfloat16 if loop.computes_on_copy(cfg, accelerator) else None)
        world, rank = accelerator.num_processes, accelerator.process_index
        per_rank = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
        self.n_anchor = round(cfg.anchor.share * per_rank) if anchors else 0
        self.terms = run_terms(cfg, anchors=self.n_anchor > 0)
        # rollouts of one task a step (the reward's group)
        self.group = max([plugin.group(cfg) for plugin in plugins.of(self.terms) if plugin.group] or [1])
        self.order = DataOrder(len(instances), per_rank // self.group, world, rank, cfg.data.seed, cfg.rollout.shuffle)
        self.anchor_order = (DataOrder(len(anchors), self.n_anchor, world, rank, cfg.data.seed + 1, True)
                             if self.n_anchor else None)
        loss = DistillLoss.for_run(cfg, model, self.parts.heads, anchors=self.n_anchor > 0)
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
        """Optimizer step `step` (1-based): its figures (each term's mean under its metric, the
        rollouts' figures, what was left out and why, seconds per phase) and the rollouts it played."""
        seconds: dict[str, float] = {}

        def timed(name: str, what: str, run: Callable, *args: Any) -> Any:
            began = time.perf_counter()
            # the run's heartbeat names the phase with its own progress; the watchdog names it if a
            # collective waits too long
            with progress.phase(name, what), phase(f"the {name} of step {step}"):
                result = run(*args)
            seconds[f"{name}_s"] = time.perf_counter() - began
            return result

        with cut_short_on_sigterm():  # nothing of a step is kept until it is over
            convs = timed("rollouts", "", self.rollouts, step)
            values, value_figures = self.values(convs)
            batches, left_out = timed("teacher", "forward, no gradient", self.teacher, convs, step, values)
            window = timed("student", "forward and backward", self.student, batches, step)
            figures = timed("update", "optimizer step", self.update, convs)
        return {"loss": window["loss"], **{term.metric: window.get(term.name) for term in self.terms},
                **{key: value for key, value in window.items() if key.startswith("grad_norm_")},
                "answer_tokens": int(window.get("n_distill", 0)), **figures, **rollout_figures(convs), **value_figures,
                **{f"left_out_{k}": v for k, v in left_out.items() if k != "empty_micro_batches"},
                "empty_micro_batches": left_out["empty_micro_batches"], **seconds}, convs

    def rollouts(self, step: int) -> list:
        """The current weights play this rank's rollout tasks of `step`, sharded, every shard,
        each reply sampled from a seed of (train.seed, step, its conversation and turn), whichever
        rank plays it (N processes sample what one process at N x the micro-batch samples); each
        task `self.group` times in a row (runs of their own: each samples from its own seeds). The ranks play in lockstep (`play`
        with `ranks`): turns and replies end where they end on each rank, and a rank whose
        conversations are over idles along while a sharded model's forwards still run."""
        cfg = self.cfg
        convs = make_conversations([self.instances[i] for i in self.order.micro_batch(step - 1)], ["sharded"],
                                   self.group)
        # the run's compute precision (bf16 where it is fast); FSDP2's root weights gathered for generation
        with self.accelerator.autocast(), loop.root_gathered(self.loss_model):
            play(convs, self.generator, self.user, self.classifier, self.params, batch_size=len(convs),
                 stop_at_correct=False, seed=derive_seed(cfg.train.seed, "rollout", step),
                 max_context=cfg.rollout.max_conversation_tokens, ranks=Ranks.current())
        return convs

    def values(self, convs: list) -> tuple[dict[str, list[float]], dict]:
        """Each on plug-in's value per rollout (the reward's advantages), and their figures."""
        values, figures = {}, {}
        for plugin in plugins.of(self.terms):
            if plugin.values is not None:
                values[plugin.name], more = plugin.values(self.cfg, convs)
                figures.update(more)
        return values, figures

    def teacher(self, convs: list, step: int, values: dict[str, list[float]] | None = None) -> tuple[list[dict], dict]:
        """The window's batches for `convs` plus this step's anchors (`step_rows`), with the
        hidden states of the teacher (and reference) read without dropout (`teacher_pass`)."""
        chosen = [self.anchors[i] for i in self.anchor_order.micro_batch(step - 1)] if self.anchor_order else []
        micro_batches, left_out = step_rows(self.cfg, convs, chosen, self.tokenizer, self.terms, values=values,
                                            share_prefixes=self.share_prefixes)
        self.policy.eval()
        try:  # a live teacher reads the weights the student computes with; FSDP2: the decoder alone runs
            with self.copy, loop.root_gathered(self.loss_model):
                return teacher_pass(micro_batches, self.parts, self.terms, self.tokenizer.pad_token_id,
                                    device=self.accelerator.device, autocast=self.accelerator.autocast,
                                    multiple=self.cfg.train.pad_to_multiple), left_out
        finally:
            self.policy.train()

    def student(self, batches: list[dict], step: int | None = None) -> dict:
        """Forward and backward over the window; each term's own gradient norm too on the steps
        `logging.term_grad_norms_every` names (a pass outside training, `step` None: never)."""
        counts = [b.pop("counts") for b in batches]
        every = self.cfg.logging.term_grad_norms_every
        with self.copy:
            return window_backward(self.accelerator, self.loss_model, batches, counts, self.loss.weights,
                                   self.copy.accumulate, term_norms=bool(every) and step is not None and step % every == 0)

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


def shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether rows with branches can run on `model`: its attention takes `branch_mask`, a
    boolean 4D mask, as it is (sdpa, every backbone's default here; eager adds the mask)."""
    return getattr(causal_lm(model).config, "_attn_implementation", None) == "sdpa"


def held_out_divergence(cfg: VASDConfig, instances: list, generator: Any, tokenizer: Any, parts: TeacherParts,
                        loss: DistillLoss, *, device: Any, autocast: Any, share_prefixes: bool = False,
                        ranks: Ranks | None = None) -> float | None:
    """The divergence term per answer token on held-out tasks, without a gradient: the live
    model plays them greedily (sharded, every shard) and the teacher reads their single-turn
    views, as in training. Lower means the student's final replies moved towards the teacher's.
    None where the run takes no divergence (loss.weight: 0).

    Every rank of a multi-process run calls it (`ranks`, default: torch.distributed's): each plays
    its share of `instances` in lockstep and runs as many windows of teacher and loss passes as
    the rank with the most (a window with no rollout runs its stand-in rows), and the sums are
    added over the ranks, so every rank returns the same figure."""
    if "distill" not in loss.weights:
        return None
    ranks = ranks or Ranks.current()
    convs = play_greedy(cfg, ranks.share_of(instances), generator, ranks)
    per_step = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
    total, count = 0.0, 0.0
    was_training = loss.training
    loss.eval()
    try:
        with torch.no_grad():
            for start in range(0, ranks.most(len(convs)), per_step):
                micro_batches, _ = step_rows(cfg, convs[start:start + per_step], [], tokenizer, loss.terms,
                                             share_prefixes=share_prefixes)
                for batch in teacher_pass(micro_batches, parts, loss.terms, tokenizer.pad_token_id, device=device,
                                          autocast=autocast, multiple=cfg.train.pad_to_multiple):
                    count += batch.pop("counts")["distill"]
                    total += float(loss(**to_device(batch, device))["distill"])
    finally:
        loss.train(was_training)
    total, count = ranks.total(total), ranks.total(count)
    return total / count if count else None
