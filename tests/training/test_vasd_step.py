"""VASD's step (`fic.training.vasd.step.VASDStep`): one optimizer step in its four phases,
rollouts -> teacher -> student -> update, logging each of the run's terms under its metric."""

from __future__ import annotations

import pytest
from vasd_played import settings

from fic.core.config import load_config
from fic.core.model import load_tokenizer
from fic.training import loop
from fic.training.data import load_corpus
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.inputs import load_rollout_tasks
from fic.training.vasd.step import VASDStep

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_one_step_logs_each_of_its_terms_under_its_metric_and_the_four_phases(tiny_model_dir, anchor_corpus,
                                                                              tmp_path):
    cfg = load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, tmp_path / "run", "train.max_steps=1",
                                                 "terms.labels.weight=1", "terms.reference.weight=0.5"))
    accelerator = loop.make_accelerator(cfg)
    tokenizer = load_tokenizer(cfg.model.path)
    instances, _, _ = load_rollout_tasks(cfg)
    anchors, _ = load_corpus(cfg.anchor.path, tokenizer, cfg.anchor.max_seq_len, progress=False)
    vasd = VASDStep(cfg, accelerator, loop.build_model(cfg, device="cpu"), tokenizer, instances, anchors, 1)
    assert [(t.name, t.weight) for t in vasd.terms] == [("distill", 1.0), ("anchor", 1.0), ("labels", 1.0),
                                                        ("reference", 0.5)]
    figures, convs = vasd.step(1)
    assert len(convs) == 4
    metrics = {"divergence_per_token", "anchor_ce", "labels_ce", "reference_divergence"}
    assert metrics <= set(figures) and not {"corrections_ce", "policy_gradient_loss", "reward_mean"} & set(figures)
    assert all(figures[m] > 0 for m in metrics - {"reference_divergence"}) and figures["answer_tokens"] > 0
    assert figures["reference_divergence"] == pytest.approx(0.0, abs=1e-6)  # the first step's student is the start
    assert figures["loss"] == pytest.approx(sum(t.weight * figures[t.metric] for t in vasd.terms))
    assert {key for key in figures if key.endswith("_s")} == {"rollouts_s", "teacher_s", "student_s", "update_s"}
