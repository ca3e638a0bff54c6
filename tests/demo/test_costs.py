"""`fic.demo.costs`: a stage's minutes and peak, from the stages that finished in the demo's own folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from fic.demo import costs
from fic.demo.run import STAGES, load_demo

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m-instruct"


def test_stages_are_priced_only_from_what_finished_here(tmp_path):
    cfg = load_demo(str(RECIPES), [f"out={tmp_path}", "data.dev=10", "sft.dev.every=20"])  # stage 1 with its dev curve
    line, planned = costs.plan(cfg, list(STAGES[:-1]), {}, load=(0.3, 2))
    assert set(planned.values()) == {None}  # no machine's price list stands in for this one
    assert line == "estimate: no figures for these settings yet (they will come from the first stages)"
    # the warm-up's 10 steps in 130 s price every SFT-kind stage; stage 1's dev curve is not priced
    # until a stage has scored one: then 4 scores x 10 instances x 2 views took 40 s, 0.5 s each
    warmup = {"stage": "warmup", "seconds": 130.0, "units": 10, "peak_rss_mb": 4096}
    line, planned = costs.plan(cfg, ["warmup", "sft", "vasd"], {"warmup": warmup}, load=(0.0, 2))
    assert planned["warmup"] == {"minutes": pytest.approx(13.0 * cfg.warmup.train.max_steps / 60), "peak_mb": 4096.0,
                                 "source": "measured here (warmup)"}
    assert planned["sft"] is None and planned["vasd"] is None
    assert line.endswith("(measured here figures); not priced yet: sft, vasd")
    curve = {"seconds": 40.0, "curve": [0.1, 0.2, 0.3, 0.3], "instances": None, "views": ["full", "sharded"]}
    scored = {**warmup, "seconds": 170.0, "figures": {"plateau": curve}}  # the same steps, and the curve's 40 s
    assert costs.unit_cost("sft", {"warmup": scored})["seconds"] == 13.0
    sft = costs.estimate(cfg, "sft", {"warmup": scored})
    dev = cfg.sft.dev
    scores = cfg.sft.train.max_steps // dev.every + 1
    conversations = scores * min(dev.data.limit or 10, 10) * len(dev.views)
    assert sft["minutes"] * 60 == pytest.approx(13.0 * cfg.sft.train.max_steps + 0.5 * conversations)


def test_the_control_is_priced_only_once_its_steps_are_known(tmp_path):
    """Its steps are what VASD's time buys at SFT's cost a step: before a VASD stage ran here it is not
    priced (2026-12-08's rerun printed "about 0 min" for it), unless `control_steps` fixes them."""
    cfg = load_demo(str(RECIPES), [f"out={tmp_path}"])
    sft = {"stage": "sft", "seconds": 2000.0, "units": 200, "peak_rss_mb": 4096}
    assert costs.estimate(cfg, "control", {"sft": sft}) is None
    vasd = {"stage": "vasd", "seconds": 1000.0, "units": 32, "peak_rss_mb": 6000}
    bought = cfg.vasd.train.max_steps * (1000.0 / 32) / 10.0  # VASD's seconds over SFT's 10 s a step
    assert costs.estimate(cfg, "control", {"sft": sft, "vasd": vasd})["minutes"] * 60 == pytest.approx(10.0 * bought)
    fixed = load_demo(str(RECIPES), [f"out={tmp_path}", "control_steps=30"])
    assert costs.estimate(fixed, "control", {"sft": sft})["minutes"] == pytest.approx(30 * 10.0 / 60)


def test_the_plan_says_the_load_at_start_and_what_it_does_to_a_stage(tmp_path):
    """A quiet machine's plan says nothing of load; a loaded one says the load and the slow-down, priced
    stages or none (the smoke run took 15 min quiet and 2 h under a load of 4-8 on 2 cores)."""
    cfg = load_demo(str(RECIPES), [f"out={tmp_path}"])
    warmup = {"stage": "warmup", "seconds": 130.0, "units": 10, "peak_rss_mb": 4096}
    quiet, _ = costs.plan(cfg, ["warmup"], {"warmup": warmup}, load=(0.4, 2))
    assert "load" not in quiet
    for done in ({}, {"warmup": warmup}):
        loaded, planned = costs.plan(cfg, ["warmup"], done, load=(6.0, 2))
        assert loaded.endswith("; this machine's load is 6.0 on 2 cores: a stage runs about 4.0x slower than on a "
                               "quiet one")
        assert planned == costs.plan(cfg, ["warmup"], done, load=(0.0, 2))[1]  # the figures themselves unscaled
    load, cores = costs.load_now()
    assert load >= 0.0 and cores >= 1
