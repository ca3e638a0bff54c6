"""`fic bench vasd`: where a VASD step's time goes, what it costs over bare passes, and the
memory of the chunked divergence.

Phases, on the bundled model (or `--model`) with `--rollouts` sharded gsm_symbolic rollouts and
anchor conversations from the SFT corpus builder: rollout generation, the teacher pass, the
student pass (forward and backward of every loss term) and the optimizer step, in seconds;
`rollout_share` = rollout seconds / step seconds.

`overhead_ratio`: the VASD step without rollout generation (teacher pass + student pass, as
the recipe runs them) over a bare student forward+backward on the same multi-turn ids (the
model's own full-logits forward and a cross-entropy at the same loss positions) plus a bare
teacher forward on the same single-turn ids, the two alternating `--repeats` times on the same
batches so that load from other processes weighs on both alike.

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
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fic.backends.hf import HFBackend
from fic.bench.roofline import forward_flops, matmul_rate, shape, train_flops
from fic.bench.sft import make_records
from fic.conversation.classify import make_classifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import make_user
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.generation import SamplingParams
from fic.core.model import BUNDLED_MODEL_DIR, load_tokenizer, peak_memory_mb
from fic.training.data import IGNORE, render_examples
from fic.training.loop import build_model, make_optimizer, optimizer_step
from fic.training.losses import divergence, divergence_rows, window_backward
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.distill import DistillLoss, rollout_from, teacher_prompts
from fic.training.vasd.inputs import load_rollout_tasks
from fic.training.vasd.step import step_batches, teacher_parts


def add_arguments(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--model", default=str(BUNDLED_MODEL_DIR), help="model folder (default: the bundled SmolLM2)")
    parser.add_argument("--rollouts", type=int, default=8, help="rollout conversations in the step")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="rollouts per student forward pass")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="most tokens of one rollout reply")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of the step without rollouts")
    parser.add_argument("--chunk-tokens", type=int, default=None,
                        help="LM-head rows per chunk (default: the VASD recipe's train.loss_chunk_tokens)")
    parser.add_argument("--memory-tokens", type=int, default=1024, help="answer tokens of the memory figure (0: skip)")
    parser.add_argument("--memory-vocab", type=int, default=131072, help="vocabulary of the memory figure")
    parser.add_argument("--memory-hidden", type=int, default=576, help="hidden size of the memory figure")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated problems and of sampling")


def _recipe_chunk() -> int:


    recipe = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m-instruct" / "vasd.yaml"
    return load_config(VASDConfig, recipe).train.loss_chunk_tokens if recipe.is_file() else 256


def measure(args: argparse.Namespace) -> dict:
    if min(args.rollouts, args.micro_batch_size, args.max_new_tokens, args.repeats) < 1 or args.memory_tokens < 0:
        raise FicError("--rollouts, --micro-batch-size, --max-new-tokens and --repeats must be at least 1")
    chunk = args.chunk_tokens or _recipe_chunk()
    figures: dict[str, Any] = {"model": args.model, "rollouts": args.rollouts, "chunk_tokens": chunk,
                               "threads": torch.get_num_threads()}
    figures.update(step_figures(args, chunk))
    if args.memory_tokens:
        figures.update(memory_figures(args.memory_tokens, args.memory_vocab, args.memory_hidden, chunk))
    return figures


# --------------------------------------------------------------------------- time

def step_figures(args: argparse.Namespace, chunk: int) -> dict:
    """Seconds per phase of one VASD step and the overhead over bare passes."""
    from accelerate import Accelerator


    G = max(1, args.rollouts // args.micro_batch_size)
    cfg = load_config(VASDConfig, None, [
        f"model.path={args.model}", f"data.limit={3 * args.rollouts}", f"data.seed={args.seed + 1}",
        "regularizer.kind=none", "train.max_steps=1",  # anchors come from the corpus builder, below
        f"train.micro_batch_size={args.micro_batch_size}", f"train.grad_accum_steps={G}",
        f"train.loss_chunk_tokens={chunk}", f"rollout.max_new_tokens={args.max_new_tokens}"])
    tokenizer = load_tokenizer(args.model)
    instances, _, _ = load_rollout_tasks(cfg)
    n_anchor = round(0.5 * args.rollouts)  # the recipe's regularizer.anchor_share
    anchors, _ = render_examples(make_records(4 * n_anchor + 8, args.seed), tokenizer, max_seq_len=4096,
                                 progress=False, targets="non_final")
    anchors = anchors[:n_anchor]

    accelerator = Accelerator(gradient_accumulation_steps=G)
    model = build_model(cfg, device=str(accelerator.device))
    parts = teacher_parts(cfg, model)
    loss = DistillLoss(model, parts.head, None, divergence=cfg.loss.divergence, estimator=cfg.loss.estimator,
                       beta=cfg.loss.beta, temperature=cfg.loss.temperature, top_k=cfg.loss.top_k, chunk_tokens=chunk)
    loss_model, optimizer = accelerator.prepare(loss, make_optimizer(loss, cfg.optim))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    began = time.perf_counter()
    convs = make_conversations(instances[:args.rollouts], ["sharded"], 1)
    play(convs, HFBackend(model, tokenizer, batch_size=args.rollouts, kv_reuse_mb=1024), make_user("verbatim"),
         make_classifier("rule"), SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=args.seed),
         batch_size=len(convs), stop_at_correct=False)
    rollout_s = time.perf_counter() - began
    cfg.loss.keep_truncated = True  # time every final reply, cut or not

    def no_autocast() -> Any:
        return torch.autocast("cpu", enabled=False)

    vasd, bare, teacher, student = [], [], [], []
    for _ in range(args.repeats):
        began = time.perf_counter()
        model.eval()
        batches, _ = step_batches(cfg, convs, anchors, tokenizer, parts, device=accelerator.device, autocast=no_autocast)
        model.train()
        teacher.append(time.perf_counter() - began)
        began = time.perf_counter()
        counts = [b.pop("counts") for b in batches]
        window_backward(accelerator, loss_model, batches, counts, {"distill": 1.0, "anchor": 1.0})
        student.append(time.perf_counter() - began)
        vasd.append(teacher[-1] + student[-1])
        model.zero_grad(set_to_none=True)
        bare.append(_bare_passes(model, convs, anchors, batches, tokenizer, parts))
        model.zero_grad(set_to_none=True)
    batches, _ = step_batches(cfg, convs, anchors, tokenizer, parts, device=accelerator.device, autocast=no_autocast)
    window_backward(accelerator, loss_model, batches, [b.pop("counts") for b in batches], {"distill": 1.0})
    began = time.perf_counter()
    optimizer_step(accelerator, loss_model, optimizer, scheduler, 1.0)
    optimizer_s = time.perf_counter() - began
    step_s = rollout_s + statistics.median(teacher) + statistics.median(student) + optimizer_s
    # The roofline of the passes without rollouts: the teacher's forward over its single-turn rows,
    # the student's forward and backward, the heads on answer and anchor rows only.
    dims = shape(model)
    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1)]
    head_rows = int(sum(c["distill"] + c["anchor"] for c in counts))
    teacher_lengths = [len(p) + len(rollout_from(c).answer_ids) for c in convs
                       for p in teacher_prompts(tokenizer, c.instance, ["full"])]
    flops = train_flops(dims, lengths, head_rows) + forward_flops(dims, teacher_lengths, 0)
    passes_s = statistics.median(teacher) + statistics.median(student)
    peak = matmul_rate(torch.bfloat16)
    return {"passes_tflops": flops / passes_s / 1e12, "bf16_matmul_2048_tflops": peak / 1e12,
            "passes_roofline_share": flops / passes_s / peak,
            "rollout_s": rollout_s, "teacher_s": statistics.median(teacher), "student_s": statistics.median(student),
            "optimizer_s": optimizer_s, "step_s": step_s, "rollout_share": rollout_s / step_s,
            "bare_passes_s": statistics.median(bare), "overhead_ratio": sum(vasd) / sum(bare),
            "answer_tokens": int(sum(c["distill"] for c in counts)),
            "student_tokens": int(sum(c["tokens"] for c in counts))}


def _bare_passes(model: Any, convs: list, anchors: list, batches: list[dict], tokenizer: Any, parts: Any) -> float:
    """Seconds of the plain passes the VASD step is measured against: the model's full-logits
    forward and backward on the student batches (cross-entropy at the same loss positions), and
    its full-logits forward on the teacher's single-turn ids."""

    began = time.perf_counter()
    for batch in batches:
        labels = torch.where(batch["distill_targets"] != IGNORE, batch["distill_targets"], batch["anchor_targets"])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
        ce.backward()
    model.eval()
    with torch.no_grad():
        for conv in convs:
            rollout = rollout_from(conv)
            (prompt,) = teacher_prompts(tokenizer, conv.instance, ["full"])
            model(input_ids=torch.tensor([prompt + rollout.answer_ids]))
    model.train()
    return time.perf_counter() - began


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
