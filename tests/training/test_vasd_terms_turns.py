"""Per-turn view asymmetry (`fic/training/vasd/terms/turns.py`): each earlier reply distilled
against the request revealed by its turn, its first tokens only where asked, the final reply's
term unchanged, and every reply's decision tokens weighted."""

from __future__ import annotations

import pytest
import torch
from vasd_played import played, window

from fic.core.chat import prompt_ids
from fic.core.config import load_config
from fic.data.views import system_message
from fic.training.data import IGNORE
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.loss import DistillLoss
from fic.training.vasd.prompts import teacher_prompts
from fic.training.vasd.rows import reply_targets, rollout_from, teacher_pairs
from fic.training.vasd.teacher import teacher_parts
from fic.training.vasd.terms import run_terms
from fic.training.vasd.terms.turns import partial_prompts
from fic.training.vasd.window import distilled_replies

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_per_turn_teacher_prompts_hold_exactly_the_shards_revealed_by_each_turn(smollm2_tokenizer):
    conv = played(smollm2_tokenizer)
    prompts = partial_prompts(smollm2_tokenizer, conv)
    shards = [s.shard for s in conv.instance.shards]
    assert len(prompts) == len(conv.turns) - 1 == 3
    for k, prompt in enumerate(prompts):  # turn k has revealed shards 1..k+1, as one concat request
        concat = "\n".join(f"- {s}" for s in shards[:k + 1])
        text = smollm2_tokenizer.decode(prompt)
        assert all(s in text for s in shards[:k + 1]) and not any(s in text for s in shards[k + 1:])
        assert prompt == prompt_ids(smollm2_tokenizer, [system_message(conv.instance),
                                                        {"role": "user", "content": text.split("user\n", 1)[1]
                                                         .split("<|im_end|>")[0]}])
        assert concat.split("\n")[-1][2:] in text
    rollout = rollout_from(conv)
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.turns.replies=all", "terms.turns.nonfinal_weight=0.5",
                                         "train.max_steps=1"])
    rollout.replies, reason = distilled_replies(cfg, rollout, conv, smollm2_tokenizer)
    assert reason is None
    assert [r.prompts for r in rollout.replies] == [[p] for p in prompts] + [
        teacher_prompts(smollm2_tokenizer, conv.instance, ["full"])]
    targets, weights = reply_targets(rollout)
    student = [rollout.ids[t + 1] for t, y in enumerate(targets) if y != IGNORE]
    teacher = [token for prompt, reply in teacher_pairs(rollout, 0) for token in reply]
    assert student == teacher  # the student's own reply ids, turn by turn, never re-tokenised
    for (prompt, reply), (start, end) in zip(teacher_pairs(rollout, 0), rollout.earlier + [rollout.final]):
        assert reply == rollout.ids[start:end]
    weights = [w for w in weights if w]
    assert weights == [0.5] * sum(e - s for s, e in rollout.earlier) + [1.0] * len(rollout.answer_ids)


def test_at_the_last_turn_the_per_turn_loss_is_todays_final_turn_loss(tiny_model_dir, smollm2_tokenizer):
    """replies=all adds the earlier replies' terms; the final reply's term is exactly turns=final's."""
    from fic.core.model import load_model

    model = load_model(tiny_model_dir, dtype="float32").eval()
    conv = played(smollm2_tokenizer)
    terms = {}
    for turns, weight in (("final", 1.0), ("all", 0.0), ("all", 1.0)):
        cfg = load_config(VASDConfig, None, ["anchor.share=0", f"terms.turns.replies={turns}",
                                             f"terms.turns.nonfinal_weight={weight}", "teacher.mode=live",
                                             "train.max_steps=1", "train.micro_batch_size=1"])
        parts = teacher_parts(cfg, model)
        (batch,), _ = window(cfg, [conv], smollm2_tokenizer, parts)
        counts = batch.pop("counts")
        loss = DistillLoss(model, run_terms(cfg, anchors=False), parts.heads, chunk_tokens=4, top_k=8)
        with torch.no_grad():
            terms[(turns, weight)] = (loss(**batch)["distill"].item(), counts["distill"])
    final, zero_weight, every = terms[("final", 1.0)], terms[("all", 0.0)], terms[("all", 1.0)]
    # Equal but for float32 rounding: the teacher's forward batches the earlier turns' rows beside it.
    assert zero_weight[0] == pytest.approx(final[0], rel=1e-4) and zero_weight[1] == final[1]
    assert every[0] > final[0] and every[1] > final[1]  # the earlier turns add their own terms


def test_per_turn_distillation_of_the_first_k_tokens_of_each_earlier_reply(smollm2_tokenizer):
    """terms.turns.replies=all with nonfinal_tokens=2: the divergence is taken at exactly the first two
    tokens of each earlier reply and at every token of the final one; the teacher reads those
    same two tokens after each partial request."""
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.turns.replies=all", "terms.turns.nonfinal_tokens=2",
                                         "train.max_steps=1"])
    conv = played(smollm2_tokenizer)
    rollout = rollout_from(conv)
    rollout.replies, reason = distilled_replies(cfg, rollout, conv, smollm2_tokenizer)
    assert reason is None
    targets, _ = reply_targets(rollout)
    trained = {t + 1 for t, y in enumerate(targets) if y != IGNORE}  # token positions
    expected = {t for s, e in rollout.earlier for t in range(s, s + 2)} | set(range(*rollout.final))
    assert trained == expected and all(e - s > 2 for s, e in rollout.earlier)
    pairs = teacher_pairs(rollout, 0)
    assert [len(reply) for _, reply in pairs] == [2] * len(rollout.earlier) + [rollout.final[1] - rollout.final[0]]
    assert pairs[0][1] == conv.ids[rollout.earlier[0][0]:rollout.earlier[0][0] + 2]


def test_decision_tokens_weigh_the_first_tokens_of_every_distilled_reply(smollm2_tokenizer):
    """terms.turns.decision_tokens=2, decision_weight=3 with replies=all and nonfinal_weight=0.5:
    each reply's first two tokens weigh 3 times its own weight, the rest its weight."""
    cfg = load_config(VASDConfig, None, ["anchor.share=0", "terms.turns.replies=all", "terms.turns.nonfinal_weight=0.5",
                                         "terms.turns.decision_tokens=2", "terms.turns.decision_weight=3",
                                         "train.max_steps=1"])
    conv = played(smollm2_tokenizer)
    rollout = rollout_from(conv)
    rollout.replies, _ = distilled_replies(cfg, rollout, conv, smollm2_tokenizer)
    _, weights = reply_targets(rollout)
    for (start, end), weight in [*((span, 0.5) for span in rollout.earlier), (rollout.final, 1.0)]:
        assert weights[start - 1:end - 1] == [3 * weight] * 2 + [weight] * (end - start - 2)
    assert sum(1 for w in weights if w) == sum(e - s for s, e in rollout.earlier + [rollout.final])
