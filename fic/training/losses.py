"""Losses computed only where they apply, with the LM head in fp32 chunks.

Every FiC loss reads the hidden states of a few positions (an SFT corpus's assistant tokens,
a rollout's final reply) out of a long conversation. The decoder runs over the whole
sequence, but the LM head runs only on those rows, in chunks of `chunk_tokens` rows upcast to
fp32, so a [batch, seq, vocab] logits tensor never exists. With more than one chunk each
chunk's logits are recomputed in backward instead of being kept (`torch.utils.checkpoint`).

Divergences between the student's and the teacher's next-token distributions at the same
answer token (VASD), with one temperature T applied to both sides' logits (the loss is not
rescaled by T^2):

- `forward_kl`: KL(teacher || student) = sum p_T (log p_T - log p_S), mass-covering;
- `reverse_kl`: KL(student || teacher), mode-seeking;
- `jsd`: beta KL(teacher || M) + (1 - beta) KL(student || M) with the mixture
  M = beta p_T + (1 - beta) p_S (beta = 0.5 is the symmetric Jensen-Shannon divergence).

Estimators: `full` sums over the whole vocabulary; `topk` keeps the student's k most likely
tokens plus one tail bucket holding the rest of each side's mass (exact when the tails agree);
`sampled` uses only the token the student sampled (reverse KL only): its value is the log
ratio log p_S(x) - log p_T(x), an unbiased estimate of KL(student || teacher) when x was
sampled from the student at the loss temperature, and its gradient is the score-function
estimate (log ratio) * grad log p_S(x).

A micro-batch's loss terms are sums; `window_backward` divides each term by its count of
positions over the whole accumulation window and all ranks, so every position weighs the
same however positions fall across micro-batches and processes.
"""

from __future__ import annotations

import contextvars
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from fic.core import progress
from fic.core.errors import FicError
from fic.training.data import IGNORE

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")
ESTIMATORS = ("full", "topk", "sampled")


# --------------------------------------------------------------------------- the model's parts

def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PEFT wrapper (PEFT injects its layers in place, so
    calling the inner modules still runs the adapters)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The decoder body (hidden states) and the LM head of a causal LM, PEFT-wrapped or not;
    `get_decoder` exists on transformers 4.57 and 5.x alike."""
    lm = causal_lm(model)
    head = lm.get_output_embeddings()
    body = lm.get_decoder() if hasattr(lm, "get_decoder") else getattr(lm, "base_model", None)
    if head is None or body is None or body is lm:
        raise FicError(f"cannot find the decoder and LM head of {type(lm).__name__}; FiC needs a causal LM "
                       "with get_decoder() and get_output_embeddings()")
    return body, head


def softcap_of(model: torch.nn.Module) -> float | None:
    return getattr(causal_lm(model).config, "final_logit_softcapping", None)


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def head_logits(head: Callable, hidden: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """fp32 logits of some rows, with the final soft-capping some models (Gemma 2) apply."""
    logits = _at_least_fp32(head(hidden))
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def check_target_path(model: torch.nn.Module, vocab_size: int) -> None:
    """Refuse architectures whose logits are not `head(decoder(x))` (e.g. extra logit scaling),
    since the target-only loss would silently train a different function."""
    body, head = decoder_and_head(model)
    ids = torch.arange(1, 9).remainder(vocab_size).unsqueeze(0).to(next(model.parameters()).device)
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits.float()
        got = head_logits(head, body(input_ids=ids, use_cache=False).last_hidden_state, softcap_of(model))
    if not torch.allclose(got, want, atol=1e-3 * max(1.0, want.abs().max().item()), rtol=1e-3):
        raise FicError(f"{type(causal_lm(model)).__name__} does not compute its logits as "
                       "lm_head(decoder(x)), which the target-only loss relies on; this architecture is not supported")


def chunked_sum(fn: Callable[..., torch.Tensor], rows: tuple[torch.Tensor, ...], chunk_tokens: int,
                *constants: Any) -> torch.Tensor:
    """sum over chunks of `fn(*row_chunks, *constants)`; each chunk's activations are rebuilt in
    backward when there is more than one chunk (one extra head matmul instead of keeping
    n_rows x vocab floats)."""
    n = rows[0].shape[0]
    if n <= chunk_tokens:
        return fn(*rows, *constants)
    total = rows[0].new_zeros((), dtype=torch.float32)
    for start in range(0, n, chunk_tokens):
        part = tuple(r[start:start + chunk_tokens] for r in rows)
        total = total + torch.utils.checkpoint.checkpoint(fn, *part, *constants, use_reentrant=False)
    return total


# --------------------------------------------------------------------------- cross-entropy

def _weighted_ce(hidden: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, head: Callable,
                 softcap: float | None) -> torch.Tensor:
    ce = F.cross_entropy(head_logits(head, hidden, softcap), targets, reduction="none")
    return (ce * weights).sum()


def target_ce(head: Callable, hidden: torch.Tensor, targets: torch.Tensor, chunk_tokens: int,
              softcap: float | None, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Summed (weighted) cross-entropy of `hidden[targets != IGNORE]` against their targets
    (SFT's loss: chunks recomputed in backward, through the head module)."""
    where = targets != IGNORE
    rows_weights = weights[where].float() if weights is not None else \
        torch.ones(int(where.sum()), device=hidden.device)
    return chunked_sum(_weighted_ce, (hidden[where], targets[where], rows_weights), chunk_tokens, head, softcap)


def weighted_ce_rows(head: Callable, hidden: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor,
                     chunk_tokens: int, softcap: float | None, temperature: float = 1.0) -> torch.Tensor:
    """sum_i weights[i] * cross-entropy(row i, target i) through `head_loss_sum` (VASD's anchor), the
    logits divided by `temperature` (the policy gradient reads the distribution a token was sampled from)."""
    def chunk_loss(logits: torch.Tensor, chunk_targets: torch.Tensor, chunk_weights: torch.Tensor) -> torch.Tensor:
        return (F.cross_entropy(logits / temperature, chunk_targets, reduction="none") * chunk_weights).sum()

    return head_loss_sum(head, hidden, (targets, weights.float()), chunk_tokens, chunk_loss, softcap)


class TargetLoss(torch.nn.Module):
    """Wraps a causal LM; `forward` returns `{"ce": summed cross-entropy over the target positions}`.

    The wrapper is what `accelerator.prepare` wraps (DDP, DeepSpeed), so the body and head run
    inside the distributed forward, and only `[n_targets, hidden]` rows ever reach the head.
    """

    def __init__(self, model: torch.nn.Module, chunk_tokens: int = 1024):
        super().__init__()
        self.model = model
        self.chunk_tokens = chunk_tokens
        self.softcap = softcap_of(model)

    @property
    def config(self) -> Any:  # DeepSpeed fills its "auto" bucket sizes from model.config.hidden_size
        return causal_lm(self.model).config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                targets: torch.Tensor) -> dict[str, torch.Tensor]:
        body, head = decoder_and_head(self.model)
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return {"ce": target_ce(head, hidden, targets, self.chunk_tokens, self.softcap)}


def target_counts(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """The SFT loss's positions in a collated micro-batch (and its real tokens, for figures)."""
    return {"ce": float((batch["targets"] != IGNORE).sum()), "tokens": float(batch["attention_mask"].sum())}


# --------------------------------------------------------------------------- divergences

def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row from log-probabilities (0 log 0 = 0)."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    mixture = torch.logsumexp(torch.stack([teacher + math.log(beta), student + math.log1p(-beta)]), dim=0)
    return beta * _kl(teacher, mixture) + (1 - beta) * _kl(student, mixture)


def _topk_bins(student: torch.Tensor, teacher: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides as k+1 bins: the student's top-k tokens and one tail bucket for the rest."""
    top = student.topk(k, dim=-1).indices
    s, t = student.gather(-1, top), teacher.gather(-1, top)
    tiny = torch.finfo(student.dtype).tiny

    def tail(log_p: torch.Tensor) -> torch.Tensor:
        return torch.log((1 - log_p.exp().sum(-1, keepdim=True)).clamp_min(tiny))

    return torch.cat([s, tail(s)], -1), torch.cat([t, tail(t)], -1)


def trust_region(teacher: torch.Tensor, student: torch.Tensor, max_log_ratio: float) -> torch.Tensor:
    """The teacher's log-probs with log p_T - log p_S clipped to [-c, c] per token and renormalised:
    a target no further than a factor e^c from what the student (no gradient) gives each token."""
    base = student.detach()
    return torch.log_softmax(base + (teacher - base).clamp(-max_log_ratio, max_log_ratio), dim=-1)


def divergence(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, kind: str, *, beta: float = 0.5,
               temperature: float = 1.0, estimator: str = "full", top_k: int = 64,
               sampled: torch.Tensor | None = None, max_log_ratio: float = 0.0) -> torch.Tensor:
    """Per-row divergence between the student (raw logits) and the teacher (log-probs already
    taken at `temperature`), the teacher inside a trust region when `max_log_ratio` > 0
    (`trust_region`); see the module docstring. fp32 throughout."""
    student = torch.log_softmax(_at_least_fp32(student_logits) / temperature, dim=-1)
    teacher = _at_least_fp32(teacher_logprobs)
    if max_log_ratio > 0:
        teacher = trust_region(teacher, student, max_log_ratio)
    if estimator == "sampled":
        if kind != "reverse_kl":
            raise FicError("the sampled-token estimator estimates reverse_kl only", field="loss.estimator")
        index = sampled.unsqueeze(-1)
        s_x, t_x = student.gather(-1, index)[:, 0], teacher.gather(-1, index)[:, 0]
        ratio = (s_x - t_x).detach()
        return ratio + ratio * (s_x - s_x.detach())  # value: the log ratio; gradient: ratio * grad log p_S(x)
    if estimator == "topk":
        student, teacher = _topk_bins(student, teacher, min(top_k, student.shape[-1] - 1))
    elif estimator != "full":
        raise FicError(f"unknown estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}",
                       field="loss.estimator")
    if kind == "forward_kl":
        return _kl(teacher, student)
    if kind == "reverse_kl":
        return _kl(student, teacher)
    if kind == "jsd":
        return _jsd(student, teacher, beta)
    raise FicError(f"unknown divergence {kind!r}; expected one of {', '.join(DIVERGENCES)}", field="loss.divergence")


def teacher_logprobs(teacher_hidden: torch.Tensor, head: Callable, softcap: float | None,
                     temperature: float) -> torch.Tensor:
    """The teacher's log-probs at `temperature` from its hidden rows, averaging the distributions
    (not the logits) when several views are stacked on the first dimension: [views, n, H]."""
    with torch.no_grad():
        if teacher_hidden.dim() == 3 and teacher_hidden.shape[0] == 1:  # one view: no stacked copy
            teacher_hidden = teacher_hidden[0]
        if teacher_hidden.dim() == 2:
            return torch.log_softmax(head_logits(head, teacher_hidden, softcap) / temperature, dim=-1)
        views = [torch.log_softmax(head_logits(head, h, softcap) / temperature, dim=-1) for h in teacher_hidden]
        return torch.logsumexp(torch.stack(views), dim=0) - math.log(len(views))


# Set while a window measures each term's own gradient: its graph is walked once a term and once
# more for the step, so a backward pass must leave what it saved as it found it.
_WALKED_AGAIN = contextvars.ContextVar("walked_again", default=False)


class _FusedHead(torch.autograd.Function):
    """sum over chunks of `chunk_loss(logits of the chunk, *row chunks)`, with the gradients of
    the hidden rows and of the head's weight worked out chunk by chunk during the forward pass
    (autograd only from the chunk's logits to its loss) and the weight's gradient accumulated in
    one buffer. Nothing is recomputed in backward, and at most one chunk's [rows, vocab] tensors
    exist at a time; autograd through separate chunks would instead keep a second (and a third,
    while adding) full-size copy of the head's gradient."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                chunk_loss: Callable, chunk_tokens: int, *rows: torch.Tensor) -> torch.Tensor:
        grad_hidden = torch.zeros_like(hidden)
        # Summed over chunks in float32 whatever the weight's dtype (a bf16 compute copy's head
        # gradient would otherwise be rounded at every chunk); handed back in the weight's dtype.
        wide = torch.promote_types(weight.dtype, torch.float32)
        grad_weight = torch.zeros_like(weight, dtype=wide) if weight.requires_grad else None
        grad_bias = torch.zeros_like(bias, dtype=wide) if bias is not None and bias.requires_grad else None
        total = torch.zeros((), dtype=torch.promote_types(torch.float32, hidden.dtype), device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_tokens):
            h = hidden[start:start + chunk_tokens]
            with torch.enable_grad():
                logits = F.linear(h, weight, bias).detach().requires_grad_(True)
                loss = chunk_loss(logits, *(r[start:start + chunk_tokens] for r in rows))
                (grad_logits,) = torch.autograd.grad(loss, logits)
            grad_logits = grad_logits.to(weight.dtype)
            grad_hidden[start:start + chunk_tokens] = (grad_logits @ weight).to(hidden.dtype)
            if grad_weight is not None and grad_weight.dtype == weight.dtype:
                grad_weight.addmm_(grad_logits.T, h.to(weight.dtype))
            elif grad_weight is not None:  # the product in the weight's dtype, the sum in float32
                grad_weight += grad_logits.T @ h.to(weight.dtype)
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
            total += loss.detach().to(total.dtype)
        ctx.save_for_backward(grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                              None if grad_bias is None else grad_bias.to(bias.dtype))
        ctx.walked_again = _WALKED_AGAIN.get()
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        # In place: the buffers are ours and used once; a copy would be another head-sized tensor
        # (the same values either way, so a window that walks the graph again steps identically).
        if ctx.walked_again:
            scale = lambda g: None if g is None else g * grad_output.to(g.dtype)  # noqa: E731
        else:
            scale = lambda g: None if g is None else g.mul_(grad_output.to(g.dtype))  # noqa: E731
        return (scale(grad_hidden), scale(grad_weight), scale(grad_bias), None, None, *[None] * 8)


def head_loss_sum(head: Any, hidden: torch.Tensor, rows: tuple[torch.Tensor, ...], chunk_tokens: int,
                  chunk_loss: Callable, softcap: float | None) -> torch.Tensor:
    """sum over chunks of `chunk_loss(fp32 logits, *row chunks)`, where the logits are `head(hidden)`.

    A plain linear head takes the fused path (`_FusedHead`). A head that is not one (a LoRA
    layer, or weights partitioned by ZeRO-3, which only the module's own hooks gather) takes
    `chunked_sum`, which recomputes each chunk in backward."""
    def loss_of_logits(logits: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        logits = _at_least_fp32(logits)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return chunk_loss(logits, *parts)

    plain = type(head) is torch.nn.Linear and not hasattr(head.weight, "ds_id") and head.weight.numel() > 0
    if plain and hidden.requires_grad and len(rows) <= 8:
        return _FusedHead.apply(hidden, head.weight, head.bias, loss_of_logits, chunk_tokens, *rows)

    def through_module(h: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        return chunk_loss(head_logits(head, h, softcap), *parts)

    return chunked_sum(through_module, (hidden, *rows), chunk_tokens)


def divergence_rows(head: Callable, student_hidden: torch.Tensor, teacher_head: Callable, teacher_hidden: torch.Tensor,
                    sampled: torch.Tensor, weights: torch.Tensor, *, chunk_tokens: int, softcap: float | None,
                    kind: str, estimator: str = "full", beta: float = 0.5, temperature: float = 1.0,
                    top_k: int = 64, max_log_ratio: float = 0.0) -> torch.Tensor:
    """sum_i weights[i] * divergence(student row i, teacher row i), LM heads applied in chunks.

    `student_hidden` [n, H] carries the gradient; `teacher_hidden` [n, views, H] does not, and
    the teacher's log-probs are made per chunk from it (views averaged as distributions), so
    neither side's [n, vocab] logits ever exist at once. `sampled` [n] are the tokens the
    student wrote there (the sampled-token estimator reads them)."""
    def chunk_loss(logits: torch.Tensor, teacher: torch.Tensor, tokens: torch.Tensor,
                   row_weights: torch.Tensor) -> torch.Tensor:
        logprobs = teacher_logprobs(teacher.transpose(0, 1), teacher_head, softcap, temperature)
        per_row = divergence(logits, logprobs, kind, beta=beta, temperature=temperature, estimator=estimator,
                             top_k=top_k, sampled=tokens, max_log_ratio=max_log_ratio)
        return (per_row * row_weights).sum()

    return head_loss_sum(head, student_hidden, (teacher_hidden, sampled, weights), chunk_tokens, chunk_loss, softcap)


# --------------------------------------------------------------------------- the window

def to_device(value: Any, device: Any) -> Any:
    """A batch entry on `device`: a tensor, or a mapping of them (VASD's term tables)."""
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value.to(device) if torch.is_tensor(value) else value


def window_backward(accelerator: Any, loss_module: torch.nn.Module, batches: list[dict],
                    counts: list[dict[str, float]], weights: dict[str, float],
                    after_backward: Callable[[], None] | None = None,
                    term_norms: bool = False) -> dict[str, float]:
    """Forward and backward over one accumulation window; return each term's mean and `loss`.

    `loss_module(**batch)` returns a dict of summed loss terms; `counts[i][term]` is the number
    (or total weight) of term positions in micro-batch i. Each term is divided by its count over
    the window on all ranks, known before any backward pass, and the loss is
    sum_term weights[term] * term_sum / term_count. `accelerator.backward` divides by the
    accumulation steps (DeepSpeed's engine does the same) and DDP/ZeRO average gradients over
    ranks; the factor `steps * world` undoes both, so the gradient is that of the loss as written.
    Counts of names that are not loss terms (e.g. `tokens`) are only summed and returned.
    `after_backward` runs after each micro-batch's backward pass (the bf16 compute copy moves its
    gradients into the float32 masters there).

    `term_norms`: also return `grad_norm_<term>`, the norm of each weighted term's own gradient
    over the window and all ranks (the total's is the optimizer step's `grad_norm`), which tells
    a term that steers the update from one that is drowned out. It costs one more backward pass
    a term and a float32 copy of the trainable parameters a term, and leaves the gradients the
    step uses as they are (`torch.autograd.grad` fills no `.grad`); the parameters must be whole
    on each rank (one process or DDP).
    """
    device = accelerator.device
    names = sorted({name for c in counts for name in c})
    local = torch.tensor([[c.get(name, 0.0) for name in names] for c in counts], dtype=torch.float64,
                         device=device).sum(0)
    totals = dict(zip(names, accelerator.reduce(local, reduction="sum").tolist()))
    scale = accelerator.gradient_accumulation_steps * accelerator.num_processes
    sums = {name: torch.zeros((), dtype=torch.float64, device=device) for name in weights}
    trained = [p for p in loss_module.parameters() if p.requires_grad] if term_norms else []
    own = {name: [torch.zeros_like(p, dtype=torch.float32) for p in trained] for name in weights if term_norms}
    for index, batch in enumerate(progress.counting(batches, "micro-batches")):  # for the heartbeat
        with accelerator.accumulate(loss_module):
            walked_again = _WALKED_AGAIN.set(term_norms)
            try:
                terms = loss_module(**to_device(batch, device))
            finally:
                _WALKED_AGAIN.reset(walked_again)
            parts = {name: weights[name] * terms[name] / totals[name] for name in weights if totals.get(name, 0) > 0}
            for name, part in parts.items() if term_norms else ():
                if part.requires_grad:  # a term with no position in this micro-batch has no graph
                    grads = torch.autograd.grad(part, trained, retain_graph=True, allow_unused=True)
                    for kept, grad in zip(own[name], grads):
                        if grad is not None:
                            kept += grad.float()
            loss = sum(parts.values())
            if not torch.is_tensor(loss):  # no positions anywhere: still run backward so ranks stay in step
                loss = sum(terms[name] * 0.0 for name in weights)
            accelerator.backward(loss * scale)
            if after_backward is not None:
                after_backward()
            for name in weights:
                sums[name] += terms[name].detach().double()
        if accelerator.sync_gradients != (index == len(batches) - 1):
            raise RuntimeError("accumulation window out of step with accelerate's gradient sync")
    reduced = accelerator.reduce(torch.stack([sums[name] for name in weights]), reduction="sum").tolist()
    means = {name: (value / totals[name] if totals.get(name, 0) > 0 else None)
             for name, value in zip(weights, reduced)}
    figures: dict[str, Any] = {"loss": sum(weights[n] * m for n, m in means.items() if m is not None), **means}
    figures.update({f"n_{name}": totals[name] for name in names})
    for name, kept in own.items():  # each rank's share is its part of the sum the loss is written as
        squares = sum(accelerator.reduce(grad, reduction="sum").double().pow(2).sum() for grad in kept)
        figures[f"grad_norm_{name}"] = math.sqrt(float(squares)) if kept else 0.0
    return figures
