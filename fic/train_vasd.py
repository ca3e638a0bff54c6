"""VASD, View-Asymmetric Self-Distillation (FiC stage 2): one backbone, two views of a task.

    accelerate launch fic/train_vasd.py --config recipes/<backbone>/vasd.yaml [key=value ...]
    fic train vasd --config recipes/<backbone>/vasd.yaml [key=value ...]      (one process)

Each optimizer step:

1. Rollouts, on-policy: the current weights play a batch of sharded conversations
   (`fic.conversation.simulator.play`: lockstep, keys and values kept between turns) with every assistant
   reply sampled at `rollout.temperature`; every shard is played (no stop at a correct answer),
   so the final reply is the reply to the last shard, whatever it says.
2. Teacher: the same backbone reads the single-turn view of the same task (`teacher.view`)
   followed by the student's final-reply ids (`fic/training/vasd/distill.py` has the layout), under
   `teacher.mode`: `frozen` (the starting weights: LoRA adapters switched off, or a frozen
   copy), `live` (the current weights, no gradient) or `ema` (a moving average). With
   `loss.turns: all` it also reads, for every earlier reply, the single-turn request of what the
   user had revealed by then, followed by that reply's ids (per-turn view asymmetry).
3. Loss: a token-level divergence (`loss.*`) between the student's and the teacher's
   next-token distributions at the distilled replies' tokens (content and end-of-turn token),
   normalised by their weight over the accumulation window and all ranks. Final replies cut by
   the token cap are counted and left out (`loss.keep_truncated`). With `labels.weight`, a
   cross-entropy on gold asks and deferrals at the student's own earlier states is added.
4. Regulariser (`regularizer.kind`): the teacher, who has the whole request, always wants an
   immediate answer; the shared update leaks into earlier turns and, unchecked, teaches the
   model to answer before the last shard. An SFT anchor (cross-entropy on the assistant turns of
   SFT-corpus conversations mixed into each batch: deferrals and asks, and by default the final
   answers too, since an anchor of deferrals alone teaches deferring even when the request is
   complete) and/or a divergence to the starting model on the rollouts' earlier replies keep that
   behaviour, with extra weight on the first tokens of each reply, where the decision is made.

Rollouts are seeded from (seed, step, rank), the data order is a function of the step, and
checkpoints hold weights, optimizer, RNG and the EMA teacher: losses after a kill and
`resume=true` equal those of an uninterrupted run. Outputs as `fic/train_sft.py`, plus
`samples.jsonl` (sample conversations every `logging.samples_every` steps) and `eval/step-N/`
(a `fic eval` of the live model every `eval.every` steps).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from accelerate.utils import set_seed
from safetensors.torch import load_file, save_file

from fic.backends import make_backend
from fic.backends.hf import HFBackend
from fic.conversation.classify import make_classifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import make_user
from fic.core.config import config_to_dict
from fic.core.errors import FicError
from fic.core.files import append_jsonl, file_sha256, write_json
from fic.core.generation import BackendConfig, SamplingParams
from fic.core.model import load_template_checked_tokenizer
from fic.core.seeding import derive_seed
from fic.evaluation.evaluate import EvalConfig, evaluate
from fic.training import checkpoints, loop
from fic.training.checkpoints import model_card as card
from fic.training.data import DataOrder, load_corpus
from fic.training.losses import check_target_path, window_backward
from fic.training.vasd.config import MUST_MATCH, VASDConfig
from fic.training.vasd.distill import DistillLoss
from fic.training.vasd.inputs import check_against_tokenizer, check_inputs, load_held_out, load_rollout_tasks
from fic.training.vasd.step import (
    TeacherParts,
    held_out_divergence,
    make_rollout_backend,
    rollout_figures,
    sample_rows,
    step_batches,
    sync_rollout_backend,
    teacher_parts,
)


def train(cfg: VASDConfig) -> dict:
    """Run the recipe; return the final model folder (`model_dir`), the trained model in memory
    (`model`), `steps` and the last step's figures (`last`)."""
    check_inputs(cfg)
    accelerator = loop.make_accelerator(cfg)
    main, world, rank, say = (accelerator.is_main_process, accelerator.num_processes, accelerator.process_index,
                              accelerator.print)
    if loop.is_zero3(accelerator) and (cfg.teacher.mode == "ema" or (not cfg.lora.enabled and
                                                                      cfg.teacher.mode == "frozen")):
        raise FicError("under ZeRO-3 the teacher must not be a second copy of the model: use LoRA (the frozen "
                       "teacher is the adapter-free model) or teacher.mode=live", field="teacher.mode")
    resume_from, saved = loop.resume_point(cfg, say)
    tokenizer = load_template_checked_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    instances, data_sha, overlap = load_rollout_tasks(cfg)
    held_out = load_held_out(cfg, instances)
    say(f"evaluation data kept out: {overlap['dropped']} overlapping instance(s) dropped "
        f"({', '.join(cfg.exclude.sources) or 'no exclude.sources named'})")
    check_against_tokenizer(cfg, tokenizer, instances)
    anchors, anchor_stats = [], {"used": 0}
    if cfg.regularizer.kind in ("anchor", "both"):
        anchors, anchor_stats = load_corpus(cfg.regularizer.anchor_path, tokenizer, cfg.regularizer.anchor_max_seq_len,
                                            progress=main and cfg.logging.progress, targets=cfg.regularizer.anchor_targets)
        data_sha += ":" + file_sha256(cfg.regularizer.anchor_path)
    if saved is not None:
        changed = checkpoints.check_compatible(saved, cfg, MUST_MATCH, data_sha,
                                               data_name="rollout instances and anchor corpus", world=world,
                                               where=resume_from)
        if changed:
            say(f"resuming with changed settings: {', '.join(changed)}")
    steps, G, mbs = cfg.train.max_steps, cfg.train.grad_accum_steps, cfg.train.micro_batch_size
    per_rank = mbs * G
    n_anchor = round(cfg.regularizer.anchor_share * per_rank) if anchors else 0
    say(f"{len(instances)} rollout tasks, {anchor_stats['used']} anchor conversations; {steps} steps of "
        f"{per_rank} rollouts (+{n_anchor} anchors) x {world} process(es); teacher {cfg.teacher.mode}/"
        f"{cfg.teacher.view}, {cfg.loss.divergence} ({cfg.loss.estimator}), regulariser {cfg.regularizer.kind}")
    order = DataOrder(len(instances), per_rank, world, rank, cfg.data.seed, cfg.rollout.shuffle)
    anchor_order = DataOrder(len(anchors), n_anchor, world, rank, cfg.data.seed + 1, True) if n_anchor else None

    set_seed(cfg.train.seed)
    model = loop.build_model(cfg, device=str(accelerator.device))
    if not loop.is_zero3(accelerator):
        check_target_path(model.eval(), len(tokenizer))
        model.train()
    parts = teacher_parts(cfg, model)
    loss = DistillLoss(model, parts.head, parts.ref_head, divergence=cfg.loss.divergence,
                       estimator=cfg.loss.estimator, beta=cfg.loss.beta, temperature=cfg.loss.temperature,
                       top_k=cfg.loss.top_k, chunk_tokens=cfg.train.loss_chunk_tokens)
    loss_model, optimizer, scheduler = loop.prepare(accelerator, loss, cfg, steps)
    start, run_id = loop.restore(accelerator, cfg, resume_from, saved)
    if main:
        write_json(Path(cfg.out) / "data_overlap.json", overlap)
    if resume_from is not None and parts.ema is not None:
        parts.ema.load(load_file(str(resume_from / "ema.safetensors")))
    policy = accelerator.unwrap_model(loss_model).model
    generator = make_rollout_backend(cfg, policy, tokenizer)
    user = (make_user("llm", make_backend(cfg.rollout.user.backend), temperature=cfg.rollout.user.temperature,
                      max_new_tokens=cfg.rollout.user.max_new_tokens)
            if cfg.rollout.user.kind == "llm" else make_user("verbatim"))
    classifier = make_classifier("rule")
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p)
    weights = {"distill": 1.0, "anchor": cfg.regularizer.anchor_weight if n_anchor else 0.0,
               "reference": cfg.regularizer.reference_weight if parts.ref_head is not None else 0.0,
               "labels": cfg.labels.weight}
    weights = {k: v for k, v in weights.items() if v > 0}
    data_card = {"rollout_tasks": len(instances), "data": config_to_dict(cfg.data), "held_out": len(held_out),
                 "evaluation_overlap": overlap, "anchor_conversations": anchor_stats.get("used", 0)}
    log = loop.RunLog(cfg, accelerator, steps, start, run_id, desc="vasd", data_card=data_card, postfix=lambda f: {
        "loss": f"{f['loss']:.4f}", "acc": f"{f['rollout_accuracy']:.2f}", "early": f"{f['premature_answer_rate']:.2f}"})
    out = Path(cfg.out)

    def held_out_figures(step: int) -> dict:
        return evaluate_now(cfg, held_out, policy=policy, generator=generator, tokenizer=tokenizer, parts=parts,
                            loss=loss, accelerator=accelerator, out=out / "eval" / f"step-{step}")

    if held_out and start == 0 and main:  # the point the held-out figures are compared with
        before = held_out_figures(0)
        append_jsonl(out / "metrics.jsonl", {"step": 0, **before})
        say("before training: " + ", ".join(f"{k}={v:.4g}" for k, v in before.items() if v is not None))
    last: dict = {}
    loss_model.train()
    for step in range(start + 1, steps + 1):
        seconds = {}
        # 1. Rollouts: the current weights play the sharded conversations, every shard.
        began = time.perf_counter()
        convs = make_conversations([instances[i] for i in order.micro_batch(step - 1)], ["sharded"], 1)
        with accelerator.autocast():  # the run's compute precision (bf16 where it is fast)
            play(convs, generator, user, classifier, params, batch_size=len(convs), stop_at_correct=False,
                 seed=derive_seed(cfg.train.seed, "rollout", step, rank),
                 max_context=cfg.rollout.max_conversation_tokens)
        seconds["rollout_s"] = time.perf_counter() - began
        # 2. Teacher (and reference): single-turn views + the student's own final-reply ids.
        began = time.perf_counter()
        chosen = [anchors[i] for i in anchor_order.micro_batch(step - 1)] if anchor_order else []
        model.eval()  # no dropout in the teacher and reference passes
        batches, left_out = step_batches(cfg, convs, chosen, tokenizer, parts, device=accelerator.device,
                                         autocast=accelerator.autocast)
        model.train()
        seconds["teacher_s"] = time.perf_counter() - began
        # 3-4. Student: the divergence on answer tokens plus the regulariser, over the window.
        began = time.perf_counter()
        counts = [b.pop("counts") for b in batches]
        window = window_backward(accelerator, loss_model, batches, counts, weights)
        seconds["student_s"] = time.perf_counter() - began
        began = time.perf_counter()
        figures = loop.optimizer_step(accelerator, loss_model, optimizer, scheduler, cfg.optim.max_grad_norm)
        if parts.ema is not None:
            parts.ema.update(accelerator.unwrap_model(loss_model).model, cfg.teacher.ema_rate)
        sync_rollout_backend(generator, policy, cfg, convs, say)
        seconds["optimizer_s"] = time.perf_counter() - began
        last = {"loss": window["loss"], "divergence_per_token": window.get("distill"),
                "anchor_ce": window.get("anchor"), "labels_ce": window.get("labels"),
                "reference_divergence": window.get("reference"),
                "answer_tokens": int(window.get("n_distill", 0)), **figures, **rollout_figures(convs),
                **{f"left_out_{k}": v for k, v in left_out.items() if k != "empty_micro_batches"},
                "empty_micro_batches": left_out["empty_micro_batches"], **seconds}
        tables = None
        if cfg.logging.samples_every and step % cfg.logging.samples_every == 0:
            rows = sample_rows(convs)
            tables = {"samples": {"columns": ["task_id", "score", "conversation"], "rows": rows}}
            if main:
                for row in rows:
                    append_jsonl(out / "samples.jsonl", {"step": step, "task_id": row[0], "score": row[1],
                                                         "conversation": row[2]})
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == steps):
            last.update(held_out_figures(step))
        log.step(step, last, tables)
        state = {"world_size": world, "data_sha256": data_sha, "config": config_to_dict(cfg), "wandb_id": run_id,
                 "loss": last["loss"]}
        extra = None
        if parts.ema is not None:
            def extra(folder: Path) -> None:
                save_file(parts.ema.state(), str(folder / "ema.safetensors"))
        loop.maybe_checkpoint(accelerator, cfg, step, steps, state, extra)
    log.close({"final_loss": last.get("loss"), "steps": steps})

    result = {"steps": steps, "world_size": world, "final_loss": last.get("loss", (saved or {}).get("loss"))}
    final = checkpoints.save_final(accelerator, loss_model, cfg, out, lambda kind: model_card(cfg, result, kind))
    say(f"saved {final}" + (f" and {out / 'final-merged'}" if cfg.save_merged else ""))
    accelerator.end_training()
    return {"model_dir": final, "model": accelerator.unwrap_model(loss_model).model, "last": last, **result}


def evaluate_now(cfg: VASDConfig, held_out: list, *, policy: Any, generator: Any, tokenizer: Any,
                 parts: TeacherParts, loss: Any, accelerator: Any, out: Path) -> dict:
    """On the held-out tasks (main process): the divergence per answer token (`eval_divergence_per_token`)
    and, for each of `eval.views`, a `fic eval` of the live model (`out/eval/step-N/`)."""
    if not accelerator.is_main_process:
        return {}
    policy.eval()
    figures = {"eval_divergence_per_token": held_out_divergence(cfg, held_out, generator, tokenizer, parts, loss,
                                                                device=accelerator.device,
                                                                autocast=accelerator.autocast)}
    policy.train()
    if cfg.eval.views:
        eval_cfg = EvalConfig(model=BackendConfig(model=str(out)), data=cfg.eval.data, views=list(cfg.eval.views),
                              runs=1, temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens, out=str(out))
        metrics = evaluate(eval_cfg, assistant=HFBackend(policy, tokenizer, batch_size=cfg.rollout.batch_size),
                           progress=False)
        for view, values in metrics["views"].items():
            figures[f"eval_{view}_P"] = values.get("P")
            if values.get("premature_answer_rate") is not None:
                figures[f"eval_{view}_premature_answer_rate"] = values["premature_answer_rate"]
    return figures


def model_card(cfg: VASDConfig, result: dict, kind: str) -> str:
    loss = f"{cfg.loss.divergence} ({cfg.loss.estimator}, T={cfg.loss.temperature})"
    return card(cfg, title="FiC VASD", tags=["fic", "vasd", "self-distillation", "multi-turn"], kind=kind,
                summary="Trained with `fic train vasd` (FiC stage 2, View-Asymmetric Self-Distillation): the model "
                        "plays sharded conversations on-policy and is pulled, at its final reply's tokens, towards its "
                        "own next-token distribution given the single-turn view",
                facts=[f"Started from: `{cfg.model.path}` (the SFT warm-start checkpoint)",
                       f"Rollout tasks: {', '.join(cfg.data.source)} (task {cfg.data.task}, seed {cfg.data.seed})",
                       f"Teacher: {cfg.teacher.mode}, view {cfg.teacher.view}; loss {loss}; regulariser "
                       f"{cfg.regularizer.kind}" + (f" on `{cfg.regularizer.anchor_path}`" if cfg.regularizer.anchor_path else ""),
                       f"Training: {result['steps']} optimizer steps, {result['world_size']} process(es), "
                       f"{cfg.train.micro_batch_size} x {cfg.train.grad_accum_steps} rollouts per process per step; "
                       f"final loss {result['final_loss']:.4f}" if result["final_loss"] is not None else
                       f"Training: {result['steps']} optimizer steps"])


def main(argv: list[str] | None = None) -> int:
    return loop.recipe_main(VASDConfig, train, "vasd", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
