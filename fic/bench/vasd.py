"""`fic bench vasd`: where the recipe's VASD step spends its time, what it costs over bare
passes and against an SFT step, and the memory of the chunked divergence.

The step is the recipe's own (`fic.training.vasd.step.VASDStep`, built as `fic/train_vasd.py`
builds it), at the precision the recipe would pick here, from `--config` (any VASD YAML, e.g.
the demo's `runs/demo/vasd/config.yaml`, with `--set key=value` overrides) or, without one,
from the recipe's defaults on `--rollouts` sharded gsm_symbolic rollouts of `--max-new-tokens`
and anchor conversations the SFT corpus builder writes. Phases, in seconds:
`rollouts` (generation), `teacher` (the step's micro-batches with the teacher's and reference's
hidden states), `student` (forward and backward of every loss term) and `update` (the optimizer
step and the rollout engine's refresh), the step's own phases (`VASDStep`);
`rollouts_share` = rollout seconds / step seconds. Each timed phase also has its CPU seconds
(`*_cpu_s`, all threads), the unit the demo's equal-compute control is counted in.

`overhead_ratio`: the teacher and student passes over a bare student forward+backward on the
same rows (the model's own full-logits forward and a cross-entropy at the same loss positions)
plus a bare teacher forward on the same single-turn ids, the two alternating `--repeats` times
on the same batches so that load from other processes weighs on both alike.

`sft_step_cpu_s` and `vasd_over_sft`: an SFT step (`fic.training.sft.SFTStep`) of
`--sft-micro-batch-size` conversations of the anchor corpus at the same precision, timed after
the VASD step, and the VASD step's CPU seconds over it.

`memory_ratio`: the peak memory of the chunked divergence (`fic.training.losses.divergence_rows`,
`--chunk-tokens` rows per chunk) over a naive one that builds both sides' full logits, forward
and backward, for `--memory-tokens` answer tokens at a `--memory-vocab` vocabulary (hidden size
`--memory-hidden`); each runs in a fresh process and its peak resident memory above what its
inputs already hold is measured. `max_abs_diff`: the largest difference between the two in the
loss value (per answer token, as training normalises it) and in the gradients of the student's
hidden states and of the LM head.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from fic.bench.profile import profile
from fic.bench.roofline import forward_flops, peak_rate, shape, train_flops
from fic.bench.sft import make_records
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.files import write_jsonl
from fic.core.model import BUNDLED_MODEL_DIR, check_model_folder, load_tokenizer, peak_memory_mb
from fic.training.data import IGNORE, load_corpus
from fic.training.loop import build_model, make_accelerator
from fic.training.losses import divergence, divergence_rows
from fic.training.sft import SFTConfig, SFTStep
from fic.training.vasd.batches import body_inputs
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.inputs import check_inputs, load_rollout_tasks
from fic.training.vasd.prompts import teacher_prompts
from fic.training.vasd.rows import rollout_from
from fic.training.vasd.step import VASDStep

# train.loss_chunk_tokens of recipes/smollm2-135m-instruct/vasd.yaml (a test holds the two equal): the
# memory figure's chunk, given here because an installed package has no recipes folder to read.
RECIPE_CHUNK_TOKENS = 128


def add_arguments(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--config", default=None, help="a VASD config YAML to time (default: the recipe's defaults "
                        "on generated gsm_symbolic rollouts and anchors)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting of the timed config (repeatable)")
    parser.add_argument("--model", default=None, help="model folder (default: the config's model.path, or the "
                        "bundled SmolLM2 without --config)")
    parser.add_argument("--rollouts", type=int, default=8, help="without --config: rollout conversations in the step")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="without --config: rollouts per micro-batch")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="without --config: most tokens of one reply")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of the step without rollouts")
    parser.add_argument("--profile", action="store_true",
                        help="also run one student pass under torch's profiler: the share of each kind of work")
    parser.add_argument("--sft-micro-batch-size", type=int, default=8,
                        help="conversations of the timed SFT step (0: skip it)")
    parser.add_argument("--chunk-tokens", type=int, default=RECIPE_CHUNK_TOKENS,
                        help="LM-head rows per chunk of the memory figure (default: the bundled model's VASD "
                        f"recipe's train.loss_chunk_tokens, {RECIPE_CHUNK_TOKENS})")
    parser.add_argument("--memory-tokens", type=int, default=1024, help="answer tokens of the memory figure (0: skip)")
    parser.add_argument("--memory-vocab", type=int, default=131072, help="vocabulary of the memory figure")
    parser.add_argument("--memory-hidden", type=int, default=576, help="hidden size of the memory figure")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated problems")


def measure(args: argparse.Namespace) -> dict:
    if min(args.rollouts, args.micro_batch_size, args.max_new_tokens, args.repeats) < 1 or \
            min(args.memory_tokens, args.sft_micro_batch_size) < 0:
        raise FicError("--rollouts, --micro-batch-size, --max-new-tokens and --repeats must be at least 1")
    with tempfile.TemporaryDirectory() as scratch:
        cfg = timed_config(args, Path(scratch))
        figures: dict[str, Any] = {"config": args.config or "recipe defaults", "model": cfg.model.path,
                                   "threads": torch.get_num_threads()}
        figures.update(step_figures(cfg, args.repeats, args.sft_micro_batch_size, args.profile))
    if args.memory_tokens:
        figures.update(memory_figures(args.memory_tokens, args.memory_vocab, args.memory_hidden, args.chunk_tokens))
    return figures


def timed_config(args: argparse.Namespace, scratch: Path) -> VASDConfig:
    """The VASD config the bench times: `--config` (or the recipe's defaults on generated data,
    with an anchor corpus written to `scratch`), then `--set`, run for one step into `scratch`."""
    run = [f"out={scratch / 'run'}", "train.max_steps=1", "resume=false", "checkpoint.every=0", "dev.every=0",
           "logging.wandb=false", "logging.tensorboard=false", "logging.progress=false"]
    model = [f"model.path={args.model}"] if args.model else []
    if args.config:
        return load_config(VASDConfig, args.config, [*model, *args.overrides, *run])
    if args.model:
        check_model_folder(args.model)  # before the corpus builder's minute
    anchors = scratch / "anchors.sft.jsonl"
    write_jsonl(anchors, make_records(args.rollouts + 8, args.seed))
    G = max(1, args.rollouts // args.micro_batch_size)
    defaults = [f"model.path={args.model or BUNDLED_MODEL_DIR}", f"data.limit={3 * args.rollouts}",
                f"data.seed={args.seed + 1}", f"anchor.path={anchors}",
                f"train.micro_batch_size={args.micro_batch_size}", f"train.grad_accum_steps={G}",
                f"rollout.max_new_tokens={args.max_new_tokens}", "loss.keep_truncated=true"]  # time every final reply
    return load_config(VASDConfig, None, [*defaults, *args.overrides, *run])


class _Clock:
    """Wall and CPU seconds (all threads of this process) of timed calls."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def time(self, name: str, fn: Callable[[], Any]) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        self.wall.setdefault(name, []).append(time.perf_counter() - wall)
        self.cpu.setdefault(name, []).append(time.process_time() - cpu)
        return result

    def median(self, name: str, cpu: bool = False) -> float:
        return statistics.median((self.cpu if cpu else self.wall)[name])


def step_figures(cfg: VASDConfig, repeats: int, sft_micro_batch_size: int, profiled: bool = False) -> dict:
    """Seconds per phase of one VASD step of `cfg`, its overhead over bare passes, and its CPU
    seconds against an SFT step's."""
    check_inputs(cfg)  # a wrong model folder or corpus path fails in a second, as in the recipe
    with contextlib.redirect_stdout(sys.stderr):  # the recipe's lines; stdout is the figures'
        accelerator = make_accelerator(cfg)
        tokenizer = load_tokenizer(cfg.model.path)
        instances, _, _ = load_rollout_tasks(cfg)
        anchors = []
        if cfg.anchor.share > 0:
            anchors, _ = load_corpus(cfg.anchor.path, tokenizer, cfg.anchor.max_seq_len, progress=False,
                                     targets=cfg.anchor.targets)
        model = build_model(cfg, device=str(accelerator.device))
        vasd = VASDStep(cfg, accelerator, model, tokenizer, instances, anchors, cfg.train.max_steps)
    clock = _Clock()
    convs = clock.time("rollouts", lambda: vasd.rollouts(1))
    batches: list[dict] = []
    for _ in range(repeats):
        batches = clock.time("teacher", lambda: vasd.teacher(convs, 1)[0])
        kept = [dict(b) for b in batches]  # the student pops the counts
        clock.time("student", lambda kept=kept: vasd.student(kept))
        vasd.optimizer.zero_grad(set_to_none=True)
        clock.time("bare", lambda batches=batches: _bare_passes(vasd, convs, batches))
        vasd.optimizer.zero_grad(set_to_none=True)
    if profiled:  # one student pass under the profiler, then its gradients dropped
        again = [dict(b) for b in vasd.teacher(convs, 1)[0]]
        shares = profile(lambda: vasd.student(again), vasd.policy)
        vasd.optimizer.zero_grad(set_to_none=True)
    vasd.student([dict(b) for b in vasd.teacher(convs, 1)[0]])
    clock.time("update", lambda: vasd.update(convs))
    phases = ("rollouts", "teacher", "student", "update")
    step_s = sum(clock.median(name) for name in phases)
    step_cpu_s = sum(clock.median(name, cpu=True) for name in phases)
    figures = {"rollouts": len(convs), "precision": "bf16_copy" if vasd.copy.params else accelerator.mixed_precision,
               **{f"{name}_s": clock.median(name) for name in phases},
               **{f"{name}_cpu_s": clock.median(name, cpu=True) for name in phases},
               "step_s": step_s, "step_cpu_s": step_cpu_s, "rollouts_share": clock.median("rollouts") / step_s,
               "bare_passes_s": clock.median("bare"),
               "overhead_ratio": (sum(clock.wall["teacher"]) + sum(clock.wall["student"])) / sum(clock.wall["bare"])}
    # The roofline of the passes without rollouts: the teacher's forward over its single-turn rows,
    # the student's forward and backward, the heads on the loss rows only.
    dims = shape(vasd.policy)
    counts = [b["counts"] for b in batches]
    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1)]
    head_rows = int(sum((targets != IGNORE).sum() for b in batches for targets in b["targets"].values()))
    teacher_lengths = [len(p) + len(rollout_from(c).answer_ids) for c in convs if c.stop_reason == "last_turn"
                       for p in teacher_prompts(tokenizer, c.instance, ["full"])]
    flops = train_flops(dims, lengths, head_rows) + forward_flops(dims, teacher_lengths, 0)
    passes_s = clock.median("teacher") + clock.median("student")
    peak, peak_dtype = peak_rate()
    figures.update({"passes_tflops": flops / passes_s / 1e12, "matmul_peak_tflops": peak / 1e12,
                    "matmul_peak_dtype": peak_dtype,
                    "passes_roofline_share": flops / passes_s / peak,
                    "answer_tokens": int(sum(c["distill"] for c in counts)),
                    "student_rows": sum(len(b["input_ids"]) for b in batches),
                    "student_positions": sum(b["input_ids"].numel() for b in batches),
                    "student_tokens": int(sum(c["tokens"] for c in counts)),
                    "student_padding_share": 1 - sum(c["tokens"] for c in counts)
                    / max(1, sum(b["input_ids"].numel() for b in batches))})
    if profiled:
        figures.update(shares)
    if sft_micro_batch_size and anchors:
        figures.update(_sft_figures(cfg, anchors, tokenizer.pad_token_id, sft_micro_batch_size, repeats, step_cpu_s))
    return figures


def _sft_figures(cfg: VASDConfig, anchors: list, pad_id: int, micro_batch_size: int, repeats: int,
                 vasd_cpu_s: float) -> dict:
    """An SFT step of `micro_batch_size` anchor conversations (the SFT corpus) on the same model,
    precision and activation checkpointing, as `fic.training.sft.SFTStep` takes it."""
    sft_cfg = load_config(SFTConfig, None, [f"model.path={cfg.model.path}", f"out={Path(cfg.out).parent / 'sft'}",
                                            f"model.gradient_checkpointing={cfg.model.gradient_checkpointing}",
                                            "train.max_steps=1000", f"train.micro_batch_size={micro_batch_size}",
                                            f"train.mixed_precision={cfg.train.mixed_precision}",
                                            f"train.pad_to_multiple={cfg.train.pad_to_multiple}"])
    with contextlib.redirect_stdout(sys.stderr):
        accelerator = make_accelerator(sft_cfg)
    sft = SFTStep(sft_cfg, accelerator, build_model(sft_cfg, device=str(accelerator.device)), anchors, pad_id, 1000)
    clock = _Clock()
    for k in range(repeats + 1):  # the first step warms up
        clock.time("sft" if k else "warmup", lambda k=k: sft.step(k + 1))
    return {"sft_step_s": clock.median("sft"), "sft_step_cpu_s": clock.median("sft", cpu=True),
            "vasd_over_sft": vasd_cpu_s / clock.median("sft", cpu=True)}


def _bare_passes(vasd: VASDStep, convs: list, batches: list[dict]) -> None:
    """The plain passes the VASD step is measured against: the model's full-logits forward and
    backward on the student batches (cross-entropy at the same loss positions), and its
    full-logits forward on the teacher's single-turn ids."""
    model = vasd.policy
    with vasd.accelerator.autocast():
        for batch in batches:
            labels = torch.full_like(batch["input_ids"], IGNORE)
            for targets in batch["targets"].values():  # every term's positions, once
                labels = torch.where(labels != IGNORE, labels, targets)
            logits = model(input_ids=batch["input_ids"], **body_inputs(batch)).logits
            ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
            ce.backward()
        model.eval()
        with torch.no_grad():
            for conv in convs:
                if conv.stop_reason != "last_turn":
                    continue
                (prompt,) = teacher_prompts(vasd.tokenizer, conv.instance, ["full"])
                model(input_ids=torch.tensor([prompt + rollout_from(conv).answer_ids]))
        model.train()


# --------------------------------------------------------------------------- memory

def _memory_inputs(tokens: int, vocab: int, hidden: int) -> tuple:
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():  # in place: a freed temporary would lower the measured peak
        head.weight.normal_(0.0, hidden ** -0.5, generator=g)
    student = torch.randn(tokens, hidden, generator=g).requires_grad_(True)
    teacher = torch.randn(tokens, 1, hidden, generator=g)
    sampled = torch.randint(0, vocab, (tokens,), generator=g)
    return head, student, teacher, sampled, torch.ones(tokens)


def _divergence(way: str, head: Any, student: Any, teacher: Any, *, sampled: Any, weights: Any, chunk: int) -> Any:
    """The divergence per answer token, as training normalises it."""

    if way == "chunked":
        total = divergence_rows(head, student, head, teacher, sampled, weights, chunk_tokens=chunk, softcap=None,
                                kind="forward_kl")
    else:
        with torch.no_grad():
            teacher_lp = torch.log_softmax(head(teacher[:, 0]).float(), -1)
        total = (divergence(head(student).float(), teacher_lp, "forward_kl") * weights).sum()
    return total / weights.sum()


def memory_child(way: str, tokens: int, vocab: int, hidden: int, chunk: int) -> dict:
    """Run in a fresh process: the peak resident memory of one forward and backward above what
    the inputs already hold. The parent sets MALLOC_MMAP_THRESHOLD_ so that glibc serves every
    large block by mmap and returns it when freed: the process's peak is then this computation's."""
    inputs = _memory_inputs(tokens, vocab, hidden)
    before = peak_memory_mb()
    head, student, teacher, sampled, weights = inputs
    _divergence(way, head, student, teacher, sampled=sampled, weights=weights, chunk=chunk).backward()
    return {"peak_mb": peak_memory_mb() - before}


def memory_figures(tokens: int, vocab: int, hidden: int, chunk: int) -> dict:
    peaks = {}
    for way in ("chunked", "naive"):
        code = (f"import json; from fic.bench.vasd import memory_child; "
                f"print(json.dumps(memory_child({way!r}, {tokens}, {vocab}, {hidden}, {chunk})))")
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 16)}  # fixed: no dynamic threshold that keeps blocks
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800, env=env)
        if proc.returncode != 0:
            raise FicError(f"the {way} memory run failed: {proc.stderr.strip().splitlines()[-1:]}")
        peaks[way] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]
        if peaks[way] <= 0:  # seen once on a shared machine: report nothing rather than a ratio of 0
            raise FicError(f"the {way} memory run measured no growth of its peak resident memory; run again "
                           "on a quieter machine, or skip the figure with --memory-tokens 0")
    values, grads = {}, {}
    for way in ("chunked", "naive"):
        head, student, teacher, sampled, weights = _memory_inputs(tokens, vocab, hidden)
        loss = _divergence(way, head, student, teacher, sampled=sampled, weights=weights, chunk=chunk)
        loss.backward()
        values[way], grads[way] = loss.detach(), (student.grad, head.weight.grad)
    diff = max(float((values["chunked"] - values["naive"]).abs()),
               *(float((a - b).abs().max()) for a, b in zip(grads["chunked"], grads["naive"])))
    return {"memory_tokens": tokens, "memory_vocab": vocab, "memory_hidden": hidden,
            "chunked_peak_mb": round(peaks["chunked"], 1), "naive_peak_mb": round(peaks["naive"], 1),
            "memory_ratio": peaks["chunked"] / max(peaks["naive"], 1e-9), "max_abs_diff": diff}
