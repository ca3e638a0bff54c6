"""The rollouts of a VASD step: the engine that plays them on the current weights (hf on the
policy or a bfloat16 decoding copy of it, or a colocated vLLM engine) and its refresh after each
update, greedy rollouts of held-out tasks, and the figures logged about them."""

from __future__ import annotations

import copy
from typing import Any

import torch

from fic.backends.decoding import lockstep_wanted
from fic.backends.hf import HFBackend, column_major_linears
from fic.backends.vllm import colocated_engine, sync_weights
from fic.conversation.classify import make_classifier
from fic.conversation.simulator import make_conversations, play, unanswerable_answer_rate
from fic.conversation.users import make_user
from fic.core.generation import SamplingParams
from fic.core.ranks import Ranks


def play_greedy(cfg: Any, instances: list, generator: Any, ranks: Ranks | None = None) -> list:
    """`instances` played greedily by `generator`, sharded, every shard (the held-out rollouts);
    `ranks`: each rank plays its own, in lockstep (`fic.conversation.simulator.play`)."""
    convs = make_conversations(instances, ["sharded"], 1)
    play(convs, generator, make_user("verbatim"), make_classifier("rule"),
         SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0), batch_size=max(len(convs), 1),
         stop_at_correct=False, max_context=cfg.rollout.max_conversation_tokens, ranks=ranks)
    # The next rollouts would reuse these keys and values where prompts share a prefix (the system
    # turn, the tool list). Computed in another batch they round differently in bfloat16 from a fresh
    # prefill, so a measured run would sample other tokens than an unmeasured one: measuring must not
    # change what training does.
    if hasattr(generator, "weights_changed"):
        generator.weights_changed()
    return convs


def rollout_figures(convs: list) -> dict:
    """What the rollouts did: accuracy, premature answers, over-deferral, lengths."""
    records = [c.to_record() for c in convs]
    finals = [c.turns[-1] for c in convs if c.turns]
    n = max(len(records), 1)
    first = [r["first_answer_turn"] for r in records if r["first_answer_turn"] is not None]
    return {
        "rollout_accuracy": sum(r["score"] for r in records) / n,
        "premature_answer_rate": sum(bool(r["premature_answer"]) for r in records) / n,
        "unanswerable_answer_rate": unanswerable_answer_rate(records),
        "final_not_answer_rate": sum(t.label != "answer_attempt" for t in finals) / max(len(finals), 1),
        "first_answer_turn": sum(first) / len(first) if first else None,
        "rollout_tokens": sum(r["generated_tokens"] for r in records) / n,
        "truncated_final_rate": sum(t.finish_reason != "stop" for t in finals) / max(len(finals), 1),
    }


def sample_rows(convs: list, limit: int = 4) -> list[list]:
    rows = []
    for conv in convs[:limit]:
        dialogue = "\n".join(f"[user] {t.user}\n[assistant:{t.label}] {t.reply}" for t in conv.turns)
        rows.append([conv.instance.task_id, round(conv.score(), 3), dialogue])
    return rows


def make_rollout_backend(cfg: Any, policy: Any, tokenizer: Any,
                         compute_dtype: torch.dtype) -> tuple[Any, dict | None]:
    """The engine that plays the rollouts with the current weights, and the master weights its
    copy is refreshed from (None: it plays on the policy itself, or is a vLLM engine).

    hf: when the run computes in bfloat16 over float32 master weights (full fine-tuning, no
    ZeRO-3), the rollouts run on a bfloat16 copy of the policy laid out for decoding
    (`column_major_linears` on a CPU), refreshed from the masters after every optimizer step
    (`sync_rollout_backend`): the same numbers autocast would compute, without casting every
    weight again at every decoding step and through the slow small-batch product path (a 16-row
    decoding product 5x faster in bf16 column-major than in float32, measured). Otherwise, and
    where the weights are partitioned over the ranks (ZeRO-3, FSDP: a copy would be whole on each),
    the policy itself plays, in lockstep."""
    if cfg.rollout.backend == "vllm":
        return colocated_engine(policy, tokenizer, cfg.model.path, cfg.rollout.gpu_memory_utilization,
                                cfg.rollout.max_conversation_tokens), None
    model = policy
    weights = next(policy.parameters())
    if (compute_dtype == torch.bfloat16 and weights.dtype == torch.float32 and not cfg.lora.enabled
            and not lockstep_wanted(policy)):
        model = copy.deepcopy(policy).to(torch.bfloat16).eval().requires_grad_(False)
        if weights.device.type == "cpu":
            column_major_linears(model)
    backend = HFBackend(model, tokenizer, batch_size=cfg.rollout.batch_size, kv_reuse_mb=cfg.rollout.kv_reuse_mb)
    return backend, None if model is policy else dict(policy.state_dict(keep_vars=True))


def sync_rollout_backend(generator: Any, policy: Any, cfg: Any, convs: list, say: Any, *,
                         masters: dict | None = None) -> None:
    """After an optimizer step: the hf backend's bfloat16 copy (if it has one) takes the new
    master weights, and it forgets the keys and values computed with the old ones; a vLLM engine
    gets the new weights."""
    if cfg.rollout.backend == "hf":
        if masters is not None:
            with torch.no_grad():  # copy_ casts and keeps the copy's own (column-major) layout
                for name, param in generator.model.named_parameters():
                    param.copy_(masters[name])
        generator.weights_changed()
    else:
        sync_weights(generator, policy, convs, cfg.rollout.logprob_check_tolerance, say)
