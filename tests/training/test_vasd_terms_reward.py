"""The reward term of stage 2 (`fic/training/vasd/terms/reward.py`, `terms.reward.*`): the reward of a scripted rollout, the leave-one-out
advantages, the reward targets on a rollout's own row, the term's value against a naive policy
gradient, the grouped rollouts of a step, and the settings refused."""

from __future__ import annotations

import json
import math

import pytest
import torch
from actions_instances import late_optional_instance
from vasd_played import RECIPE, play_scripted

from fic import tasks
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.training.data import IGNORE
from fic.training.vasd.batches import batch_counts, collate_rows
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.loss import DistillLoss
from fic.training.vasd.rows import rollout_from, student_row
from fic.training.vasd.terms import run_terms
from fic.training.vasd.terms.reward import leave_one_out, reward_figures, reward_targets, rollout_reward

REWARD = ["train.max_steps=1", "anchor.share=0", "loss.weight=0", "terms.reward.weight=1.0"]

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def calls_from(turn: int, answer: str):
    """An assistant that defers until turn index `turn`, then answers `answer` at every turn."""
    return lambda prompt: answer if prompt.count("<|im_start|>user") > turn else "Which details do you have?"


def test_the_reward_is_the_final_score_discounted_for_an_early_call(smollm2_tokenizer):
    """A call made once every required argument was said, with an optional one still to come, is
    premature but answerable: `penalize: premature` discounts it, `unanswerable` does not; a call
    made before that is discounted under both; a patient correct call earns 1, a wrong one 0."""
    instance, order, required = late_optional_instance()
    complete = max(order.index(p) for p in required) + 1  # the turn whose shard completes the required arguments
    last = len(instance.shards) - 1
    gold = tasks.get("actions").gold_reply(instance)
    answerable = play_scripted(instance, calls_from(complete, gold), smollm2_tokenizer)
    unanswerable = play_scripted(instance, calls_from(0, gold), smollm2_tokenizer)
    patient = play_scripted(instance, calls_from(last, gold), smollm2_tokenizer)
    record = answerable.to_record()
    assert record["premature_answer"] and record["answerable_at_first_answer"] is True and record["score"] == 1.0
    assert unanswerable.to_record()["answerable_at_first_answer"] is False and unanswerable.score() == 1.0
    assert not patient.to_record()["premature_answer"]

    assert rollout_reward(patient, 1.0) == 1.0
    assert rollout_reward(answerable, 1.0) == 0.0 and rollout_reward(answerable, 0.25) == 0.75
    assert rollout_reward(answerable, 1.0, "unanswerable") == 1.0
    assert rollout_reward(unanswerable, 1.0, "unanswerable") == 0.0 and rollout_reward(unanswerable, 0.5) == 0.5
    wrong = play_scripted(instance, calls_from(last, gold.split("(")[0] + '(city="Nowhere")]'),
                          smollm2_tokenizer)
    assert wrong.turns[-1].label == "answer_attempt" and rollout_reward(wrong, 0.0) == 0.0
    never = play_scripted(instance, lambda prompt: "Which details do you have?", smollm2_tokenizer)
    assert rollout_reward(never, 0.0) == 0.0


def test_a_rollout_that_ends_on_an_ask_earns_the_unanswered_reward(smollm2_tokenizer):
    """`terms.reward.unanswered_reward` replaces the score of a conversation whose final reply is no
    answer attempt, even one that called right earlier; a final call keeps its score."""
    instance, _, _ = late_optional_instance()
    last = len(instance.shards) - 1
    gold = tasks.get("actions").gold_reply(instance)
    ask = "Which details do you have?"
    never = play_scripted(instance, lambda prompt: ask, smollm2_tokenizer)
    assert rollout_reward(never, 0.0, unanswered=-0.5) == -0.5
    early_then_ask = play_scripted(instance, lambda prompt: gold if prompt.count("<|im_start|>user") <= last else ask,
                                   smollm2_tokenizer)
    assert early_then_ask.score() == 1.0 and early_then_ask.turns[-1].label != "answer_attempt"
    assert rollout_reward(early_then_ask, 0.0) == 1.0  # at 0 the setting is off: the last answer's score
    assert rollout_reward(early_then_ask, 0.0, unanswered=-0.25) == -0.25
    patient = play_scripted(instance, calls_from(last, gold), smollm2_tokenizer)
    wrong = play_scripted(instance, calls_from(last, gold.split("(")[0] + '(city="Nowhere")]'), smollm2_tokenizer)
    assert rollout_reward(patient, 1.0, unanswered=-1.0) == 1.0 and rollout_reward(wrong, 1.0, unanswered=-1.0) == 0.0


def test_leave_one_out_advantages():
    assert leave_one_out([1.0, 0.0, 0.0, 1.0], 2) == [1.0, -1.0, -1.0, 1.0]
    advantages = leave_one_out([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5], 4)
    assert advantages[:4] == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert advantages[4:] == [0.0] * 4  # a group that scored alike trains nothing, exactly
    assert leave_one_out([0.1] * 4, 4) == [0.0] * 4  # not a rounding residue
    assert sum(leave_one_out([0.9, 0.2, 0.0, 0.4], 4)) == pytest.approx(0.0)
    assert reward_figures([1.0, 0.0, 0.5, 0.5], leave_one_out([1.0, 0.0, 0.5, 0.5], 2), 2) == {
        "reward_mean": 0.5, "reward_flat_groups": 0.5}
    with pytest.raises(ValueError, match="groups of 4"):
        leave_one_out([1.0, 0.0, 1.0], 4)


def patient_rollout(tokenizer):
    """A generated actions instance played by an assistant that asks until the last shard, then calls right."""
    instance, _, _ = late_optional_instance()
    gold = tasks.get("actions").gold_reply(instance)
    return play_scripted(instance, calls_from(len(instance.shards) - 1, gold), tokenizer)


def test_reward_targets_are_every_reply_token_at_the_rollouts_advantage(smollm2_tokenizer):
    """Every token of every reply (the early asks, where the decision is made, and the final
    call) is a reward target weighing the advantage; nothing else is; the term counts positions."""
    cfg = load_config(VASDConfig, None, REWARD)
    terms = run_terms(cfg, anchors=False)
    assert [(t.name, t.per) for t in terms] == [("reward", "positions")]
    conv = patient_rollout(smollm2_tokenizer)
    rollout = rollout_from(conv)
    rollout.values["reward"] = -0.5
    row = student_row(rollout.ids, {"reward": reward_targets(cfg, rollout)})
    expected = {t - 1 for turn in conv.turns for t in range(turn.prompt_tokens, turn.prompt_tokens + turn.reply_tokens)}
    targets = {t for t, y in enumerate(row["targets"]["reward"]) if y != IGNORE}
    assert targets == expected and len(conv.turns) > 2
    assert all(row["targets"]["reward"][t] == conv.ids[t + 1] and row["weights"]["reward"][t] == -0.5 for t in targets)
    assert all(row["weights"]["reward"][t] == 0.0 for t in range(len(conv.ids)) if t not in targets)
    counts = batch_counts(collate_rows([row], smollm2_tokenizer.pad_token_id, names=["reward"]), terms)
    assert counts["reward"] == len(expected)  # positions: the signed weights would sum to a negative count

    rollout.values["reward"] = 0.0
    assert all(y == IGNORE for y in reward_targets(cfg, rollout)[0])


def test_the_reward_term_is_the_advantage_weighted_log_likelihood_at_the_sampling_temperature(
        tiny_model_dir, smollm2_tokenizer):
    """Its value is sum_t -A log softmax(logits_t / T)[y_t] over the reply tokens, so descending
    it raises the log-probability of a rollout with a positive advantage, at the temperature the
    tokens were sampled at."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    cfg = load_config(VASDConfig, None, [*REWARD, "rollout.temperature=0.5"])
    conv = patient_rollout(smollm2_tokenizer)
    rollout = rollout_from(conv)
    rollout.values["reward"] = 0.75
    batch = collate_rows([student_row(rollout.ids, {"reward": reward_targets(cfg, rollout)})],
                         smollm2_tokenizer.pad_token_id, names=["reward"])
    loss = DistillLoss(model, run_terms(cfg, anchors=False), {}, chunk_tokens=16)
    assert loss.terms[0].temperature == 0.5  # the sampling temperature
    terms = loss(**batch)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits[0].float()
    where = batch["targets"]["reward"][0] != IGNORE
    logp = torch.log_softmax(logits[where] / 0.5, dim=-1).gather(1, batch["targets"]["reward"][0][where][:, None])
    assert terms["reward"].item() == pytest.approx(float(-0.75 * logp.sum()), rel=1e-4)
    terms["reward"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_the_recipe_plays_each_task_group_size_times_and_trains_on_the_reward(tiny_model_dir, tmp_path):
    from fic.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "vasd", "--config", str(RECIPE), f"model.path={tiny_model_dir}", f"out={out}",
                 "train.max_steps=2", "train.micro_batch_size=2", "train.grad_accum_steps=2", "rollout.max_new_tokens=6",
                 "logging.wandb=false", "data.limit=8", "logging.progress=false", "logging.samples_every=1",
                 "loss.weight=0", "anchor.share=0", "terms.reward.weight=1.0", "terms.reward.group_size=2",
                 "terms.reward.premature_penalty=0.5", "terms.reward.unanswered_reward=-0.5"]) == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    unanswered_steps = 0
    for step in steps:
        played = [s for s in samples if s["step"] == step["step"]]
        # the step's rewards from its samples (all 4 rollouts): -0.5 for one that ends on no answer,
        # between 0 and its score (the premature discount unseen here) for one that ends on a call
        ends_on_call = [s["conversation"].rsplit("[assistant:", 1)[1].startswith("answer_attempt]") for s in played]
        unanswered = ends_on_call.count(False)
        answered_scores = sum(s["score"] for s, call in zip(played, ends_on_call) if call)
        assert -0.5 * unanswered / 4 - 1e-6 <= step["reward_mean"] <= (answered_scores - 0.5 * unanswered) / 4 + 1e-6
        unanswered_steps += unanswered == 4
        assert 0.0 <= step["reward_flat_groups"] <= 1.0
        assert step["loss"] is not None and math.isfinite(step["loss"])
    assert unanswered_steps  # a random model's 6-token replies are no calls: the setting was exercised
    for step in (1, 2):
        played = [s for s in samples if s["step"] == step]
        tasks_played = [s["task_id"] for s in played]
        assert len(tasks_played) == 4 and tasks_played[0] == tasks_played[1] != tasks_played[2] == tasks_played[3]
        # a group's rollouts sample from seeds of their own (6 tokens a reply from a random model)
        assert played[0]["conversation"] != played[1]["conversation"] and played[2]["conversation"] != played[3]["conversation"]


@pytest.mark.parametrize("override, field", [
    (["terms.reward.group_size=3"], "terms.reward.group_size"),     # 3 does not divide 2 x 2 rollouts
    (["rollout.temperature=0"], "rollout.temperature"),             # greedy groups are all alike
])
def test_reward_settings_that_cannot_train_are_refused(override, field):
    base = ["train.max_steps=1", "train.micro_batch_size=2", "train.grad_accum_steps=2", "anchor.share=0",
            "terms.reward.weight=1.0", "terms.reward.group_size=2"]
    with pytest.raises(FicError) as error:
        load_config(VASDConfig, None, base + override)
    assert error.value.field == field
    load_config(VASDConfig, None, base)  # the base itself is fine
    load_config(VASDConfig, None, REWARD)
