"""`python experiments/ablation.py` in miniature (the tiny random model, a step or two per run), and
its bookkeeping with the runs faked: a killed variant resumed, a given start kept to, a control
trained before kept."""

from __future__ import annotations

import json
from pathlib import Path

import ablation
import pytest
import yaml
from tiny_demo import RECIPES, small

from fic.core import files
from fic.core.errors import FicError
from fic.demo.run import load_demo

pytestmark = [pytest.mark.usefixtures("fresh_accelerate_state"), pytest.mark.slow]  # as the demo's own tests


def test_a_miniature_ablation_trains_every_variant_and_writes_its_table(tiny_model_dir, tmp_path, capsys):
    """Two variants in two seeds, each against the control of its seed, evaluated in float32, and
    the choice of the rule fixed in the config; then (ablation.test) the start, stage 1, the
    choice, a variant asked for and the control on test and test-unseen, in float32."""
    out = tmp_path / "demo"
    variants = "ablation.variants={final: [], per-turn: [terms.turns.replies=all]}"
    assert ablation.main(["--recipes", str(RECIPES), *small(tiny_model_dir, out)[:-1], variants, "ablation.seeds=[0,1]",
                          "ablation.test=true", "ablation.test_runs=[per-turn]", "--quiet"]) == 0
    printed = capsys.readouterr().out
    table = (out / "ablation" / "table.md").read_text()
    assert "Stage 2 variants on the dev split, N = 2 instances, seeds 0, 1" in printed
    for run in ("sft", "final", "final@1", "per-turn", "per-turn@1", "control", "control@1"):
        assert f"| {run} |" in table
        assert (out / "ablation" / run / "dev" / "metrics.json").is_file()
        timed = json.loads((out / "ablation" / run / "dev" / "evaluated.json").read_text())  # prices a later plan
        assert timed["conversations"] == 4 and timed["seconds"] > 0  # 2 dev instances x full and sharded
    assert "Rule `beats_control` (fixed before the table was read): the choice is **" in table
    figures = json.loads((out / "ablation" / "ablation.json").read_text())
    assert figures["rows"]["per-turn@1"]["vs_control"]["better"] >= 0 and figures["rows"]["control"]["vs_sft"]
    assert figures["choice"]["choice"] in ("final", "per-turn", "control")
    rows = figures["rows"]
    for name in ("final", "per-turn"):
        pooled = figures["pooled"][name]
        assert [pooled["better"], pooled["worse"]] == [rows[name]["vs_control"][k] + rows[f"{name}@1"]["vs_control"][k]
                                                       for k in ("better", "worse")]
        assert f"{name} {pooled['better']}-{pooled['worse']}, p = " in table
    assert "Against the control, seeds 0, 1 pooled (for the record; the rule reads each seed): " in table
    assert "Against stage 1 (the `sft` row), seeds 0, 1 pooled" in table and set(figures["pooled_vs_sft"]) == {
        "final", "per-turn", "control"}
    config = yaml.safe_load((out / "ablation" / "per-turn@1" / "train" / "vasd.yaml").read_text())
    assert config["terms"]["turns"]["replies"] == "all" and config["model"]["path"].endswith("sft/final")
    assert config["train"]["seed"] == 1 and config["data"]["seed"] == load_demo(str(RECIPES), []).vasd.data.seed + 1
    assert yaml.safe_load((out / "ablation" / "final" / "train" / "vasd.yaml").read_text())["terms"]["turns"]["replies"] == "final"
    dev = yaml.safe_load((out / "ablation" / "final" / "dev" / "eval.yaml").read_text())
    assert dev["model"]["dtype"] == "float32"

    chosen = figures["choice"]["choice"]
    tested = {"start", "sft", "per-turn", "control", chosen}
    test = json.loads((out / "ablation" / "test.json").read_text())
    assert set(test["sets"]) == {"test", "test-unseen"} and set(test["sets"]["test"]) == tested
    assert test["sets"]["test"]["per-turn"]["vs_control"] is not None and test["sets"]["test"]["sft"]["vs_control"] is None
    assert {"recovery_rate", "retention", "never_answered_rate"} <= set(test["sets"]["test-unseen"]["control"])
    start = yaml.safe_load((out / "ablation" / "start" / "test" / "eval.yaml").read_text())
    assert start["views"] == ["full", "concat", "sharded"] and start["model"]["dtype"] == "float32"
    assert start["data"]["source"] == [f"jsonl:{out / 'data' / 'test.jsonl'}"] and start["model"]["model"].endswith(
        "warmup/final")
    control = yaml.safe_load((out / "ablation" / "control" / "test-unseen" / "eval.yaml").read_text())
    assert control["views"] == ["full", "sharded"] and control["baseline"] == str(out / "ablation" / "start" / "test-unseen")
    shown = (out / "ablation" / "test.md").read_text()
    assert "test split, N = 4 instances, weights in float32" in shown and "test-unseen split, N = 2 instances" in shown
    assert "(the rule's choice) |" in shown and "| per-turn" in shown and "| starting point (" in shown


def test_the_ablation_resumes_a_killed_variant_from_its_checkpoint_and_restarts_one_killed_before_any(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    commands = []
    monkeypatch.setattr(ablation, "_run", lambda command, what: commands.append(command))
    config = SimpleNamespace(train=SimpleNamespace(max_steps=4))
    monkeypatch.setattr(ablation, "config_to_dict", lambda c: {"train": {"max_steps": 4}})

    killed = tmp_path / "killed" / "train"
    files.make_folder(killed, token=files.run_token(killed.parent))  # made by the killed call
    (killed / "checkpoints" / "step-3").mkdir(parents=True)
    (killed / "checkpoints" / "step-3" / "complete").write_text("")
    spent = ablation.train("vasd", config, killed, progress=False)
    assert "resume=true" in commands[-1]
    assert spent["resumed_at_step"] == 3 and spent["estimated"] is True
    assert json.loads((killed / "trained.json").read_text()) == spent

    early = tmp_path / "early" / "train"
    files.make_folder(early, token=files.run_token(early.parent))  # made by an earlier call, as `train` makes it
    (early / "checkpoints" / "step-2").mkdir(parents=True)  # no `complete` marker: a half-written checkpoint
    (early / "metrics.jsonl").write_text("{}\n")
    spent = ablation.train("vasd", config, early, progress=False)
    assert "resume=false" in commands[-1] and not (early / "metrics.jsonl").exists()
    assert "estimated" not in spent

    users = tmp_path / "users" / "train"  # the same, but a folder of the user's: refused, not deleted
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("mine")
    with pytest.raises(FicError, match="is in the way: FiC did not make this folder") as err:
        ablation.train("vasd", config, users, progress=False)
    assert err.value.path == str(users) and (users / "notes.txt").read_text() == "mine"
    (users / "checkpoints" / "step-3").mkdir(parents=True)  # nor resumed into when it holds checkpoints
    (users / "checkpoints" / "step-3" / "complete").write_text("")
    with pytest.raises(FicError, match="is in the way") as err:
        ablation.train("vasd", config, users, progress=False)
    assert err.value.path == str(users) and not (users / "trained.json").exists()

    assert ablation.train("vasd", config, killed, progress=False) == json.loads((killed / "trained.json").read_text())
    assert len(commands) == 2  # a finished variant is not trained again


def ablation_from_a_given_start(tmp_path: Path, monkeypatch, train, evaluate_dev):
    """An ablation whose start is a folder of its own and whose stages, training and dev scores are
    the given fakes (no model runs): its out folder and its start."""
    start = tmp_path / "plateau"
    start.mkdir()
    (start / "config.json").write_text("{}")
    out = tmp_path / "demo"
    (out / "stages").mkdir(parents=True)
    (out / "stages" / "sft.json").write_text(json.dumps({"cpu_seconds": 1200.0, "figures": {"steps": 80}}))
    monkeypatch.setattr(ablation, "run_stages", lambda *a, **k: None)
    monkeypatch.setattr(ablation, "train", train)
    monkeypatch.setattr(ablation, "evaluate_dev", evaluate_dev)
    monkeypatch.setattr(ablation, "ablation_table", lambda *a, **k: {"table": "", "rows": {}, "choice": None})
    return out, start


def test_an_ablation_from_a_given_start_trains_and_scores_every_run_from_it(tmp_path, monkeypatch):
    """ablation.start: the variants, their teacher, the control and the table's `sft` row all read
    that model, and the folder keeps to it: a second start into it is refused before anything runs."""
    from fic.core.errors import FicError
    read = []
    out, start = ablation_from_a_given_start(
        tmp_path, monkeypatch,
        train=lambda kind, config, folder, progress: (
            read.append((kind, config.model.path)), {"seconds": 60.0, "cpu_seconds": 120.0})[1],
        evaluate_dev=lambda cfg, model, folder, progress: (read.append(("dev", str(model))), folder)[1])
    cfg = ablation.load(str(RECIPES), None, [f"out={out}", f"ablation.start={start}", "ablation.seeds=[0]",
                                             "ablation.folder={out}/from-plateau", "ablation.variants={a: []}"])
    ablation.run_ablation(cfg, progress=False, say=lambda line: None)
    root = out / "from-plateau"
    assert read == [("dev", str(start)), ("vasd", str(start)), ("dev", str(root / "a" / "train" / "final")),
                    ("sft", str(start)), ("dev", str(root / "control" / "train" / "final"))]
    # the sft row is the start itself; variant a and the control train from it, and each is scored
    assert json.loads((out / "from-plateau" / "start.json").read_text()) == {"start": str(start)}
    assert not (out / "ablation").exists()

    other = ablation.load(str(RECIPES), None, [f"out={out}", "ablation.folder={out}/from-plateau",
                                               "ablation.seeds=[0]", "ablation.variants={a: []}"])
    with pytest.raises(FicError, match="holds an ablation from .*plateau, not .*sft/final") as refused:
        ablation.run_ablation(other, progress=False, say=lambda line: None)
    assert refused.value.field == "ablation.start" and len(read) == 5


def test_a_control_trained_before_is_kept_and_the_log_says_so_rather_than_a_new_step_count(tmp_path, monkeypatch):
    """A variant added after the control trained moves the variants' mean; the control is kept (its
    marker), and the log must not claim the step count the new mean would give."""
    out, start = ablation_from_a_given_start(
        tmp_path, monkeypatch, train=lambda kind, config, folder, progress: {"seconds": 60.0, "cpu_seconds": 120.0},
        evaluate_dev=lambda cfg, model, folder, progress: folder)
    cfg = ablation.load(str(RECIPES), None, [f"out={out}", f"ablation.start={start}", "ablation.seeds=[0]",
                                             "ablation.variants={a: []}"])
    said = []
    ablation.run_ablation(cfg, progress=False, say=said.append)
    assert "[ablation] control: 8 more SFT steps (the variants' mean 2.0 CPU minutes)" in said
    marker = ablation.ablation_dir(cfg) / "control" / "train" / "trained.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"seconds": 60.0, "cpu_seconds": 120.0}))
    said.clear()
    ablation.run_ablation(cfg, progress=False, say=said.append)
    assert [line for line in said if line.startswith("[ablation] control")] == [
        "[ablation] control: trained before; kept, though the variants' mean is now 2.0 CPU minutes "
        "(the table's train column shows both)"]
