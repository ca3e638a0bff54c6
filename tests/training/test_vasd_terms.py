"""A VASD run's loss terms (`fic.training.vasd.terms`): each file of the folder is one plug-in,
found by name; a run's terms are the paper's two and the plug-ins that are on, in one order."""

from __future__ import annotations

from pathlib import Path

import pytest

from fic.core.config import load_config
from fic.training.vasd import terms
from fic.training.vasd.config import VASDConfig
from fic.training.vasd.term import KINDS, Term
from fic.training.vasd.terms import PLUGINS, run_terms


def test_each_file_of_the_terms_folder_is_one_plug_in_named_after_it():
    files = sorted(p.stem for p in Path(terms.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert [plugin.name for plugin in PLUGINS] == files
    for plugin in PLUGINS:
        module = __import__(f"fic.training.vasd.terms.{plugin.name}", fromlist=["PLUGIN"])
        assert module.PLUGIN is plugin and plugin.section.__module__ == module.__name__


def test_a_runs_terms_are_the_papers_two_then_the_plug_ins_that_are_on():
    base = ["train.max_steps=1", "anchor.path=sft.jsonl"]
    cfg = load_config(VASDConfig, None, base)
    assert [(t.name, t.metric) for t in run_terms(cfg, anchors=True)] == [("distill", "divergence_per_token"),
                                                                          ("anchor", "anchor_ce")]
    assert [t.name for t in run_terms(cfg, anchors=False)] == ["distill"]  # no anchor rows, no anchor term
    everything = load_config(VASDConfig, None, [*base, "terms.labels.weight=1", "terms.corrections.weight=2",
                                                "terms.reward.weight=1", "terms.reference.weight=1",
                                                "terms.reward.group_size=2", "train.micro_batch_size=2"])
    declared = run_terms(everything, anchors=True)
    assert [t.name for t in declared] == ["distill", "anchor", "corrections", "labels", "reference", "reward"]
    assert all(isinstance(t, Term) and t.kind in KINDS for t in declared) and declared[2].weight == 2.0
    assert len({t.metric for t in declared}) == len(declared)  # each term logged under a name of its own
    with pytest.raises(ValueError, match="ill-declared"):
        Term("x", "divergence", "x", 1.0)  # a divergence must say which head it reads
