"""Who plays teacher and reference in a VASD step, without a gradient: the networks, the LoRA
switches around them, their LM heads, the moving-average (EMA) teacher's float32 masters, and
the teacher pass (`teacher_pass`: a window's micro-batches with every read network's hidden
states)."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from fic.core import progress
from fic.core.errors import FicError
from fic.training.losses import decoder_and_head
from fic.training.vasd.batches import batch_counts, collate_rows, hidden_at
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.term import Term
from fic.training.vasd.terms import run_terms
from fic.training.vasd.window import MicroBatch


@dataclass
class TeacherParts:
    """The networks and heads that play teacher and reference, without a gradient.

    `net`/`ref_net` run the decoder over teacher (or student) ids; `context`/`ref_context` switch
    LoRA adapters off around it when that network is the adapter-free model; `copy` is a frozen
    or moving-average copy (full fine-tuning's frozen teacher, or any EMA teacher); `head` and
    `ref_head` map hidden rows to logits. No reference term: `ref_net` and `ref_head` are None."""

    net: Any
    context: Callable[[], Any]
    head: Callable
    copy: Any = None
    ref_net: Any = None
    ref_context: Callable[[], Any] = nullcontext
    ref_head: Callable | None = None
    ema: EmaTeacher | None = None  # teacher.mode=ema: the float32 average written into `copy`

    @property
    def heads(self) -> dict[str, Callable]:
        """Reader (`fic.training.vasd.term.READERS`) -> its LM head, for the readers there are."""
        return {"teacher": self.head, **({"reference": self.ref_head} if self.ref_head is not None else {})}

    def network(self, reader: str) -> tuple[Any, Callable[[], Any]]:
        """The network that plays `reader` and the context it runs in."""
        return (self.net, self.context) if reader == "teacher" else (self.ref_net, self.ref_context)


def teacher_parts(cfg: VASDConfig, model: Any, copy_dtype: torch.dtype | None = None) -> TeacherParts:
    """Who plays teacher and reference for `cfg` (see `TeacherParts`). The reference always reads
    the starting weights: with LoRA the adapter-free model, in full fine-tuning a frozen copy,
    which is never the moving average (that would take a third copy: refused). `copy_dtype`: the
    dtype a frozen or moving-average copy is held in (the run's compute dtype on a bf16 compute
    copy: it is never trained, and the EMA keeps float32 masters of its own)."""
    lora = cfg.lora.enabled
    needs_reference = reads_reference(cfg)
    copy_model = None
    if copies_model(cfg):
        copy_model = copy.deepcopy(model).eval()
        copy_model.requires_grad_(False)
        if copy_dtype is not None:
            copy_model.to(copy_dtype)
    adapters_off = model.disable_adapter if lora else nullcontext
    frozen_net = model if lora else copy_model
    frozen_context = adapters_off if lora else nullcontext

    def head_of(net: Any, context: Any) -> Any:
        _, head = decoder_and_head(net)
        if not hasattr(head, "lora_A"):  # adapters only matter where the head has one
            return head

        def run(hidden: Any) -> Any:
            with context():
                return head(hidden)
        return run

    if cfg.teacher.mode == "live":
        net, context = model, nullcontext
    elif cfg.teacher.mode == "ema":
        net, context = copy_model, nullcontext
    else:
        net, context = frozen_net, frozen_context
    parts = TeacherParts(net=net, context=context, head=head_of(net, context), copy=copy_model,
                         ema=EmaTeacher(copy_model, model) if cfg.teacher.mode == "ema" else None)
    if needs_reference:
        parts.ref_net, parts.ref_context = frozen_net, frozen_context
        parts.ref_head = head_of(frozen_net, frozen_context)
    return parts


def reads_reference(cfg: VASDConfig) -> bool:
    """Whether a term reads the starting weights (the reference term; with EMA in full fine-tuning:
    refused at load)."""
    return any(term.reads == "reference" for term in run_terms(cfg, anchors=False))


def copies_model(cfg: VASDConfig) -> bool:
    """Whether the teacher or the reference is a copy of the model (see `teacher_parts`)."""
    return cfg.teacher.mode == "ema" or (not cfg.lora.enabled and (cfg.teacher.mode == "frozen"
                                                                  or reads_reference(cfg)))


class EmaTeacher:
    """The moving average of the trained weights, accumulated in float32.

    `update` sets average = rate * average + (1 - rate) * model for every trained weight and
    writes it into the copy the teacher runs (cast to the copy's dtype). In bf16 the step
    (1 - rate) * (model - average) is mostly under half a unit in the last place and rounds away
    (after 50 updates at 0.99, 2.5% of the entries had moved, against 39% in float32), so weights
    below float32 get a float32 master (4 bytes per trained weight: the adapter with LoRA); float32
    weights are their own master. `state` (the masters, saved as `ema.safetensors`) and `load`
    make a resume exact."""

    def __init__(self, copy_model: Any, model: Any):
        trained = [n for n, p in model.named_parameters() if p.requires_grad]
        weights = dict(copy_model.named_parameters())
        self.weights = {n: weights[n] for n in trained}
        self.master = {n: p.data if p.dtype == torch.float32 else p.detach().float().clone()
                       for n, p in self.weights.items()}

    def update(self, model: Any, rate: float) -> None:
        current = dict(model.named_parameters())
        with torch.no_grad():
            for name, master in self.master.items():
                master.mul_(rate).add_(current[name].detach().float(), alpha=1 - rate)
                self._write(name)

    def state(self) -> dict:
        return {n: m.detach().cpu().contiguous() for n, m in self.master.items()}

    def load(self, state: dict) -> None:
        missing = sorted(set(self.master) - set(state))
        if missing:
            raise FicError(f"the EMA teacher's saved weights lack {len(missing)} trained weight(s), e.g. {missing[0]}",
                           field="resume")
        with torch.no_grad():
            for name, master in self.master.items():
                master.copy_(state[name].to(master.device, torch.float32))
                self._write(name)

    def _write(self, name: str) -> None:
        weight, master = self.weights[name], self.master[name]
        if weight.data_ptr() != master.data_ptr():
            weight.data.copy_(master)


def teacher_pass(micro_batches: Sequence[MicroBatch], parts: TeacherParts, terms: Sequence[Term], pad_id: int, *,
                 device: Any, autocast: Callable[[], Any], multiple: int = 0) -> list[dict]:
    """The window's micro-batches as the student's batches: rows collated with the run's term
    tables, and `hidden[reader]` [rows, slots, hidden] (a slot: a teacher view), each network's
    hidden states at the positions its micro-batch asks (`fic.training.vasd.window.Reads`), and
    `counts` (`batch_counts`). Every micro-batch runs every read network's forward, on a stand-in
    token where it has no rollout rows, so every rank runs the same passes (ZeRO-3)."""
    names = [term.name for term in terms]
    batches = []
    for micro in progress.counting(micro_batches, "micro-batches"):  # for the run's heartbeat
        batch = collate_rows(micro.rows, pad_id, multiple, names)
        batch["hidden"] = {}
        for reader, reads in micro.reads.items():
            net, context = parts.network(reader)
            with context(), autocast():
                slots = [hidden_at(net, r.sequences, r.positions, pad_id, device, multiple, share_prefixes=r.share)
                         for r in reads]
            batch["hidden"][reader] = torch.stack(slots, dim=1)
        batch["counts"] = batch_counts(batch, terms)
        if micro.empty:
            batch["counts"]["tokens"] = 0.0
        batches.append(batch)
    return batches
