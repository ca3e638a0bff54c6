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
   copy), `live` (the current weights, no gradient) or `ema` (a moving average).
3. Loss: a token-level divergence (`loss.*`) between the student's and the teacher's
   next-token distributions at the final reply's tokens (content and end-of-turn token), where
   both sides have all the information; normalised by answer tokens over the accumulation
   window and all ranks. Final replies cut by the token cap are counted and left out
   (`loss.keep_truncated`).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fic.core.config import config_to_dict, setting
from fic.core.errors import FicError
from fic.evaluation.evaluate import UserConfig
from fic.data.splits import ExcludeConfig
from fic.training.config import LoggingSection, RunConfig
from fic.training.data import TARGET_KINDS
from fic.training.vasd.distill import TEACHER_VIEWS
from fic.training.losses import DIVERGENCES, ESTIMATORS

MUST_MATCH = ("model.path", "model.dtype", "lora", "data", "rollout", "teacher.mode", "teacher.view",
              "train.micro_batch_size", "train.grad_accum_steps", "train.seed", "train.loss_chunk_tokens",
              "regularizer.kind", "regularizer.anchor_share",
               "regularizer.anchor_targets")
REGULARIZERS = ("anchor", "reference", "both", "none")


@dataclass
class DataSection:
    source: str | list[str] = setting("reasoning-gym:gsm_symbolic", "Where the rollouts' tasks come from (a source "
                                      "spec as in `fic shard --source`, or a list). Unsharded instances are "
                                      "sharded with the rule sharder; instances with fewer than 2 shards are "
                                      "left out.")
    task: str = setting("math", "Task of the instances.")
    limit: int | None = setting(1000, "At most this many instances per source (null: all).", min=1)
    seed: int = setting(1, "Seed of generated sources. Keep it away from the evaluation data's seed.")
    shuffle: bool = setting(True, "Visit instances in a seeded random order, a new permutation each epoch.")
    max_seq_len: int = setting(2048, "Anchor conversations longer than this many tokens are skipped.", min=8)
    anchor_path: str = setting("", "SFT corpus (JSONL from `fic sft-data`) whose non-final assistant turns the "
                               "anchor regulariser trains on; needed when regularizer.kind is anchor or both.")
    exclude: ExcludeConfig = setting(ExcludeConfig(), "Evaluation data the rollouts must not see (fic.data.splits); the "
                                     "overlap found is logged and written to out/data_overlap.json.")

    def __post_init__(self) -> None:
        if isinstance(self.source, str):
            text = self.source.strip()  # the command line keeps `data.source=[a, b]` as text
            self.source = [s.strip() for s in text[1:-1].split(",")] if text[:1] + text[-1:] == "[]" else [text]


@dataclass
class RolloutSection:
    backend: str = setting("hf", "hf: this process's live model generates (CPU or GPU); vllm: a colocated vLLM "
                           "engine whose weights are synced after every optimizer step (GPU).", choices=("hf", "vllm"))
    temperature: float = setting(1.0, "Sampling temperature of every assistant reply. Greedy rollouts give too few "
                                 "wrong final replies to learn from.", min=0.0)
    top_p: float = setting(1.0, "Nucleus sampling threshold.", min=0.0, max=1.0)
    max_new_tokens: int = setting(256, "Most tokens of one reply; a final reply cut here is counted as truncated.",
                                  min=1)
    max_conversation_tokens: int = setting(4096, "Most tokens of a whole rollout (prompts and replies); a "
                                           "conversation that would grow past it ends early and is left out.", min=16)
    batch_size: int = setting(16, "Most conversations per generation forward pass (hf).", min=1)
    kv_reuse_mb: float = setting(1024, "hf: memory for keys and values kept between turns of a rollout (0: off); "
                                 "cleared after every optimizer step.", min=0)
    user: UserConfig = setting(UserConfig(), "The simulated user: verbatim shards (default) or an LLM user.")
    gpu_memory_utilization: float = setting(0.3, "vllm: share of GPU memory for the engine; the trainer keeps the "
                                            "rest.", min=0.01, max=1.0)
    logprob_check_tolerance: float = setting(0.05, "vllm: warn when the engine's mean log-prob of a rollout differs "
                                             "from the trainer's by more than this after a weight sync.", min=0.0)


@dataclass
class TeacherSection:
    mode: str = setting("frozen", "frozen: the starting weights (LoRA: adapters off, no copy); live: the current "
                        "weights under no-grad; ema: a moving average of the weights.", choices=("frozen", "live", "ema"))
    view: str = setting("full", "The teacher's single-turn view: full (the original instruction), concat (the shards "
                        "as one list) or both (their next-token distributions averaged).", choices=TEACHER_VIEWS)
    ema_rate: float = setting(0.99, "ema: weight of the old average at each step.", min=0.0, max=1.0)
    max_prompt_tokens: int = setting(4096, "The teacher's own context budget for its prompt (never cut to the "
                                     "student's); a rollout whose teacher prompt is longer is left out.", min=8)


@dataclass
class LossSection:
    divergence: str = setting("forward_kl", "forward_kl: KL(teacher || student); reverse_kl: KL(student || teacher); "
                              "jsd: generalised Jensen-Shannon with loss.beta.", choices=DIVERGENCES)
    beta: float = setting(0.5, "jsd: weight of the teacher in the mixture (0.5: symmetric JSD).", min=0.0, max=1.0)
    estimator: str = setting("full", "full: the whole vocabulary (fp32, in chunks); topk: the student's top-k tokens "
                             "plus a tail bucket; sampled: the sampled token only (reverse_kl).", choices=ESTIMATORS)
    top_k: int = setting(64, "topk: tokens kept per position.", min=1)
    temperature: float = setting(1.0, "Applied to both sides' logits before the divergence (not rescaled by T^2).",
                                 min=0.01)
    keep_truncated: bool = setting(False, "Distill final replies cut by rollout.max_new_tokens too (they are counted "
                                   "either way).")


@dataclass
class RegularizerSection:
    kind: str = setting("anchor", "anchor: cross-entropy on the non-final turns of SFT-corpus conversations mixed "
                        "into each batch; reference: divergence to the starting model on the rollouts' earlier "
                        "replies; both; none.", choices=REGULARIZERS)
    anchor_share: float = setting(0.5, "Anchor conversations per rollout conversation.", min=0.0)
    anchor_weight: float = setting(1.0, "Weight of the anchor term next to the distillation term.", min=0.0)
    anchor_targets: str = setting("assistant", "Which SFT-corpus turns the anchor trains: assistant (every trained "
                                  "turn: deferrals, asks and the final answers, so both decisions are kept) or "
                                  "non_final (deferrals and asks only; on its own it can teach the model to defer "
                                  "even when the request is complete).", choices=TARGET_KINDS)
    reference_weight: float = setting(1.0, "Weight of the reference term next to the distillation term.", min=0.0)
    first_tokens: int = setting(4, "The first this many tokens of each non-final reply weigh first_token_weight.",
                                min=0)
    first_token_weight: float = setting(4.0, "Weight of those first tokens (the defer-or-answer decision).", min=0.0)


@dataclass
class EvalSection:
    every: int = setting(0, "Evaluate the live model before training, every this many steps and at the end (0: "
                         "never): the divergence per answer token on the held-out tasks' greedy rollouts, and "
                         "`fic eval` of eval.views.", min=0)
    source: str = setting("", "Held-out instances (a source spec); must not overlap the training data.")
    task: str = setting("math", "Task of the held-out instances.")
    limit: int | None = setting(32, "At most this many held-out instances.", min=1)
    views: list[str] = setting(["full", "sharded"], "Views `fic eval` plays (empty: the divergence only).")
    max_new_tokens: int = setting(256, "Most tokens of one evaluation reply.", min=1)


@dataclass
class VASDLoggingSection(LoggingSection):
    samples_every: int = setting(10, "Write sample conversations (samples.jsonl, wandb table) every this many "
                                 "steps (0: never).", min=0)


@dataclass
class VASDConfig(RunConfig):
    """Settings of the VASD recipe (`fic/train_vasd.py`, `fic train vasd`)."""

    data: DataSection = setting(DataSection(), "Rollout tasks and the SFT corpus of the anchor.")
    rollout: RolloutSection = setting(RolloutSection(), "On-policy rollouts of the sharded view.")
    teacher: TeacherSection = setting(TeacherSection(), "The single-turn teacher.")
    loss: LossSection = setting(LossSection(), "The divergence on final-answer tokens.")
    regularizer: RegularizerSection = setting(RegularizerSection(), "What keeps the deferral SFT taught.")
    eval: EvalSection = setting(EvalSection(), "Held-out evaluation during training.")
    logging: VASDLoggingSection = setting(VASDLoggingSection(), "wandb, metrics, progress and samples.")
    out: str = setting("runs/vasd", "Output folder: config, metrics, samples, checkpoints, final model.")

    def check(self, source: str) -> None:
        super().check(source)
        if self.train.max_steps is None:
            raise FicError("VASD runs a set number of steps: set train.max_steps", path=source, field="train.max_steps")
        if self.loss.estimator == "sampled" and self.loss.divergence != "reverse_kl":
            raise FicError("the sampled-token estimator estimates reverse_kl only; set loss.divergence=reverse_kl or "
                           "another estimator", path=source, field="loss.estimator")
        if self.loss.estimator == "sampled" and self.loss.temperature != self.rollout.temperature:
            raise FicError("the sampled-token estimator needs loss.temperature equal to rollout.temperature (tokens "
                           "must be sampled from the distribution the loss reads)", path=source, field="loss.temperature")
        if self.loss.divergence == "jsd" and not 0 < self.loss.beta < 1:
            raise FicError("jsd needs 0 < loss.beta < 1 (0 and 1 are forward_kl and reverse_kl)", path=source,
                           field="loss.beta")
        if self.regularizer.kind in ("anchor", "both") and not self.data.anchor_path:
            raise FicError(f"regularizer.kind={self.regularizer.kind} needs the SFT corpus whose deferrals it keeps",
                           path=source, field="data.anchor_path")
        if self.eval.every and not self.eval.source:
            raise FicError("eval.every is set but eval.source is empty", path=source, field="eval.source")


# --------------------------------------------------------------------------- inputs

def check_inputs(cfg: VASDConfig) -> None:
    """Missing or wrong files and an output folder that cannot be written fail here, in a
    second, before torch and the model load."""
    from fic.core.files import check_writable
    from fic.core.model import check_model_folder

    check_writable(cfg.out, folder=True, field="out")
    folder = Path(cfg.model.path)
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        raise FicError("is a LoRA adapter, not a model; start VASD from the merged SFT model "
                       "(train SFT with save_merged=true and use out/final-merged)", path=str(folder), field="model.path")
    check_model_folder(cfg.model.path)
    if cfg.regularizer.kind in ("anchor", "both") and not Path(cfg.data.anchor_path).is_file():
        raise FicError("SFT corpus not found (make one with `fic sft-data`)", path=cfg.data.anchor_path,
                       field="data.anchor_path")
    if cfg.rollout.backend == "vllm":
        from fic.backends.vllm import import_vllm

        import_vllm()


def load_instances(cfg: VASDConfig) -> tuple[list, str, dict]:
    """The rollout instances (sharded, at least 2 shards, none of the evaluation's), a digest of
    them for resume checks, and the overlap with the evaluation data that was dropped."""
    import hashlib
    import json

    from fic.data.sources import load_source, shard_missing
    from fic.data.splits import exclude_instances

    instances = []
    for spec in cfg.data.source:
        loaded = load_source(spec, cfg.data.task, limit=cfg.data.limit, seed=cfg.data.seed)
        sharded, _ = shard_missing(loaded, seed=cfg.data.seed)
        instances += [i for i in sharded if len(i.shards) >= 2]
    instances, overlap = exclude_instances(instances, cfg.data.exclude)
    if not instances:
        raise FicError(f"no instance with two or more shards in {', '.join(cfg.data.source)} outside the excluded "
                       "evaluation data", field="data.source")
    digest = hashlib.sha256("\n".join(json.dumps(i.to_dict(), sort_keys=True) for i in instances).encode())
    return instances, digest.hexdigest(), overlap


def check_against_tokenizer(cfg: VASDConfig, tokenizer: Any, instances: list) -> None:
    """Settings that only the tokenizer and data can check, before any model loads."""
    from fic.training.vasd.distill import teacher_prompts
    from fic.training.vasd.step import teacher_views

    if cfg.loss.estimator == "topk" and cfg.loss.top_k >= len(tokenizer):
        raise FicError(f"top_k {cfg.loss.top_k} is not below the vocabulary size {len(tokenizer)}",
                       field="loss.top_k")
    for instance in instances[:8]:  # one bad instance is enough to tell the user the view cannot be rendered
        try:
            teacher_prompts(tokenizer, instance, teacher_views(cfg))
        except FicError as err:
            raise FicError(f"teacher view {cfg.teacher.view!r} cannot be rendered for {instance.task_id}: "
                           f"{err.message}", field="teacher.view") from None


# --------------------------------------------------------------------------- the recipe

def train(cfg: VASDConfig) -> dict:
    """Run the recipe; return the final model folder (`model_dir`), the trained model in memory
    (`model`), `steps` and the last step's figures (`last`)."""
    check_inputs(cfg)
    from accelerate.utils import set_seed

    from fic.conversation.classify import make_classifier
    from fic.core.files import append_jsonl, file_sha256, write_json
    from fic.core.generation import SamplingParams
    from fic.core.model import load_template_checked_tokenizer
    from fic.core.seeding import derive_seed
    from fic.conversation.simulator import make_conversations, play
    from fic.training import checkpoints, loop
    from fic.training.data import DataOrder, load_corpus
    from fic.training.vasd.distill import DistillLoss
    from fic.training.losses import check_target_path, window_backward
    from fic.training.vasd.step import (
        ema_state,
        ema_update,
        make_rollout_backend,
        rollout_figures,
        sample_rows,
        step_batches,
        sync_rollout_backend,
        teacher_parts,
    )
    from fic.conversation.users import make_user

    accelerator = loop.make_accelerator(cfg)
    main, world, rank, say = (accelerator.is_main_process, accelerator.num_processes, accelerator.process_index,
                              accelerator.print)
    if loop.is_zero3(accelerator) and (cfg.teacher.mode == "ema" or (not cfg.lora.enabled and
                                                                      cfg.teacher.mode == "frozen")):
        raise FicError("under ZeRO-3 the teacher must not be a second copy of the model: use LoRA (the frozen "
                       "teacher is the adapter-free model) or teacher.mode=live", field="teacher.mode")
    resume_from, saved = loop.resume_point(cfg, say)
    tokenizer = load_template_checked_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    instances, data_sha, overlap = load_instances(cfg)
    say(f"evaluation data kept out: {overlap['dropped']} overlapping instance(s) dropped "
        f"({', '.join(cfg.data.exclude.sources) or 'no exclude.sources named'})")
    check_against_tokenizer(cfg, tokenizer, instances)
    anchors, anchor_stats = [], {"used": 0}
    if cfg.regularizer.kind in ("anchor", "both"):
        anchors, anchor_stats = load_corpus(cfg.data.anchor_path, tokenizer, cfg.data.max_seq_len,
                                            progress=main and cfg.logging.progress, targets=cfg.regularizer.anchor_targets)
        data_sha += ":" + file_sha256(cfg.data.anchor_path)
    if saved is not None:
        changed = checkpoints.check_compatible(saved, cfg, MUST_MATCH, data_sha, "rollout instances and anchor corpus",
                                               world, resume_from)
        if changed:
            say(f"resuming with changed settings: {', '.join(changed)}")
    steps, G, mbs = cfg.train.max_steps, cfg.train.grad_accum_steps, cfg.train.micro_batch_size
    per_rank = mbs * G
    n_anchor = round(cfg.regularizer.anchor_share * per_rank) if anchors else 0
    say(f"{len(instances)} rollout tasks, {anchor_stats['used']} anchor conversations; {steps} steps of "
        f"{per_rank} rollouts (+{n_anchor} anchors) x {world} process(es); teacher {cfg.teacher.mode}/"
        f"{cfg.teacher.view}, {cfg.loss.divergence} ({cfg.loss.estimator}), regulariser {cfg.regularizer.kind}")
    order = DataOrder(len(instances), per_rank, world, rank, cfg.data.seed, cfg.data.shuffle)
    anchor_order = DataOrder(len(anchors), n_anchor, world, rank, cfg.data.seed + 1, True) if n_anchor else None

    set_seed(cfg.train.seed)
    model = loop.build_model(cfg, device=str(accelerator.device))
    if not loop.is_zero3(accelerator):
        check_target_path(model.eval(), len(tokenizer))
        model.train()
    parts = teacher_parts(cfg, model)
    loss = DistillLoss(model, parts["head"], parts["ref_head"], divergence=cfg.loss.divergence,
                       estimator=cfg.loss.estimator, beta=cfg.loss.beta, temperature=cfg.loss.temperature,
                       top_k=cfg.loss.top_k, chunk_tokens=cfg.train.loss_chunk_tokens)
    loss_model, optimizer, scheduler = loop.prepare(accelerator, loss, cfg, steps)
    start, run_id = loop.restore(accelerator, cfg, resume_from, saved)
    if main:
        write_json(Path(cfg.out) / "data_overlap.json", overlap)
    if resume_from is not None and parts["copy"] is not None and cfg.teacher.mode == "ema":
        from safetensors.torch import load_file

        parts["copy"].load_state_dict(load_file(str(resume_from / "ema.safetensors")), strict=False)
    policy = accelerator.unwrap_model(loss_model).model
    generator = make_rollout_backend(cfg, policy, tokenizer)
    user = make_user(cfg.rollout.user.kind, None if cfg.rollout.user.kind == "verbatim" else _user_backend(cfg),
                     **({"temperature": cfg.rollout.user.temperature, "max_new_tokens": cfg.rollout.user.max_new_tokens}
                        if cfg.rollout.user.kind == "llm" else {}))
    classifier = make_classifier("rule")
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p)
    weights = {"distill": 1.0, "anchor": cfg.regularizer.anchor_weight if n_anchor else 0.0,
               "reference": cfg.regularizer.reference_weight if parts["ref_head"] is not None else 0.0}
    weights = {k: v for k, v in weights.items() if v > 0}
    log = loop.RunLog(cfg, accelerator, steps, start, run_id, desc="vasd", postfix=lambda f: {
        "loss": f"{f['loss']:.4f}", "acc": f"{f['rollout_accuracy']:.2f}", "early": f"{f['premature_answer_rate']:.2f}"})
    out = Path(cfg.out)

    held_out = load_held_out(cfg)
    if held_out and start == 0 and main:  # the point the held-out figures are compared with
        before = evaluate_now(cfg, held_out, policy, generator, tokenizer, parts, loss, accelerator,
                              out / "eval" / "step-0")
        append_jsonl(out / "metrics.jsonl", {"step": 0, **before})
        say("before training: " + ", ".join(f"{k}={v:.4g}" for k, v in before.items() if v is not None))
    last: dict = {}
    loss_model.train()
    for step in range(start + 1, steps + 1):
        seconds = {}
        began = time.perf_counter()
        convs = make_conversations([instances[i] for i in order.micro_batch(step - 1)], ["sharded"], 1)
        play(convs, generator, user, classifier, params, batch_size=len(convs), stop_at_correct=False,
             seed=derive_seed(cfg.train.seed, "rollout", step, rank), max_context=cfg.rollout.max_conversation_tokens)
        seconds["rollout_s"] = time.perf_counter() - began
        began = time.perf_counter()
        chosen = [anchors[i] for i in anchor_order.micro_batch(step - 1)] if anchor_order else []
        model.eval()  # no dropout in the teacher and reference passes
        batches, left_out = step_batches(cfg, convs, chosen, tokenizer, parts, accelerator.device, accelerator.autocast)
        model.train()
        seconds["teacher_s"] = time.perf_counter() - began
        began = time.perf_counter()
        counts = [b.pop("counts") for b in batches]
        window = window_backward(accelerator, loss_model, batches, counts, weights)
        seconds["student_s"] = time.perf_counter() - began
        began = time.perf_counter()
        figures = loop.optimizer_step(accelerator, loss_model, optimizer, scheduler, cfg.optim.max_grad_norm)
        if cfg.teacher.mode == "ema":
            ema_update(parts["copy"], accelerator.unwrap_model(loss_model).model, cfg.teacher.ema_rate)
        sync_rollout_backend(generator, policy, cfg, convs, say)
        seconds["optimizer_s"] = time.perf_counter() - began
        last = {"loss": window["loss"], "divergence_per_token": window.get("distill"),
                "anchor_ce": window.get("anchor"), "reference_divergence": window.get("reference"),
                "answer_tokens": int(window.get("n_distill", 0)), **figures, **rollout_figures(convs),
                **{f"left_out_{k}": v for k, v in left_out.items()}, **seconds}
        tables = None
        if cfg.logging.samples_every and step % cfg.logging.samples_every == 0:
            rows = sample_rows(convs)
            tables = {"samples": {"columns": ["task_id", "score", "conversation"], "rows": rows}}
            if main:
                for row in rows:
                    append_jsonl(out / "samples.jsonl", {"step": step, "task_id": row[0], "score": row[1],
                                                         "conversation": row[2]})
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == steps):
            last.update(evaluate_now(cfg, held_out, policy, generator, tokenizer, parts, loss, accelerator,
                                     out / "eval" / f"step-{step}"))
        log.step(step, last, tables)
        state = {"world_size": world, "data_sha256": data_sha, "config": config_to_dict(cfg), "wandb_id": run_id,
                 "loss": last["loss"]}
        extra = None
        if cfg.teacher.mode == "ema":
            def extra(folder: Path) -> None:
                from safetensors.torch import save_file

                save_file(ema_state(parts["copy"], policy), str(folder / "ema.safetensors"))
        loop.maybe_checkpoint(accelerator, cfg, step, steps, state, extra)
    log.close({"final_loss": last.get("loss"), "steps": steps})

    result = {"steps": steps, "world_size": world, "final_loss": last.get("loss", (saved or {}).get("loss"))}
    final = checkpoints.save_final(accelerator, loss_model, cfg, out, lambda kind: model_card(cfg, result, kind))
    say(f"saved {final}" + (f" and {out / 'final-merged'}" if cfg.save_merged else ""))
    accelerator.end_training()
    return {"model_dir": final, "model": accelerator.unwrap_model(loss_model).model, "last": last, **result}


def _user_backend(cfg: VASDConfig) -> Any:
    from fic.backends import make_backend

    return make_backend(cfg.rollout.user.backend)


def evaluate_now(cfg: VASDConfig, held_out: list, policy: Any, generator: Any, tokenizer: Any, parts: dict,
                 loss: Any, accelerator: Any, out: Path) -> dict:
    """On the held-out tasks (main process): the divergence per answer token (`eval_divergence_per_token`)
    and, for each of `eval.views`, a `fic eval` of the live model (`out/eval/step-N/`)."""
    if not accelerator.is_main_process:
        return {}
    from fic.backends.hf import HFBackend
    from fic.evaluation.evaluate import EvalConfig, evaluate
    from fic.core.generation import BackendConfig
    from fic.training.vasd.step import held_out_divergence

    policy.eval()
    figures = {"eval_divergence_per_token": held_out_divergence(cfg, held_out, generator, tokenizer, parts, loss,
                                                                accelerator.device, accelerator.autocast)}
    policy.train()
    if cfg.eval.views:
        eval_cfg = EvalConfig(model=BackendConfig(model=str(out)), views=list(cfg.eval.views), runs=1,
                              temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens, out=str(out))
        eval_cfg.data.source, eval_cfg.data.task, eval_cfg.data.limit = cfg.eval.source, cfg.eval.task, cfg.eval.limit
        metrics = evaluate(eval_cfg, assistant=HFBackend(policy, tokenizer, batch_size=cfg.rollout.batch_size),
                           progress=False)
        for view, values in metrics["views"].items():
            figures[f"eval_{view}_P"] = values.get("P")
            if values.get("premature_answer_rate") is not None:
                figures[f"eval_{view}_premature_answer_rate"] = values["premature_answer_rate"]
    return figures


def load_held_out(cfg: VASDConfig) -> list:
    from fic.data.sources import load_source, shard_missing

    if not cfg.eval.every:
        return []
    sharded, _ = shard_missing(load_source(cfg.eval.source, cfg.eval.task, limit=cfg.eval.limit, seed=cfg.data.seed))
    return [i for i in sharded if len(i.shards) >= 2]


def model_card(cfg: VASDConfig, result: dict, kind: str) -> str:
    from fic.training.checkpoints import model_card as card

    loss = f"{cfg.loss.divergence} ({cfg.loss.estimator}, T={cfg.loss.temperature})"
    return card(cfg, title="FiC VASD", tags=["fic", "vasd", "self-distillation", "multi-turn"], kind=kind,
                summary="Trained with `fic train vasd` (FiC stage 2, View-Asymmetric Self-Distillation): the model "
                        "plays sharded conversations on-policy and is pulled, at its final reply's tokens, towards its "
                        "own next-token distribution given the single-turn view",
                facts=[f"Started from: `{cfg.model.path}` (the SFT warm-start checkpoint)",
                       f"Rollout tasks: {', '.join(cfg.data.source)} (task {cfg.data.task}, seed {cfg.data.seed})",
                       f"Teacher: {cfg.teacher.mode}, view {cfg.teacher.view}; loss {loss}; regulariser "
                       f"{cfg.regularizer.kind}" + (f" on `{cfg.data.anchor_path}`" if cfg.data.anchor_path else ""),
                       f"Training: {result['steps']} optimizer steps, {result['world_size']} process(es), "
                       f"{cfg.train.micro_batch_size} x {cfg.train.grad_accum_steps} rollouts per process per step; "
                       f"final loss {result['final_loss']:.4f}" if result["final_loss"] is not None else
                       f"Training: {result['steps']} optimizer steps"])


def main(argv: list[str] | None = None) -> int:
    from fic.training.loop import recipe_main

    return recipe_main(VASDConfig, train, "vasd", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
