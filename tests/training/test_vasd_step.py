"""VASD's step (`fic.training.vasd.step.VASDStep`): one optimizer step in its four phases,
rollouts -> teacher -> student -> update, logging each of the run's terms under its metric."""

from __future__ import annotations

import pytest
from vasd_played import settings

from fic.core.config import load_config
from fic.core.model import load_tokenizer
from fic.core.progress import Progress
from fic.training import loop
from fic.training.data import load_corpus
from fic.training.vasd.batches import collate_rows
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.inputs import load_rollout_tasks
from fic.training.vasd.rollouts import sync_rollout_backend
from fic.training.vasd.step import VASDStep

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_one_step_logs_each_of_its_terms_under_its_metric_and_the_four_phases(tiny_model_dir, anchor_corpus,
                                                                              tmp_path, monkeypatch):
    cfg = load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, tmp_path / "run", "train.max_steps=1",
                                                 "terms.labels.weight=1", "terms.reference.weight=0.5"))
    accelerator = loop.make_accelerator(cfg)
    tokenizer = load_tokenizer(cfg.model.path)
    instances, _, _ = load_rollout_tasks(cfg)
    anchors, _ = load_corpus(cfg.anchor.path, tokenizer, cfg.anchor.max_seq_len, progress=False)
    vasd = VASDStep(cfg, accelerator, loop.build_model(cfg, device="cpu"), tokenizer, instances, anchors, 1)
    assert [(t.name, t.weight) for t in vasd.terms] == [("distill", 1.0), ("anchor", 1.0), ("labels", 1.0),
                                                        ("reference", 0.5)]
    bar, beats = Progress(1, "vasd", "step", every_s=1000), {}

    def heard(phase, call):  # the run's heartbeat line, taken inside each phase
        def run(*args, **kwargs):
            beats.setdefault(phase, []).append(bar.heartbeat())
            return call(*args, **kwargs)
        return run

    monkeypatch.setattr(vasd.generator, "generate", heard("rollouts", vasd.generator.generate))
    monkeypatch.setattr("fic.training.vasd.teacher.collate_rows", heard("teacher", collate_rows))
    monkeypatch.setattr(vasd.loss_model, "forward", heard("student", vasd.loss_model.forward))
    monkeypatch.setattr("fic.training.vasd.step.sync_rollout_backend", heard("update", sync_rollout_backend))
    try:
        figures, convs = vasd.step(1)
    finally:
        bar.close()
    assert len(convs) == 4
    # each phase names itself with its own progress; the rollouts' turns are not repeated after them
    assert "; now: rollouts 0.0 min in, turn 1, conversations 4" in beats["rollouts"][0]
    micro_batches = len(beats["teacher"])
    assert micro_batches == len(beats["student"]) == cfg.train.grad_accum_steps > 1
    for phase, what in [("teacher", "forward, no gradient"), ("student", "forward and backward")]:
        expected = [f"{phase} ({what}) 0.0 min in, {done}/{micro_batches} micro-batches" for done in range(micro_batches)]
        assert [line.split("; now: ")[1][:len(text)] for line, text in zip(beats[phase], expected)] == expected
    assert beats["update"][0].split("; now: ")[1] == "update (optimizer step) 0.0 min in"
    assert not any("turn" in line for phase in ("teacher", "student", "update") for line in beats[phase])
    metrics = {"divergence_per_token", "anchor_ce", "labels_ce", "reference_divergence"}
    assert metrics <= set(figures) and not {"corrections_ce", "policy_gradient_loss", "reward_mean"} & set(figures)
    assert all(figures[m] > 0 for m in metrics - {"reference_divergence"}) and figures["answer_tokens"] > 0
    assert figures["reference_divergence"] == pytest.approx(0.0, abs=1e-6)  # the first step's student is the start
    assert figures["loss"] == pytest.approx(sum(t.weight * figures[t.metric] for t in vasd.terms))
    assert {key for key in figures if key.endswith("_s")} == {"rollouts_s", "teacher_s", "student_s", "update_s"}
