"""VASD, View-Asymmetric Self-Distillation (FiC stage 2): one backbone, two views of a task.

    accelerate launch fic/train_vasd.py --config recipes/<backbone>/vasd.yaml [key=value ...]
    fic train vasd --config recipes/<backbone>/vasd.yaml [key=value ...]      (one process)

Each optimizer step (`fic.training.vasd.step.VASDStep`, the one step `fic bench vasd` times too)
runs four phases, rollouts -> teacher -> student -> update:

1. Rollouts, on-policy: the current weights play a batch of sharded conversations
   (`fic.conversation.simulator.play`: lockstep, keys and values kept between turns) with every
   assistant reply sampled at `rollout.temperature`; every shard is played (no stop at a correct
   answer), so the final reply is the reply to the last shard, whatever it says.
2. Teacher: the step's rows are built without a model (`fic/training/vasd/window.py`), then the
   same backbone reads the single-turn view of the same task (`teacher.view`) followed by the
   student's final-reply ids (`fic/training/vasd/rows.py` has the layout), under `teacher.mode`:
   `frozen` (the starting weights: LoRA adapters switched off, or a frozen copy), `live` (the
   current weights, no gradient) or `ema` (a moving average).
3. Student: forward and backward of each of the run's loss terms (`fic/training/vasd/terms/`):
   the paper's token-level divergence (`loss.*`) between the student's and the teacher's
   next-token distributions at the final reply's tokens (content and end-of-turn token), and the
   anchor (`anchor.*`): cross-entropy on SFT-corpus conversations mixed into each batch, which
   keeps the deferrals SFT taught (the teacher, who has the whole request, always wants an
   immediate answer, and the shared update leaks into earlier turns). Plug-in terms add their
   own (`terms.*`: on-policy labels and corrections, a reward, a reference divergence, per-turn
   views). Each term is normalised by its count over the accumulation window and all ranks.
   Final replies cut by the token cap are counted and left out (`loss.keep_truncated`).
4. Update: clip, optimizer step, the EMA teacher, the rollout engine's refresh.

Rollouts are seeded from (seed, step, conversation), the data order is a function of the step, and
checkpoints hold weights, optimizer, RNG and the EMA teacher: losses after a kill and
`resume=true` equal those of an uninterrupted run. Outputs as `fic/train_sft.py`, plus
`samples.jsonl` (sample conversations every `logging.samples_every` steps) and `dev/step-N/`
(a `fic eval` of the live model every `dev.every` steps).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from accelerate.utils import set_seed

from fic.core import progress
from fic.core.config import config_to_dict, set_in, set_where
from fic.core.files import append_jsonl, write_json
from fic.core.model import load_template_checked_tokenizer, template_clause
from fic.core.ranks import phase
from fic.core.records import file_sha256
from fic.data.sources import describe_loaded, load_sharded
from fic.evaluation.live import evaluate_live
from fic.training import checkpoints, loop
from fic.training.data import load_corpus
from fic.training.losses import check_target_path
from fic.training.vasd.config import MUST_MATCH, VASDConfig
from fic.training.vasd.inputs import check_against_tokenizer, check_inputs, load_held_out, load_rollout_tasks
from fic.training.vasd.rollouts import sample_rows
from fic.training.vasd.step import VASDStep, held_out_divergence
from fic.training.vasd.terms import run_terms


def train(cfg: VASDConfig) -> dict:
    """Run the recipe; return the final model folder (`model_dir`), the trained model in memory
    (`model`), `steps` and the last step's figures (`last`)."""
    # Set-up: inputs checked before the model loads, then data, model, the step.
    check_inputs(cfg)
    accelerator = loop.make_accelerator(cfg)
    main, world, say = accelerator.is_main_process, accelerator.num_processes, accelerator.print
    resume_from, saved = loop.resume_point(cfg, say)
    tokenizer = load_template_checked_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    instances, data_sha, overlap = load_rollout_tasks(cfg)
    held_out = load_held_out(cfg, instances)
    say(start_line(cfg, instances, held_out, overlap, world) + template_clause(tokenizer))
    check_against_tokenizer(cfg, tokenizer, instances)
    anchors, anchor_stats = [], {"used": 0}
    if cfg.anchor.share > 0:
        anchors, anchor_stats = load_corpus(cfg.anchor.path, tokenizer, cfg.anchor.max_seq_len,
                                            progress=main and cfg.logging.progress, targets=cfg.anchor.targets)
        data_sha += ":" + file_sha256(cfg.anchor.path)
    if saved is not None:
        changed = checkpoints.check_compatible(saved, cfg, MUST_MATCH, data_sha,
                                               data_name="rollout instances and anchor corpus", world=world,
                                               where=resume_from)
        if changed:
            say(f"resuming with changed settings: {', '.join(changed)}")
    steps = cfg.train.max_steps

    set_seed(cfg.train.seed)
    model = loop.build_model(cfg, device=str(accelerator.device))
    if not loop.is_zero3(accelerator):
        check_target_path(model.eval(), len(tokenizer))
        model.train()
    vasd = VASDStep(cfg, accelerator, model, tokenizer, instances, anchors, steps)
    say(f"{steps} step{'s' * (steps != 1)}: " + vasd.describe())
    start, run_id = loop.restore(accelerator, cfg, resume_from, saved)
    vasd.resumed(resume_from)
    if main:
        write_json(Path(cfg.out) / "data_overlap.json", overlap)
    data_card = {"rollout_tasks": len(instances), "data": config_to_dict(cfg.data), "held_out": len(held_out),
                 "evaluation_overlap": overlap, "anchor_conversations": anchor_stats.get("used", 0)}
    log = loop.RunLog(cfg, accelerator, steps, start, run_id, desc="vasd", data_card=data_card, postfix=lambda f: {
        "loss": f"{f['loss']:.4f}", "acc": f"{f['rollout_accuracy']:.2f}", "early": f"{f['premature_answer_rate']:.2f}"})
    out = Path(cfg.out)

    def held_out_figures(step: int) -> dict:  # on every rank, each its share of the held-out tasks
        # its turns are not the rollouts'. Its cost is logged apart (held_out_s; held_out_cpu_s, this process's
        # CPU seconds) so that a control given this run's compute can leave the measuring out.
        began, began_cpu = time.perf_counter(), time.process_time()
        with progress.phase("held-out", "dev tasks"), phase(f"the held-out evaluation at step {step}"):
            figures = evaluate_now(cfg, held_out, vasd, out=out / "dev" / f"step-{step}")
        return {**figures, "held_out_s": time.perf_counter() - began, "held_out_cpu_s": time.process_time() - began_cpu}

    if held_out and start == 0:  # the point the held-out figures are compared with
        before = held_out_figures(0)
        if main:
            append_jsonl(out / "metrics.jsonl", {"step": 0, **before})
        say("before training: " + ", ".join(f"{k}={v:.4g}" for k, v in before.items() if v is not None))

    # The loop: one VASD step (rollouts, teacher, student, update), then samples, held-out
    # figures, the log line and a checkpoint.
    last: dict = {}
    vasd.loss_model.train()
    for step in range(start + 1, steps + 1):
        last, convs = vasd.step(step)  # each phase named for the watchdog
        tables = None
        if cfg.logging.samples_every and step % cfg.logging.samples_every == 0:
            rows = sample_rows(convs)
            tables = {"samples": {"columns": ["task_id", "score", "conversation"], "rows": rows}}
            if main:
                for row in rows:
                    append_jsonl(out / "samples.jsonl", {"step": step, "task_id": row[0], "score": row[1],
                                                         "conversation": row[2]})
        if cfg.dev.every and (step % cfg.dev.every == 0 or step == steps):
            last.update(held_out_figures(step))
        log.step(step, last, tables)
        state = {"world_size": world, "data_sha256": data_sha, "config": config_to_dict(cfg), "wandb_id": run_id,
                 "loss": last["loss"]}
        with phase(f"the checkpoint at step {step}"):
            loop.maybe_checkpoint(accelerator, cfg, step, steps, state, vasd.save_extra)
    log.close({"final_loss": last.get("loss"), "steps": steps})

    # Save: the final model with its card.
    result = {"steps": steps, "world_size": world, "final_loss": last.get("loss", (saved or {}).get("loss"))}
    with phase("the final model"):
        final = checkpoints.save_final(accelerator, vasd.loss_model, cfg, out,
                                       lambda kind: model_card(cfg, result, kind))
    say(f"saved {final}" + (f" and {out / 'final-merged'}" if cfg.save_merged else ""))
    accelerator.end_training()
    return {"model_dir": final, "model": vasd.policy, "last": last, **result}


def evaluate_now(cfg: VASDConfig, held_out: list, vasd: VASDStep, *, out: Path) -> dict:
    """On the held-out dev tasks: the divergence per answer token (`dev_divergence_per_token`) and,
    for each of `dev.views`, a `fic eval` of the live model (`out/dev/step-N/`, written by the main
    process). Every rank calls it and scores its share in lockstep with the others (a ZeRO-3 or
    FSDP model gathers its weights in every forward); every rank returns the same figures."""
    accelerator = vasd.accelerator
    vasd.policy.eval()
    with vasd.copy, loop.root_gathered(vasd.loss_model):
        figures = {"dev_divergence_per_token": held_out_divergence(cfg, held_out, vasd.generator, vasd.tokenizer,
                                                                    vasd.parts, vasd.loss, device=accelerator.device,
                                                                    autocast=accelerator.autocast,
                                                                    share_prefixes=vasd.share_prefixes)}
    vasd.policy.train()
    if cfg.dev.views:
        with loop.root_gathered(vasd.loss_model):
            figures.update(evaluate_live(vasd.policy, vasd.tokenizer, cfg.dev.data, cfg.dev.views,
                                         max_new_tokens=cfg.dev.max_new_tokens, batch_size=cfg.dev.batch_size,
                                         out=out, prefix="dev_"))
    return figures


def model_card(cfg: VASDConfig, result: dict, kind: str) -> str:
    loss = f"{cfg.loss.divergence} ({cfg.loss.estimator}, T={cfg.loss.temperature})"
    return checkpoints.model_card(
        cfg, title="FiC VASD", tags=["fic", "vasd", "self-distillation", "multi-turn"], kind=kind,
        summary="Trained with `fic train vasd` (FiC stage 2, View-Asymmetric Self-Distillation): the model "
                "plays sharded conversations on-policy and is pulled, at its final reply's tokens, towards its "
                "own next-token distribution given the single-turn view",
        facts=[f"Started from: `{cfg.model.path}` (the SFT warm-start checkpoint)",
               f"Rollout tasks: {', '.join(cfg.data.source)} (task {cfg.data.task}, seed {cfg.data.seed})",
               f"Teacher: {cfg.teacher.mode}, view {cfg.teacher.view}; loss {loss}; terms "
               + ", ".join(f"{term.name} x{term.weight:g}" for term in run_terms(cfg, anchors=cfg.anchor.share > 0))
               + (f"; anchor `{cfg.anchor.path}`" if cfg.anchor.share > 0 else ""),
               f"Training: {result['steps']} optimizer steps, {result['world_size']} process(es), "
               f"{cfg.train.micro_batch_size} x {cfg.train.grad_accum_steps} rollouts per process per step; "
               f"final loss {result['final_loss']:.4f}" if result["final_loss"] is not None else
               f"Training: {result['steps']} optimizer steps"])


def start_line(cfg: VASDConfig, instances: list, held_out: list, overlap: dict, world: int) -> str:
    """What the run will do, before the model loads: the rollout tasks read and why (the sources
    are read once more for their counts, a second or two), the evaluation data kept out, the steps
    and rollouts, the anchor corpus and held-out set, where it writes."""
    read = describe_loaded(load_sharded(cfg.data, several_shards=True), cfg.data, limit_set_in=set_in(cfg, "data.limit"))
    where = set_in(cfg, "train.max_steps")
    per_step = cfg.train.micro_batch_size * cfg.train.grad_accum_steps * world
    anchor = f"; anchor {cfg.anchor.share:g} of each batch from {cfg.anchor.path}" if cfg.anchor.share > 0 else ""
    evaluated = f"; {len(held_out)} held-out dev tasks scored every {cfg.dev.every} steps" if held_out else ""
    return (f"fic train vasd: {read}; {len(instances)} rollout tasks after {overlap['dropped']} evaluation "
            f"instance(s) dropped ({', '.join(cfg.exclude.sources) or 'no exclude.sources named'}); "
            f"{cfg.train.max_steps} step{'s' * (cfg.train.max_steps != 1)} (train.max_steps{', ' + set_where(where) if where else ''}) of "
            f"{cfg.train.micro_batch_size} x {cfg.train.grad_accum_steps} x {world} = {per_step} sharded rollouts, "
            f"{cfg.train.max_steps * per_step} in all{anchor}{evaluated}; from {cfg.model.path}; outputs in {cfg.out}"
            + checkpoints.saving_clause(cfg))


def plan(cfg: VASDConfig) -> str:
    """The start line of a run of `cfg` (`fic train vasd --dry-run`): the tokenizer loads (its chat template
    is checked as the run checks it); no model."""
    check_inputs(cfg)
    tokenizer = load_template_checked_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    instances, _, overlap = load_rollout_tasks(cfg)
    return start_line(cfg, instances, load_held_out(cfg, instances), overlap,
                      int(os.environ.get("WORLD_SIZE", "1"))) + template_clause(tokenizer)


def main(argv: list[str] | None = None) -> int:
    return loop.recipe_main(VASDConfig, train, "vasd", __doc__, argv, plan=plan)


if __name__ == "__main__":
    sys.exit(main())
