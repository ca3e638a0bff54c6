"""SFT warm start (FiC stage 1): the causal-LM loss on assistant tokens of multi-turn conversations.

    accelerate launch fic/train_sft.py --config recipes/<backbone>/sft.yaml [key=value ...]
    accelerate launch --config_file launch/deepspeed_zero2.yaml fic/train_sft.py --config ...
    fic train sft --config recipes/<backbone>/sft.yaml [key=value ...]      (one process)

One explicit loop on Accelerate (the shared parts live in `fic/training/`). What it does that
a generic trainer gets wrong:

- Targets are the assistant-mask positions of `fic.core.chat.render_chat` (content and end-of-turn
  token of every trained assistant turn), shifted for next-token prediction.
- The LM head runs only at target positions, in chunks upcast to fp32, so the logits of a
  whole batch ([batch, seq, vocab]) never exist.
- The loss is the summed cross-entropy divided by the number of target tokens of the whole
  accumulation window on all ranks, counted before the window's backward passes.
- Checkpoints (`out/checkpoints/step-N`) are atomic; `resume=true` restores weights,
  optimizer, scheduler, RNG and the data position, so the losses after a resume equal those
  of an uninterrupted run.

Outputs in `out/`: `config.yaml`, `metrics.jsonl` (one line per optimizer step),
`checkpoints/step-N/`, and the final model in `final/` (a Hugging Face folder; the adapter for
LoRA) plus `final-merged/` for LoRA with `save_merged=true`, each with a model card.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from accelerate.utils import set_seed

from fic.core.config import config_to_dict, set_in, set_where
from fic.core.errors import FicError
from fic.core.files import append_jsonl, write_json
from fic.core.model import load_template_checked_tokenizer, template_clause
from fic.core.ranks import phase
from fic.core.records import file_sha256, read_json
from fic.evaluation.live import evaluate_live
from fic.training import checkpoints, loop
from fic.training.curves import read_metrics
from fic.training.data import load_corpus
from fic.training.losses import check_target_path
from fic.training.sft import MUST_MATCH, SFTConfig, SFTStep, check_inputs, plateau, total_steps

DEV_CURVE = "dev_curve.json"  # the dev curve, the plateau rule and where the run stopped


def train(cfg: SFTConfig) -> dict:
    """Run the recipe; return the final model folder (`model_dir`), the trained model as it is
    in memory (`model`, unwrapped; the PEFT model for LoRA), `steps` and `final_loss`."""
    check_inputs(cfg)

    accelerator = loop.make_accelerator(cfg)
    main, world, say = accelerator.is_main_process, accelerator.num_processes, accelerator.print
    resume_from, saved = loop.resume_point(cfg, say)
    tokenizer = load_template_checked_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    examples, corpus = load_corpus(cfg.data.path, tokenizer, cfg.data.max_seq_len, progress=main and cfg.logging.progress)
    corpus["sha256"] = file_sha256(cfg.data.path)
    shown_card = data_card(cfg, corpus)  # before the model loads: a damaged card is one line, at once
    if saved is not None:
        changed = checkpoints.check_compatible(saved, cfg, MUST_MATCH, corpus["sha256"],
                                               data_name=cfg.data.path, world=world, where=resume_from)
        if changed:
            say(f"resuming with changed settings: {', '.join(changed)}")
    steps = total_steps(cfg, len(examples), world)
    G = cfg.train.grad_accum_steps
    say(start_line(cfg, corpus, steps, world) + template_clause(tokenizer))

    set_seed(cfg.train.seed)
    model = loop.build_model(cfg, device=str(accelerator.device))
    if not loop.is_zero3(accelerator):  # under ZeRO-3 the weights are partitioned already
        check_target_path(model.eval(), len(tokenizer))
        model.train()
    sft = SFTStep(cfg, accelerator, model, examples, tokenizer.pad_token_id, steps)
    start, run_id = loop.restore(accelerator, cfg, resume_from, saved)
    log = loop.RunLog(cfg, accelerator, steps, start, run_id, desc="sft", data_card=shown_card,
                      postfix=lambda f: {"loss": f"{f['loss']:.4f}", "tok_s": f"{f['target_tokens_per_s']:.0f}"})

    out = Path(cfg.out)
    curve = DevCurve(cfg, out, start) if cfg.dev.every else None

    def dev_score(step: int) -> dict:  # on every rank, each its share of the dev instances
        with phase(f"the dev curve at step {step}"), loop.root_gathered(sft.loss_model):
            return curve.score(sft.model, tokenizer, step)

    if curve is not None and start == 0:  # the starting point of the curve
        figures = dev_score(0)
        if main:
            append_jsonl(out / "metrics.jsonl", {"step": 0, **figures})

    last = {"loss": float("nan")}
    stopped = None
    sft.loss_model.train()
    for step in range(start + 1, steps + 1):
        with phase(f"step {step}"):
            last = sft.step(step)
        if curve is not None and (step % cfg.dev.every == 0 or step == steps):
            last.update(dev_score(step))
            stopped = step if curve.flat(accelerator) else None
        log.step(step, last)
        with phase(f"the checkpoint at step {step}"):
            loop.maybe_checkpoint(accelerator, cfg, step, steps if stopped is None else step,
                                  {"micro_batches": step * G, "world_size": world, "data_sha256": corpus["sha256"],
                                   "config": config_to_dict(cfg), "wandb_id": run_id, "loss": last["loss"]})
        if stopped is not None:
            say(f"the dev curve has stopped rising at step {step} ({cfg.dev.metric}: "
                f"{', '.join(f'{v:.1f}' for v in curve.values)}; patience {cfg.dev.patience}, min_delta "
                f"{cfg.dev.min_delta:g}): stopping here, {steps - step} steps before train.max_steps")
            break
    log.close({"final_loss": last["loss"], "steps": stopped or steps})

    if start >= steps:
        say(f"the checkpoint is at step {start} of {steps}: nothing left to train, saving the final model")
        last = {"loss": saved.get("loss", float("nan"))}
    result = {"steps": stopped or steps, "world_size": world, "final_loss": last["loss"],
              "plateau": None if curve is None else curve.record(stopped)}
    if curve is not None and main:
        write_json(out / DEV_CURVE, result["plateau"])
    with phase("the final model"):
        final = checkpoints.save_final(accelerator, sft.loss_model, cfg, out,
                                       lambda kind: model_card(cfg, corpus, result, kind))
    say(f"saved {final}" + (f" and {out / 'final-merged'}" if cfg.save_merged else ""))
    accelerator.end_training()
    return {"model_dir": final, "model": sft.model, **result}


def start_line(cfg: SFTConfig, corpus: dict, steps: int, world: int) -> str:
    """What the run will do, before the model loads: the conversations it read and why some are
    left out, the steps and what sets their number, the dev curve, where it writes."""
    per_step = f"{cfg.train.micro_batch_size} x {cfg.train.grad_accum_steps} x {world}"
    if cfg.train.max_steps is not None:
        where = set_in(cfg, "train.max_steps")
        why = f"train.max_steps, {set_where(where)}" if where else "train.max_steps"
    else:
        why = f"train.epochs {cfg.train.epochs:g} of {corpus['used']} conversations"
    dev = (f"; the dev curve every {cfg.dev.every} steps on {cfg.dev.data.limit or 'all'} instances of "
           f"{', '.join(cfg.dev.data.source)} ({', '.join(cfg.dev.views)}), stopping at its plateau" if cfg.dev.every
           else "")
    read = (f"{corpus['used']} of {corpus['records']} conversations of {cfg.data.path} ({corpus['skipped_too_long']} "
            f"longer than data.max_seq_len {cfg.data.max_seq_len} tokens left out), {corpus['target_tokens']} target "
            "tokens")
    every = cfg.checkpoint.every
    saved = ("no resumable checkpoint (checkpoint.every 0)" if not every else
             f"checkpoints every {every} steps" if every < steps else "a checkpoint at the last step only")
    clauses = [read, f"{steps} step{'s' * (steps != 1)} ({why}) of {per_step} conversations{dev}",
               f"from {cfg.model.path}" + (f" with LoRA r={cfg.lora.r}" if cfg.lora.enabled else ""),
               f"outputs in {cfg.out} ({saved}, the model in {Path(cfg.out) / 'final'})"]
    return "fic train sft: " + "; ".join(clauses) + checkpoints.saving_clause(cfg)


def plan(cfg: SFTConfig) -> str:
    """The start line of a run of `cfg` (`fic train sft --dry-run`): the tokenizer reads the corpus;
    no model loads."""
    check_inputs(cfg)
    tokenizer = load_template_checked_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    examples, corpus = load_corpus(cfg.data.path, tokenizer, cfg.data.max_seq_len, progress=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return start_line(cfg, corpus, total_steps(cfg, len(examples), world), world) + template_clause(tokenizer)


class DevCurve:
    """The dev curve of an SFT run (`dev.*`): the live model scored on the dev instances every
    `dev.every` steps (`fic.evaluation.live`, float32 masters, greedy: the same replies whatever the
    batch), its `dev.metric` values, and the plateau rule read on them. Every rank scores: each plays
    its share of the dev instances in lockstep (a ZeRO-3 or FSDP model gathers its weights in every
    forward), the main process writes `dev/step-N`. A resumed run reads the scores it had logged
    back from metrics.jsonl."""

    def __init__(self, cfg: SFTConfig, out: Path, start: int):
        self.cfg, self.out = cfg, out
        self.key = f"dev_{cfg.dev.metric}"
        records = read_metrics(out / "metrics.jsonl") if start and (out / "metrics.jsonl").exists() else []
        self.steps = [r["step"] for r in records if self.key in r]
        self.values = [float(r[self.key]) for r in records if self.key in r]
        # this process's seconds scoring: a stage sized or priced by its time leaves them out
        self.cpu_seconds = self.seconds = 0.0

    def score(self, model: Any, tokenizer: Any, step: int) -> dict:
        dev = self.cfg.dev
        began, wall = time.process_time(), time.perf_counter()
        figures = evaluate_live(model, tokenizer, dev.data, dev.views, max_new_tokens=dev.max_new_tokens,
                                batch_size=dev.batch_size, out=self.out / "dev" / f"step-{step}", prefix="dev_")
        if self.key not in figures:
            raise FicError(f"the dev probe gave no {dev.metric} (it gave {', '.join(sorted(figures)) or 'nothing'})",
                           field="dev.metric")
        self.steps.append(step)
        self.values.append(float(figures[self.key]))
        self.cpu_seconds += time.process_time() - began
        self.seconds += time.perf_counter() - wall
        return figures

    def flat(self, accelerator: Any) -> bool:
        """The plateau rule on the main process's curve, the same answer on every rank."""
        import torch
        from accelerate.utils import broadcast

        dev = self.cfg.dev
        higher = not dev.metric.endswith("premature_answer_rate")
        flag = torch.tensor([float(accelerator.is_main_process
                                   and plateau(self.values, dev.patience, dev.min_delta, higher))],
                            device=accelerator.device)
        return bool(broadcast(flag, from_process=0).item()) if accelerator.num_processes > 1 else bool(flag.item())

    def record(self, stopped: int | None) -> dict:
        dev = self.cfg.dev
        return {"metric": dev.metric, "every": dev.every, "patience": dev.patience, "min_delta": dev.min_delta,
                "curve": [{"step": s, "value": v} for s, v in zip(self.steps, self.values)],
                "stopped_at": stopped, "reason": "plateau" if stopped else "train.max_steps",
                "instances": dev.data.limit, "views": list(dev.views), "cpu_seconds": round(self.cpu_seconds, 1), "seconds": round(self.seconds, 1)}


def data_card(cfg: SFTConfig, corpus: dict) -> dict:
    """What wandb and TensorBoard show of the data: the corpus file, its counts, and the card
    `fic sft-data` wrote beside it (sources, hf: repository, revision and mapping, kinds)."""
    card_file = Path(cfg.data.path).with_suffix(".card.json")
    written = None
    if os.path.lexists(card_file):
        try:
            written = read_json(card_file, "the corpus's data card (JSON)")
        except FicError as err:
            raise FicError(f"{err.message}; remove it or build the corpus again with fic sft-data",
                           path=str(card_file)) from None
    return {"path": cfg.data.path, **{k: v for k, v in corpus.items() if isinstance(v, (int, float, str))},
            "card": written}


def model_card(cfg: SFTConfig, corpus: dict, result: dict, kind: str) -> str:
    return checkpoints.model_card(
        cfg, title="FiC SFT warm start", tags=["fic", "sft", "multi-turn"], kind=kind,
        summary="Fine-tuned with `fic train sft`: causal-LM loss on the assistant tokens of multi-turn "
                "conversations where the task arrives piece by piece (FiC stage 1)",
        facts=[f"Data: `{cfg.data.path}` (sha256 `{corpus['sha256']}`): {corpus['used']} of "
               f"{corpus['records']} conversations used ({corpus['skipped_too_long']} longer than "
               f"{cfg.data.max_seq_len} tokens skipped), {corpus['target_tokens']} target tokens per epoch",
               f"Training: {result['steps']} optimizer steps, {result['world_size']} process(es), "
               f"{cfg.train.micro_batch_size} x {cfg.train.grad_accum_steps} conversations per process per "
               f"step; final loss {result['final_loss']:.4f}", *_plateau_fact(result.get("plateau"))])


def _plateau_fact(plateau: dict | None) -> list[str]:
    if not plateau:
        return []
    curve = ", ".join(f"{p['value']:.1f} (step {p['step']})" for p in plateau["curve"])
    end = (f"stopped at step {plateau['stopped_at']}: no gain of {plateau['min_delta']:g} in {plateau['patience']} "
           "scores" if plateau["stopped_at"] else "ran to train.max_steps without reaching the plateau rule")
    return [f"Dev curve ({plateau['metric']} on {plateau['instances']} dev instances): {curve}; {end}"]


def main(argv: list[str] | None = None) -> int:
    return loop.recipe_main(SFTConfig, train, "sft", __doc__, argv, plan=plan)


if __name__ == "__main__":
    sys.exit(main())
