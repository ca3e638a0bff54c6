"""`fic.demo.costs`: a stage's minutes and peak, from the stages that finished in the demo's own folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from fic.demo import costs
from fic.demo.run import STAGES, load_demo

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m-instruct"


def test_stages_are_priced_only_from_what_finished_here(tmp_path):
    cfg = load_demo(str(RECIPES), [f"out={tmp_path}", "data.dev=10", "sft.dev.every=20"])  # stage 1 with its dev curve
    line, planned = costs.plan(cfg, list(STAGES[:-1]), {})
    assert set(planned.values()) == {None}  # no machine's price list stands in for this one
    assert line == "estimate: no figures for these settings yet (they will come from the first stages)"
    # the warm-up's 10 steps in 130 s price every SFT-kind stage; stage 1's dev curve is not priced
    # until a stage has scored one: then 4 scores x 10 instances x 2 views took 40 s, 0.5 s each
    warmup = {"stage": "warmup", "seconds": 130.0, "units": 10, "peak_rss_mb": 4096}
    line, planned = costs.plan(cfg, ["warmup", "sft", "vasd"], {"warmup": warmup})
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
