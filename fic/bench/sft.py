"""`fic bench sft`: FiC's SFT step against TRL's `SFTTrainer`, and the memory of the loss.

Throughput: the same model, the same conversations (a corpus built in-process by the SFT
corpus builder from reasoning-gym problems), the same micro-batches in the same order, the
same optimizer (AdamW, constant lr, clipping at 1.0) and number of steps. FiC runs the recipe's
own step (`fic.training.sft.SFTStep`) at `--precision` (auto: what the recipe picks here), and
again in float32; TRL runs at its best precision here (bf16 autocast where bf16 is fast, else
float32). TRL gets pre-tokenised `input_ids` and `labels` (-100 outside FiC's assistant mask),
so all train on exactly the same target tokens. They alternate step by step in one process
(FiC's steps on a batch run right after TRL's step on it), so drifting load from other
processes weighs on all alike. Figures are target tokens per second over the timed steps (after
warm-up steps); `ratio` is FiC / TRL, `fp32_ratio` FiC / FiC in float32, and with `--also P`
`also_ratio` FiC / FiC at precision P (`--precision bf16_copy --also bf16`: the copy against
autocast, on the same batches in the same minutes).

Memory: for one 2k-token conversation on the model, the bytes autograd keeps for backward
with FiC's target-only chunked loss and with the usual full-logits loss (`model(...,
labels=...)`), and the size of the largest logits tensor each one builds.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from fic.bench.profile import profile
from fic.bench.roofline import peak_rate, shape, train_flops
from fic.core.errors import FicError
from fic.core.model import BUNDLED_MODEL_DIR, fast_bf16, load_model, load_tokenizer
from fic.corpus.build import SFTDataConfig, load_instances, make_corpus
from fic.training.data import IGNORE, padded_width, render_examples
from fic.training.losses import TargetLoss

PRECISIONS = ("auto", "fp32", "bf16", "bf16_copy")
PRECISION_SETTING = {"auto": "auto", "fp32": "no", "bf16": "bf16", "bf16_copy": "bf16_copy"}  # -> train.mixed_precision


def add_arguments(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--model", default=str(BUNDLED_MODEL_DIR),
                        help="model folder (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--steps", type=int, default=6, help="timed optimizer steps per trainer")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="conversations per step")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="FiC's precision: auto (what the recipe picks here: bf16_copy where bf16 is fast, else "
                        "fp32), fp32, bf16 (autocast) or bf16_copy (fic.training.precision)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated problems")
    parser.add_argument("--memory-tokens", type=int, default=2048,
                        help="length of the conversation of the memory figure (0: skip it)")
    parser.add_argument("--skip-trl", action="store_true", help="time FiC only")
    parser.add_argument("--skip-fp32", action="store_true", help="do not time FiC in float32 too")
    parser.add_argument("--also", choices=PRECISIONS[1:], default=None,
                        help="also time FiC at this precision on the same batches, interleaved (e.g. bf16 against "
                        "bf16_copy): also_target_tokens_per_s and also_ratio")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of FiC's SFT config for its steps (repeatable), e.g. "
                        "train.pad_to_multiple=64 or model.gradient_checkpointing=true (the demo's)")
    parser.add_argument("--profile", action="store_true",
                        help="also run one FiC step under torch's profiler: the share of each kind of work")


def make_records(n: int, seed: int) -> list[dict]:
    """`n` SFT conversations (deferral, recovery, single-turn) from the corpus builder."""

    cfg = SFTDataConfig(seed=seed)
    cfg.data.limit, cfg.data.seed = 2 * n + 8, seed  # some problems cannot be sharded
    instances, _ = load_instances(cfg)
    records, _ = make_corpus(instances, cfg, progress=False)
    if len(records) < n:
        raise FicError(f"the corpus builder made {len(records)} conversations, the benchmark needs {n}")
    return records[:n]


class FicStepper:
    """FiC's SFT step as the recipe takes it (`fic.training.sft.SFTStep`: its loss, AdamW, clipping
    and precision) on its own copy of the model, at a constant learning rate of 1e-5."""

    def __init__(self, model_dir: str, pad_id: int, precision: str, micro_batch_size: int,
                 overrides: list[str] = ()):
        from fic.core.config import load_config
        from fic.training.loop import build_model, make_accelerator
        from fic.training.sft import SFTConfig, SFTStep

        self.out = tempfile.TemporaryDirectory()
        cfg = load_config(SFTConfig, None, [
            f"model.path={model_dir}", f"out={self.out.name}", "train.max_steps=1000000",
            f"train.micro_batch_size={micro_batch_size}", "train.grad_accum_steps=1",
            f"train.mixed_precision={PRECISION_SETTING[precision]}", "optim.lr=1e-5", "optim.schedule=constant",
            "optim.max_grad_norm=1.0", "logging.wandb=false", *overrides])
        # Each stepper is prepared under its own precision: accelerate keeps one process-wide state
        # and refuses a second precision, so it is reset first. What a stepper needs of it is fixed
        # at prepare (the autocast around the forward) and in its own Accelerator.
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(True)
        with contextlib.redirect_stdout(sys.stderr):  # its precision line: stdout is the figures'
            accelerator = make_accelerator(cfg)
        self.sft = SFTStep(cfg, accelerator, build_model(cfg, device="cpu"), [], pad_id, cfg.train.max_steps)

    def step(self, examples: list) -> float:
        began = time.perf_counter()
        self.sft.train_on([examples])
        return time.perf_counter() - began


def interleaved_times(model_dir: str, batches: list[list], tokenizer: Any, precision: str, with_trl: bool = True,
                      with_fp32: bool = True, overrides: list[str] = (), profiled: dict | None = None,
                      also: str | None = None) -> dict[str, list[float]]:
    """Seconds per step of FiC (at `precision`, and in float32 too with `with_fp32`) and of TRL's
    SFTTrainer on the same batches, alternating step by step (FiC's steps run
    right after TRL's step on the same batch, from a trainer callback), so all see the same
    machine load; on a shared machine the load drifts by several times."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    steppers = {"fic": FicStepper(model_dir, tokenizer.pad_token_id, precision, len(batches[0]), overrides)}
    if with_fp32:
        steppers["fic_fp32"] = FicStepper(model_dir, tokenizer.pad_token_id, "fp32", len(batches[0]), overrides)
    if also is not None:
        steppers["fic_also"] = FicStepper(model_dir, tokenizer.pad_token_id, also, len(batches[0]), overrides)
    times: dict[str, list[float]] = {name: [] for name in steppers}

    def step_fic(examples: list) -> None:
        for name, stepper in steppers.items():
            times[name].append(stepper.step(examples))

    if profiled is not None:  # one more step of FiC's, under the profiler, before the timed ones
        fic = steppers["fic"]
        profiled.update(profile(lambda: fic.sft.train_on([batches[0]]), fic.sft.model))
    if not with_trl:
        for examples in batches:
            step_fic(examples)
        return times
    rows = []
    for examples in batches:
        for e in examples:  # TRL shifts labels itself: label t is the token at t, trained where FiC targets it
            rows.append({"input_ids": e.input_ids, "labels": [IGNORE] + e.targets[:-1]})
    times["trl"] = []

    class Alternate(TrainerCallback):
        def __init__(self) -> None:
            self.began = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times["trl"].append(time.perf_counter() - self.began)
            step_fic(batches[state.global_step - 1])

    with tempfile.TemporaryDirectory() as out:
        # TRL's defaults changed to match FiC's recipe: no gradient checkpointing, and bf16 only
        # where it is fast (TRL turns it on by default; CPUs without native bf16 emulate it slowly).
        args = SFTConfig(output_dir=out, per_device_train_batch_size=len(batches[0]), gradient_accumulation_steps=1,
                         max_steps=len(batches), learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0,
                         weight_decay=0.0, max_grad_norm=1.0, bf16=fast_bf16("cpu") is not None, use_cpu=True,
                         report_to="none", save_strategy="no", logging_steps=10_000, disable_tqdm=True,
                         train_sampling_strategy="sequential", dataloader_num_workers=0, max_length=None, seed=0,
                         gradient_checkpointing=False)
        trainer = SFTTrainer(model=load_model(model_dir, dtype="float32"), args=args,
                             train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                             callbacks=[Alternate()])
        with contextlib.redirect_stdout(sys.stderr):  # TRL prints {'train_runtime': ...}: stdout is the figures'
            trainer.train()
        if trainer.accelerator.mixed_precision != ("bf16" if args.bf16 else "no"):
            raise FicError(f"TRL trained with mixed_precision={trainer.accelerator.mixed_precision}, not the "
                           f"{'bf16' if args.bf16 else 'no'} it was given: the comparison would be off")
    return times


def _saved_bytes(fn, model: torch.nn.Module) -> int:
    """Bytes of the distinct tensors autograd saves for backward while `fn()` runs, weights excluded."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def memory_figures(model_dir: str, tokens: int, chunk: int = 1024) -> dict:
    """Saved-for-backward MB of one `tokens`-long conversation (second half targets), FiC vs full logits."""

    model = load_model(model_dir, dtype="float32").train()
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(0))
    targets = torch.full_like(ids, IGNORE)
    targets[:, tokens // 2 - 1:-1] = ids[:, tokens // 2:]
    labels = torch.full_like(ids, IGNORE)
    labels[:, tokens // 2:] = ids[:, tokens // 2:]
    mask = torch.ones_like(ids)
    fic = TargetLoss(model, chunk)
    fic_bytes = _saved_bytes(lambda: fic(ids, mask, targets)["ce"], model)
    full_bytes = _saved_bytes(lambda: model(input_ids=ids, attention_mask=mask, labels=labels).loss, model)
    n_targets = int((targets != IGNORE).sum())
    mb = 1 / 2**20
    return {"memory_tokens": tokens, "memory_vocab": vocab, "memory_targets": n_targets,
            "fic_saved_mb": round(fic_bytes * mb, 1), "full_logits_saved_mb": round(full_bytes * mb, 1),
            "fic_largest_logits_mb": round(min(chunk, n_targets) * vocab * 4 * mb, 1),
            "full_largest_logits_mb": round(tokens * vocab * 4 * mb, 1)}


def measure(args: argparse.Namespace) -> dict:
    from accelerate.state import AcceleratorState


    if args.steps < 1 or args.micro_batch_size < 1 or args.warmup < 0:
        raise FicError("--steps and --micro-batch-size must be at least 1, --warmup at least 0")
    precision = args.precision
    tokenizer = load_tokenizer(args.model)
    n = (args.steps + args.warmup) * args.micro_batch_size
    examples, _ = render_examples(make_records(n, args.seed), tokenizer, max_seq_len=1 << 30, progress=False)
    mbs = args.micro_batch_size
    batches = [examples[i:i + mbs] for i in range(0, n, mbs)]
    timed = batches[args.warmup:]
    target_tokens = sum(e.n_targets for b in timed for e in b)
    resolved = _resolved(precision)
    profiled: dict | None = {} if args.profile else None
    times = interleaved_times(args.model, batches, tokenizer, precision, with_trl=not args.skip_trl,
                              with_fp32=not args.skip_fp32 and resolved["precision"] != "fp32",
                              overrides=args.overrides, profiled=profiled, also=args.also)
    AcceleratorState._reset_state(True)
    times = {name: seconds[args.warmup:] for name, seconds in times.items()}
    fic = times["fic"]
    figures = {"model": args.model, **resolved,
               "trl_precision": "bf16" if fast_bf16("cpu") else "fp32", "micro_batch_size": mbs,
               "steps": args.steps, "target_tokens_per_step": target_tokens / args.steps,
               "tokens_per_step": sum(len(e.input_ids) for b in timed for e in b) / args.steps,
               "threads": torch.get_num_threads(),
               "fic_target_tokens_per_s": target_tokens / sum(fic), "fic_median_step_s": statistics.median(fic)}
    # The roofline: the step's FLOP/s (padding not counted) against this machine's matmul rate in the dtype
    # `auto` computes in (`peak_rate`), now.
    dims = shape(load_model(args.model, dtype="float32"))
    flops = sum(train_flops(dims, [len(e.input_ids) for e in b], sum(e.n_targets for e in b)) for b in timed)
    peak, peak_dtype = peak_rate()
    figures.update({"fic_tflops": flops / sum(fic) / 1e12, "matmul_peak_tflops": peak / 1e12,
                    "matmul_peak_dtype": peak_dtype,
                    "fic_roofline_share": flops / sum(fic) / peak})
    if "fic_also" in times:
        figures.update({"also_precision": _resolved(args.also)["precision"],
                        "also_target_tokens_per_s": target_tokens / sum(times["fic_also"]),
                        "also_ratio": sum(times["fic_also"]) / sum(fic)})
    if "fic_fp32" in times:
        figures.update({"fic_fp32_target_tokens_per_s": target_tokens / sum(times["fic_fp32"]),
                        "fp32_ratio": sum(times["fic_fp32"]) / sum(fic)})
    if "trl" in times:
        figures.update({"trl_target_tokens_per_s": target_tokens / sum(times["trl"]),
                        "trl_median_step_s": statistics.median(times["trl"]),
                        "ratio": sum(times["trl"]) / sum(fic)})
    multiple = _pad_multiple(args.overrides)
    padded = sum(len(b) * padded_width((len(e.input_ids) for e in b), multiple) for b in timed)
    figures["padding_share"] = 1 - figures["tokens_per_step"] * args.steps / padded
    figures.update(profiled or {})
    if args.memory_tokens:
        figures.update(memory_figures(args.model, args.memory_tokens))
    return figures


def _pad_multiple(overrides: list[str]) -> int:
    from fic.core.config import load_config
    from fic.training.sft import SFTConfig

    return load_config(SFTConfig, None, overrides).train.pad_to_multiple


def _resolved(precision: str) -> dict:
    """What FiC computes in at `--precision` (`precision`: fp32, bf16 or bf16_copy) and the line
    the recipe says it with (`fic_precision`)."""
    from fic.core.config import load_config
    from fic.training.precision import training_precision
    from fic.training.sft import SFTConfig

    cfg = load_config(SFTConfig, None, [f"train.mixed_precision={PRECISION_SETTING[precision]}"])
    mixed, copy, said = training_precision(cfg)
    return {"precision": "bf16_copy" if copy else "bf16" if mixed == "bf16" else "fp32",
            "fic_precision": said.removeprefix("precision: ")}
