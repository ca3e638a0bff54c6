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

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from accelerate.utils import set_seed

from fic.core.config import config_to_dict, setting
from fic.core.errors import FicError
from fic.core.files import check_writable, file_sha256, read_json
from fic.core.model import check_model_folder, load_template_checked_tokenizer
from fic.training import checkpoints, loop
from fic.training.checkpoints import model_card as card
from fic.training.config import RunConfig
from fic.training.data import DataOrder, collate, load_corpus
from fic.training.losses import TargetLoss, check_target_path, target_counts, window_backward

# Settings a resumed run must share with the checkpoint: anything else changes what the
# saved optimizer state, RNG and data position mean.
MUST_MATCH = ("model.path", "model.dtype", "lora", "data.max_seq_len", "data.seed", "data.shuffle", "data.bucket",
              "train.micro_batch_size", "train.grad_accum_steps", "train.seed", "train.loss_chunk_tokens")


@dataclass
class DataSection:
    path: str = setting("data/gsm_symbolic.sft.jsonl", "The SFT corpus (JSONL from `fic sft-data`): records with "
                        "`messages`; assistant turns with `train: false` stay in context, out of the loss.")
    max_seq_len: int = setting(2048, "Conversations longer than this many tokens are skipped (and counted): "
                               "cutting one would drop its final answer.", min=8)
    shuffle: bool = setting(True, "Visit records in a seeded random order, a new permutation each epoch.")
    seed: int = setting(0, "Seed of the per-epoch permutations.")
    bucket: int = setting(16, "Group conversations of similar length into micro-batches, within windows of this "
                          "many optimizer steps' worth of data (less padding, fewer wasted FLOPs; 0: off).", min=0)


@dataclass
class SFTConfig(RunConfig):
    """Settings of the SFT recipe (`fic/train_sft.py`, `fic train sft`)."""

    data: DataSection = setting(DataSection(), "The SFT corpus.")
    out: str = setting("runs/sft", "Output folder: config, metrics, checkpoints, final model.")

    def check(self, source: str) -> None:
        super().check(source)
        if self.train.max_steps is None and self.train.epochs <= 0:
            raise FicError("set train.max_steps or a positive train.epochs", path=source, field="train.epochs")


def total_steps(cfg: SFTConfig, n_examples: int, world: int) -> int:
    if cfg.train.max_steps is not None:
        return cfg.train.max_steps
    per_step = cfg.train.micro_batch_size * cfg.train.grad_accum_steps * world
    return max(1, math.ceil(cfg.train.epochs * n_examples / per_step))


def check_inputs(cfg: SFTConfig) -> None:
    """Missing files and an output folder that cannot be written fail here, in a second, before
    the model loads."""

    check_writable(cfg.out, folder=True, field="out")
    check_model_folder(cfg.model.path)
    if not Path(cfg.data.path).is_file():
        raise FicError("SFT corpus not found (make one with `fic sft-data`)", path=cfg.data.path, field="data.path")


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
    say(f"{corpus['used']} conversations ({corpus['skipped_too_long']} skipped as too long), "
        f"{corpus['target_tokens']} target tokens; {steps} steps of {cfg.train.micro_batch_size} x {G} x {world} "
        "conversations")
    order = DataOrder(len(examples), cfg.train.micro_batch_size, world, accelerator.process_index,
                      cfg.data.seed, cfg.data.shuffle, lengths=[len(e.input_ids) for e in examples],
                      bucket=cfg.data.bucket * G)

    set_seed(cfg.train.seed)
    model = loop.build_model(cfg, device=str(accelerator.device))
    if not loop.is_zero3(accelerator):  # under ZeRO-3 the weights are partitioned already
        check_target_path(model.eval(), len(tokenizer))
        model.train()
    loss_model, optimizer, scheduler = loop.prepare(accelerator, TargetLoss(model, cfg.train.loss_chunk_tokens),
                                                    cfg, steps)
    start, run_id = loop.restore(accelerator, cfg, resume_from, saved)
    log = loop.RunLog(cfg, accelerator, steps, start, run_id, desc="sft", data_card=shown_card,
                      postfix=lambda f: {"loss": f"{f['loss']:.4f}", "tok_s": f"{f['target_tokens_per_s']:.0f}"})

    last = {"loss": float("nan")}
    loss_model.train()
    for step in range(start + 1, steps + 1):
        began = time.perf_counter()
        batches = [collate([examples[i] for i in order.micro_batch(k)], tokenizer.pad_token_id,
                           cfg.train.pad_to_multiple)
                   for k in range((step - 1) * G, step * G)]
        window = window_backward(accelerator, loss_model, batches, [target_counts(b) for b in batches], {"ce": 1.0})
        figures = loop.optimizer_step(accelerator, loss_model, optimizer, scheduler, cfg.optim.max_grad_norm)
        seconds = time.perf_counter() - began
        last = {"loss": window["loss"], **figures, "target_tokens": int(window["n_ce"]),
                "tokens": int(window["n_tokens"]), "epoch": round(order.epoch_at(step * G), 4),
                "target_tokens_per_s": window["n_ce"] / seconds, "tokens_per_s": window["n_tokens"] / seconds}
        log.step(step, last)
        loop.maybe_checkpoint(accelerator, cfg, step, steps,
                              {"micro_batches": step * G, "world_size": world, "data_sha256": corpus["sha256"],
                               "config": config_to_dict(cfg), "wandb_id": run_id, "loss": last["loss"]})
    log.close({"final_loss": last["loss"], "steps": steps})

    if start >= steps:
        say(f"the checkpoint is at step {start} of {steps}: nothing left to train, saving the final model")
        last = {"loss": saved.get("loss", float("nan"))}
    result = {"steps": steps, "world_size": world, "final_loss": last["loss"]}
    final = checkpoints.save_final(accelerator, loss_model, cfg, Path(cfg.out),
                                   lambda kind: model_card(cfg, corpus, result, kind))
    say(f"saved {final}" + (f" and {Path(cfg.out) / 'final-merged'}" if cfg.save_merged else ""))
    accelerator.end_training()
    return {"model_dir": final, "model": accelerator.unwrap_model(loss_model).model, **result}


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

    return card(cfg, title="FiC SFT warm start", tags=["fic", "sft", "multi-turn"], kind=kind,
                summary="Fine-tuned with `fic train sft`: causal-LM loss on the assistant tokens of multi-turn "
                        "conversations where the task arrives piece by piece (FiC stage 1)",
                facts=[f"Data: `{cfg.data.path}` (sha256 `{corpus['sha256']}`): {corpus['used']} of "
                       f"{corpus['records']} conversations used ({corpus['skipped_too_long']} longer than "
                       f"{cfg.data.max_seq_len} tokens skipped), {corpus['target_tokens']} target tokens per epoch",
                       f"Training: {result['steps']} optimizer steps, {result['world_size']} process(es), "
                       f"{cfg.train.micro_batch_size} x {cfg.train.grad_accum_steps} conversations per process per "
                       f"step; final loss {result['final_loss']:.4f}"])


def main(argv: list[str] | None = None) -> int:
    return loop.recipe_main(SFTConfig, train, "sft", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
