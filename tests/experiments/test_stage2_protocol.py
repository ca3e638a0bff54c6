"""Issue 55's protocol (experiments/stage2_label_free): every config it fills loads with its verb's
config class, every `fic` command of arms.sh with its overrides, so a renamed key fails here and not
two hours into a run; V's settings are the demo's stage 2 and C2's corpus is built like stage 1's."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from stage2_label_free import protocol

from fic.core.config import config_to_dict, load_config
from fic.core.errors import FicError
from fic.corpus.build import SFTDataConfig
from fic.demo.run import load_demo
from fic.evaluation.evaluate import EvalConfig
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m-instruct"
VERBS = {("train", "vasd"): VASDConfig, ("train", "sft"): SFTConfig, ("eval",): EvalConfig, ("sft-data",): SFTDataConfig}
# the shell variables arms.sh sets at run time, with values of their kind
SHELL = {"$STEPS": "7", "$S": "/run/sft/final", "$C2_RATE": "2.0e-4"}


def prepared(tmp_path: Path) -> Path:
    return protocol.prepare(tmp_path / "run", tmp_path / "out", seeds=[0, 1], v_steps=32, lrs=["1.0e-4", "2.0e-4"])


def config_class(name: str) -> type:
    if name == "c2-data.yaml":
        return SFTDataConfig
    return {"v": VASDConfig, "h": VASDConfig, "c1": SFTConfig, "c2": SFTConfig, "eval": EvalConfig}[name.split("-")[0]]


def commands(script: Path) -> list[tuple[type, str, list[str]]]:
    """Each `fic` command of a script that takes a config: (its class, --config, its overrides)."""
    found = []
    body = script.read_text().split("\nS=", 1)[1]  # the helpers' own commands are tested by themselves
    for command in [part for line in body.splitlines() if not line.startswith("#")
                    for part in line.split("#")[0].split("&&")]:
        words = [w for w in shlex.split(command) if w not in {"(", ")", "&"}]
        if "fic" not in words:
            continue
        words = words[words.index("fic") + 1:]
        verb = next((v for v in VERBS if tuple(words[:len(v)]) == v), None)
        if verb is None:
            assert words[0] == "self-label", f"a fic command this test does not check: {command}"
            continue
        rest = words[len(verb):]
        config = rest[rest.index("--config") + 1]
        overrides = [w for w in rest if "=" in w and not w.startswith("--")]
        for name, value in SHELL.items():
            overrides = [w.replace(name, value) for w in overrides]
            config = config.replace(name, value)
        found.append((VERBS[verb], config, overrides))
    return found


def test_every_config_the_protocol_fills_loads_with_its_verbs_class(tmp_path):
    script = prepared(tmp_path)
    configs = sorted((script.parent / "configs").iterdir())
    assert {config_class(c.name) for c in configs} == set(VERBS.values())
    for path in configs:
        text = path.read_text()
        assert "{" + "run}" not in text and "{" + "out}" not in text and "{" + "seed}" not in text, path.name
        load_config(config_class(path.name), path)  # unknown keys are errors
    for written in (script, script.parent / "pilot.sh", script.parent / "btest.sh"):
        checked = commands(written)
        assert {cls for cls, _, _ in checked} == (set(VERBS.values()) if written != script.parent / "btest.sh"
                                                  else {EvalConfig}), written.name
        for cls, config, overrides in checked:
            load_config(cls, config, overrides)


def test_a_renamed_key_in_a_template_fails_the_load(tmp_path, monkeypatch):
    """What the test above guards against: a key VASD no longer has (`loss.turns`, renamed
    `terms.turns.replies`) in V's template."""
    templates = tmp_path / "templates"
    (templates / "configs").mkdir(parents=True)
    for path in [*(protocol.HERE / "configs").iterdir(), protocol.HERE / "eval.yaml"]:
        (templates / path.relative_to(protocol.HERE)).write_text(path.read_text())
    v = templates / "configs" / "v.yaml"
    v.write_text(v.read_text().replace("max_log_ratio: 2.0}", "max_log_ratio: 2.0, turns: final}"))
    monkeypatch.setattr(protocol, "HERE", templates)
    script = prepared(tmp_path)
    with pytest.raises(FicError, match="turns"):
        load_config(VASDConfig, script.parent / "configs" / "v-s0.yaml")


def test_v_is_the_demos_stage_2_without_the_gold_and_h_only_adds_it(tmp_path):
    """V keeps the settings the demo chose on dev (rollouts, loss, rate, anchors) and changes only what
    the protocol is about: B-train's blinded prompts and the full-view teacher. H differs from V only
    in its teacher reading the gold (and B-train's true answers)."""
    script = prepared(tmp_path)
    demo = config_to_dict(load_demo(str(RECIPES), [f"out={tmp_path / 'run'}"]).vasd)
    v = config_to_dict(load_config(VASDConfig, script.parent / "configs" / "v-s1.yaml"))
    h = config_to_dict(load_config(VASDConfig, script.parent / "configs" / "h-s0.yaml"))
    for section in ("rollout", "loss", "optim", "terms", "anchor", "model"):
        assert v[section] == demo[section], section
    assert {k: v["train"][k] for k in v["train"] if k != "seed"} == {k: demo["train"][k] for k in demo["train"]
                                                                       if k != "seed"}
    assert v["train"]["seed"] == 1 and v["teacher"] == {**demo["teacher"], "view": "full"}
    # a seed draws the rollout prompts and anchors too, as each control's seed draws its corpus order;
    # seed 0 (and H) keep VASD's default draw
    assert v["data"]["seed"] == 2 and h["data"]["seed"] == VASDConfig().data.seed == 1
    v0 = config_to_dict(load_config(VASDConfig, script.parent / "configs" / "v-s0.yaml"))
    assert v0["data"]["seed"] == 1
    assert v["data"]["source"] == [f"jsonl:{tmp_path / 'out'}/arms/b-train.blind.jsonl"]
    assert h["teacher"]["view"] == "gold-hinted" and h["data"]["source"] == [f"jsonl:{tmp_path / 'out'}/B/train.jsonl"]
    differ = {k for k in v if v[k] != h[k]}
    assert differ == {"teacher", "data", "out", "train"} and h["train"]["seed"] == 0
    # the held-out divergence on the 64 unseen-function tasks after B-train ([768:1368]), no view played
    assert v["dev"]["every"] == 8 and v["dev"]["views"] == [] and v["dev"]["data"]["limit"] == 64
    assert v["dev"]["data"]["source"] == ["actions-gen:test-unseen[1368:1432]"] and v["dev"]["data"]["seed"] == 0


def test_c2s_corpus_is_built_with_stage_1s_shares_from_the_self_labels(tmp_path):
    script = prepared(tmp_path)
    c2 = load_config(SFTDataConfig, script.parent / "configs" / "c2-data.yaml")
    stage1 = load_demo(str(RECIPES), [f"out={tmp_path / 'run'}"]).sft_data
    shares = ("single_turn_share", "recovery_share", "partial_share", "ask_share")
    assert [getattr(c2, k) for k in shares] == [getattr(stage1, k) for k in shares]
    assert c2.data.source == [f"jsonl:{tmp_path / 'out'}/arms/b-train.self.jsonl"]
    excluded = yaml.safe_load((script.parent / "configs" / "c2-data.yaml").read_text())["exclude"]["sources"]
    assert sorted(Path(p).name for p in excluded) == ["eval-bdev.yaml", "eval-btest.yaml"]


def test_c2_and_c1_get_v_s_cpu_seconds_at_their_calibrated_cpu_seconds_a_step(capsys):
    """2 steps took 40 CPU s, 22 steps 340 (start-up 10): 15 a step; V's 2,250 buy 150. A calibration
    whose longer run took no more is refused (exit 2), not turned into a step count."""
    assert protocol.main(["steps", "--budget-s", "2250", "--calibration", "40", "340"]) == 0
    assert capsys.readouterr().out.strip() == "150"
    assert protocol.main(["steps", "--budget-s", "2250", "--calibration", "40", "39"]) == 2
    assert "rerun it on a quiet machine" in capsys.readouterr().err


def test_v_s_held_out_measuring_is_left_out_of_the_controls_budget(tmp_path, capsys):
    """V's metrics.jsonl logs what each held-out measuring cost (held_out_cpu_s, at step 0 and every
    dev.every steps, twice for a step a resume repeated): those CPU seconds are not training, so the
    controls' budget leaves all of them out. The divergence's fall is read from first to last."""
    v = tmp_path / "v-s0"
    v.mkdir()
    rows = [{"step": 0, "dev_divergence_per_token": 0.5, "held_out_cpu_s": 100.0}, {"step": 1, "loss": 0.3},
            {"step": 8, "loss": 0.2, "dev_divergence_per_token": 0.4, "held_out_cpu_s": 110.0},
            {"step": 8, "loss": 0.2, "dev_divergence_per_token": 0.4, "held_out_cpu_s": 115.0},  # resumed
            {"step": 16, "loss": 0.1, "dev_divergence_per_token": 0.3, "held_out_cpu_s": 125.0}]
    (v / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = protocol.held_out(v)
    assert figures["cpu_s"] == 450.0 and figures["fall"] == pytest.approx(0.4)
    assert figures["curve"] == [[0, 0.5], [8, 0.4], [8, 0.4], [16, 0.3]]
    assert protocol.main(["steps", "--budget-s", "2700", "--less-held-out", str(v), "--calibration", "40", "340"]) == 0
    assert capsys.readouterr().out.strip() == "150"  # (2,700 - 450) / 15
    missing = tmp_path / "v-s1"  # V not trained yet: one line naming its log, exit 2
    assert protocol.main(["steps", "--budget-s", "2700", "--less-held-out", str(missing), "--calibration", "40", "340"]) == 2
    assert str(missing / "metrics.jsonl") in capsys.readouterr().err


def test_calibrate_times_each_run_once_into_a_fresh_scratch_folder(tmp_path):
    """The scripts' `calibrate` runs an arm's config for 2 and 22 steps, each timed under its own
    label, into a scratch folder it empties first (a killed run's leftovers); a label already in
    times.tsv is a finished run and is not run again. `fic` is a stand-in that records its arguments."""

    script = prepared(tmp_path).parent / "arms.sh"
    assert "calibrate c2 " in script.read_text() and "calibrate c1 " in script.read_text()
    helpers = script.read_text().split("\nS=")[0]
    arms = tmp_path / "out" / "arms"
    (arms / "calibrate" / "c2-22").mkdir(parents=True)
    (arms / "calibrate" / "c2-22" / "leftover").write_text("")
    calls = tmp_path / "calls"
    probe = tmp_path / "probe.sh"
    config = arms / "configs" / "c2-lr1.0e-4-s0.yaml"
    leftover = arms / "calibrate" / "c2-22" / "leftover"
    probe.write_text(f'{helpers}\nfic() {{ echo "$*" >> {calls}; if [ -e {leftover} ]; then echo leftover >> {calls}; fi; }}\n'
                     f'calibrate c2 {config}\ncalibrate c2 {config}\n')
    subprocess.run(["bash", str(probe)], check=True, timeout=60)
    lines = calls.read_text().splitlines()
    # the 22-step run's folder is emptied just before that run, and the second call runs nothing
    assert lines == [f"train sft --config {config} train.max_steps=2 out={arms}/calibrate/c2-2", "leftover",
                     f"train sft --config {config} train.max_steps=22 out={arms}/calibrate/c2-22"]
    for line in lines[::2]:  # the overrides load with the arm's config
        load_config(SFTConfig, config, line.split()[4:])
    labels = [line.split()[0] for line in (arms / "times.tsv").read_text().splitlines()]
    assert labels == ["cal-c2-2", "cal-c2-22"]


def evaluation(folder: Path, views: dict[str, list[int]], *, premature=(), never=(), wrong_first=(),
               instances: Path | None = None) -> None:
    """An evaluation folder as `fic eval` leaves it: config.yaml (its instances file, views, runs) and
    conversations.jsonl, each view's scores in the order of the instances (`instances`: where the
    instances file goes, in the folder unless given). A sharded conversation answers once, with its
    score, unless it never answers or is in `wrong_first` (a wrong answer first, then its score)."""
    folder.mkdir(parents=True)
    n = len(next(iter(views.values())))
    instances = instances or folder / "instances.jsonl"
    instances.write_text("".join(json.dumps({"task_id": f"t{i}"}) + "\n" for i in range(n)))
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": {"source": [f"jsonl:{instances}"]},
                                                        "views": list(views), "runs": 1}))
    (folder / "conversations.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "view": view, "run": 0, "score": float(s),
                    "premature_answer": view == "sharded" and i in premature,
                    "first_answer_turn": None if view == "sharded" and i in never else 1,
                    "shards_at_first_answer": 2, "num_shards": 3,
                    "turns": [] if view == "sharded" and i in never else
                    [{"label": "answer_attempt", "score": 0.0}] * (view == "sharded" and i in wrong_first)
                    + [{"label": "answer_attempt", "score": float(s)}]}) + "\n"
        for view, scores in views.items() for i, s in enumerate(scores)))


def test_the_pilot_pairs_v_and_c2_with_s_and_applies_its_rule_to_v_minus_s(tmp_path, capsys):
    """Ten B-dev instances. Sharded, S is right on the first 4, V on the first 5 (+10 points, 1-0), C2
    on 4 (V better on 2, C2 on 1); the rule needs V - S >= 3: it holds. C2's seen-dev run is unfinished."""
    arms = tmp_path / "arms"
    full = [1] * 8 + [0] * 2
    evaluation(arms / "eval" / "s", {"full": full, "sharded": [1] * 4 + [0] * 6}, premature={5, 6}, never={9},
               wrong_first={0})
    evaluation(arms / "eval" / "v-s0", {"full": full, "sharded": [1] * 5 + [0] * 5}, premature={6})
    evaluation(arms / "eval" / "c2-lr1.0e-4-s0", {"full": [1] * 7 + [0] * 3, "sharded": [0, 0, 1, 1, 1, 0, 0, 0, 0, 1]})
    evaluation(arms / "eval-seen" / "s", {"full": [1, 1, 1, 0]})
    evaluation(arms / "eval-seen" / "v-s0", {"full": [1, 1, 0, 0]})
    assert protocol.main(["pilot", "--out", str(tmp_path)]) == 0
    report = json.loads((arms / "pilot.json").read_text())
    assert report["models"]["S"] == {"n": 10, "full": 80.0, "sharded": 40.0, "premature": 20.0, "never_answered": 10.0,
                                     "first_answer": 30.0, "seen_full": 75.0}
    assert report["models"]["C2"]["seen_full"] is None and report["not_finished"] == ["C2 on the seen dev set"]
    v_s, v_c2 = report["pairs"]["V - S"], report["pairs"]["V - C2"]
    assert (v_s["difference"], v_s["better"], v_s["worse"]) == (10.0, 1, 0)
    assert (v_c2["difference"], v_c2["better"], v_c2["worse"]) == (10.0, 2, 1)
    seen = report["seen_pairs"]  # retention, paired; C2's seen run unfinished
    assert list(seen) == ["V - S"] and (seen["V - S"]["difference"], seen["V - S"]["worse"]) == (-25.0, 1)
    assert report["verdict"].startswith("continue: V beats S by +10.0")
    printed = capsys.readouterr().out
    assert "| V - C2 | 10 | +10.0 (" in printed and "| P(full), seen dev |" in printed and "not finished: C2 on the seen dev set" in printed

    (arms / "eval" / "v-s0" / "conversations.jsonl").write_text("")  # V not evaluated yet: no verdict
    protocol.main(["pilot", "--out", str(tmp_path)])
    assert json.loads((arms / "pilot.json").read_text())["verdict"] is None


def test_the_pilot_stops_when_v_gains_less_than_three_points_on_s(tmp_path):
    arms = tmp_path / "arms"
    for name in ("s", "v-s0"):  # V equals S: 0 < 3
        evaluation(arms / "eval" / name, {"full": [1] * 10, "sharded": [1] * 5 + [0] * 5})
    protocol.main(["pilot", "--out", str(tmp_path)])
    assert json.loads((arms / "pilot.json").read_text())["verdict"] == "stop: V - S = +0.0 < 3 points; H runs next"


def test_arms_sh_runs_v_in_every_seed_then_each_controls_rates_in_the_first_then_its_chosen_rate(tmp_path):
    """Seeds 0, 1, 2 and rates a, b: V's three seeds before any control; C2 at both rates in seed 0,
    `choose` after both are evaluated, seeds 1 and 2 at the chosen rate; H; C1 in seed 0 only; decide;
    then V seed 0 again for each term's gradient norm, its weights compared with V's."""
    script = protocol.prepare(tmp_path / "run", tmp_path / "out", seeds=[0, 1, 2], v_steps=32, lrs=["1.0e-4", "2.0e-4"])
    lines = [line for line in script.read_text().split("\nS=", 1)[1].splitlines() if line and not line.startswith("#")]
    trained = [line.split()[1] for line in lines if line.startswith("train ")]
    assert trained == ["v-s0", "v-s1", "v-s2", "c2-lr1.0e-4-s0", "c2-lr2.0e-4-s0", "c2-lr$C2_RATE-s1",
                       "c2-lr$C2_RATE-s2", "h-s0", "c1-lr1.0e-4-s0", "c1-lr2.0e-4-s0", "v-s0-norms"]
    choose = next(i for i, line in enumerate(lines) if line.startswith("C2_RATE="))
    evaluated = [i for i, line in enumerate(lines) if "eval/c2-lr" in line and "-s0" in line]
    assert max(evaluated) < choose < next(i for i, line in enumerate(lines) if line.startswith("train c2-lr$C2_RATE"))
    assert "choose --out" in lines[choose] and lines[choose].endswith("--arm c2 --seed 0 --lrs 1.0e-4 2.0e-4)")
    assert any(line.endswith(f"out={tmp_path / 'out' / 'arms' / 'eval-seen' / 'h-s0'}") for line in lines)  # H's retention
    decide = next(line for line in lines if " decide " in line)
    assert decide.endswith("decide --out " + str(tmp_path / "out") + " --seeds 0 1 2 --lrs 1.0e-4 2.0e-4")
    assert lines[-2].endswith("logging.term_grad_norms_every=4 dev.every=0") and lines[-1].startswith("cmp ")
    configs = {path.name for path in (script.parent / "configs").iterdir()}
    assert {f"c2-lr{lr}-s{seed}.yaml" for lr in ("1.0e-4", "2.0e-4") for seed in (0, 1, 2)} <= configs
    assert not any(name.startswith("c1-") and not name.endswith("-s0.yaml") for name in configs)


def test_a_controls_rate_is_the_best_sharded_p_of_its_first_seed_on_b_dev(tmp_path, capsys):
    arms = tmp_path / "arms"
    for lr, right in (("3.0e-5", 4), ("1.0e-4", 6), ("2.0e-4", 6)):  # a tie: the first listed
        evaluation(arms / "eval" / f"c2-lr{lr}-s0", {"full": [1] * 10, "sharded": [1] * right + [0] * (10 - right)})
    assert protocol.main(["choose", "--out", str(tmp_path), "--arm", "c2"]) == 0
    assert capsys.readouterr().out.strip() == "1.0e-4"
    assert protocol.choose_rate(tmp_path, "c2", 0, ["2.0e-4", "1.0e-4"]) == "2.0e-4"
    unfinished = arms / "eval" / "c2-lr2.0e-4-s0" / "conversations.jsonl"
    unfinished.write_text(unfinished.read_text().splitlines(keepends=True)[0])
    assert protocol.main(["choose", "--out", str(tmp_path), "--arm", "c2"]) == 2  # no choice among some rates
    assert "c2-lr2.0e-4-s0: c2 at rate 2.0e-4, seed 0: its B-dev evaluation has not finished" in capsys.readouterr().err


def test_decide_applies_the_frozen_rule_and_the_convincing_negative(tmp_path, capsys):
    """Three seeds, ten B-dev instances. S right on 4 of 10 sharded; C2's rates: 1e-4 on 6 in seed 0,
    2e-4 on 5 (1e-4 chosen); V on 5 in every seed, C2 at 1e-4 on 6, 7, 6 in seeds 0-2: V - C2 is
    -10, -20, -10, V - S +10. H on 10: H - S +60. V's divergence fell 50%, 50%, 20% (seed 2 short)."""
    out, arms = tmp_path, tmp_path / "arms"
    protocol.prepare(tmp_path / "run", out, seeds=[0, 1, 2], v_steps=32, lrs=["1.0e-4", "2.0e-4"])
    (out / "gate.json").write_text(json.dumps({"verdict": {"passed": True}}))
    sharded = lambda right: [1] * right + [0] * (10 - right)  # noqa: E731
    evaluation(arms / "eval" / "s", {"full": [1] * 9 + [0], "sharded": sharded(4)})
    evaluation(arms / "eval" / "h-s0", {"full": [1] * 10, "sharded": sharded(10)})
    evaluation(arms / "eval" / "c2-lr2.0e-4-s0", {"full": [1] * 10, "sharded": sharded(5)})
    for seed, c2, fall in ((0, 6, 0.5), (1, 7, 0.5), (2, 6, 0.2)):
        evaluation(arms / "eval" / f"v-s{seed}", {"full": [1] * 9 + [0], "sharded": sharded(5)})
        evaluation(arms / "eval" / f"c2-lr1.0e-4-s{seed}", {"full": [1] * 9 + [0], "sharded": sharded(c2)})
        (arms / f"v-s{seed}").mkdir()
        (arms / f"v-s{seed}" / "metrics.jsonl").write_text(
            json.dumps({"step": 0, "dev_divergence_per_token": 0.1}) + "\n"
            + "".join(json.dumps({"step": step, "rollout_accuracy": 0.5 if step <= 8 else 1.0,
                                  "premature_answer_rate": 0.25}) + "\n" for step in range(1, 17))
            + json.dumps({"step": 32, "dev_divergence_per_token": 0.1 * (1 - fall)}) + "\n")
    for name in ("s", "v-s0", "v-s1", "v-s2", "c2-lr1.0e-4-s0", "c2-lr1.0e-4-s1", "c2-lr1.0e-4-s2"):
        evaluation(arms / "eval-seen" / name, {"full": [1, 1, 1, 0]})
    assert protocol.main(["decide", "--out", str(out), "--lrs", "1.0e-4", "2.0e-4"]) == 0
    result = json.loads((arms / "decision.json").read_text())
    assert result["rates"] == {"c2": "1.0e-4"} and result["v_minus_c2_by_seed"] == [-10.0, -20.0, -10.0]
    assert result["checks"] == {"V beats C2 in every seed": False, "mean V - C2 >= 3.0": False,
                                "p < 0.05 in >= 2 seeds": False, "V beats S in every seed": True,
                                "P(full) within 2.0 of C2 and S on both sets": True}
    assert not result["v_wins_on_dev"] and result["h_minus_s"] == 60.0
    assert result["v_held_out_fall_by_seed"] == pytest.approx([0.5, 0.5, 0.2])
    level = result["seed_level"]  # mean -13.3, sd 5.77, t(2) 4.303: upper bound +1.0
    assert level["mean"] == pytest.approx(-40 / 3) and level["high"] == pytest.approx(-40 / 3 + 4.303 * 5.7735 / 3 ** 0.5, abs=0.01)
    assert result["negative"]["checks"] == {"the gate passed": True, "H - S >= 5": True,
                                            "V's held-out divergence fell >= 30% in every seed": False,
                                            "seed-level upper bound of V - C2 < 3": True}
    assert not result["negative"]["convincing"]

    assert protocol.main(["report", "--out", str(out), "--lrs", "1.0e-4", "2.0e-4"]) == 0
    report = json.loads((arms / "report.json").read_text())
    assert report["rates"] == {"c2": "1.0e-4", "c1": None}
    assert list(report["pairs"]) == ["V s0 - S", "V s0 - C2 s0", "C2 s0 - S", "V s1 - S", "V s1 - C2 s1", "C2 s1 - S",
                                     "V s2 - S", "V s2 - C2 s2", "C2 s2 - S", "H - S"]
    assert [report["pairs"][f"V s{seed} - C2 s{seed}"]["difference"] for seed in (0, 1, 2)] == [-10.0, -20.0, -10.0]
    assert report["models"]["C2 s0 lr 2.0e-4"]["sharded"] == 50.0 and report["models"]["C2 s0"]["sharded"] == 60.0
    assert "C1 s0 lr 1.0e-4 on B-dev" in report["not_finished"] and "H on the seen dev set" in report["not_finished"]
    printed = capsys.readouterr().out
    assert "V s2's held-out divergence per answer token: step 0 0.1000, step 32 0.0800 (fell 20%" in printed
    assert "V s2's rollouts by steps: 1-8 agree 50.0%, premature 25.0%; 9-16 agree 100.0%, premature 25.0%" in printed
    assert report["settled"]["win"] == {"V beats S in every seed": True, "V beats C2 in every seed": False,
                                        "P(full) within 2 of S and C2 on both sets": True}
    assert report["seed_level"]["V - C2"]["mean"] == pytest.approx(-40 / 3) and report["seed_level"]["V - S"]["high"] == 10.0
    assert "V - C2 over 3 seeds: -13.3 (t interval -27.7 to +1.0)" in printed
    assert "divergence fell less: V s2 20%" in printed and "The convincing negative is out of reach." in printed
    assert "V cannot win by the rule, whatever the arms still to come show." in printed

    (arms / "eval-seen" / "c2-lr1.0e-4-s2" / "conversations.jsonl").write_text("")  # an arm not evaluated
    assert protocol.main(["decide", "--out", str(out), "--lrs", "1.0e-4", "2.0e-4"]) == 2
    assert "c2-lr1.0e-4-s2: this evaluation has not finished" in capsys.readouterr().err


def test_the_figures_so_far_settle_the_checks_no_arm_to_come_can_change():
    """V s0 is 2.4 under S on the seen dev set (the margin is 2): the win fails with V s1's seen run,
    V s2 and every C2 seed unmeasured. An unmeasured seed leaves "in every seed" open, until one loses."""
    def model(full, seen):
        return {"full": full, "seen_full": seen}

    report = {"models": {"S": model(58.4, 88.3), "V s0": model(71.5, 85.9), "V s1": model(69.3, None)},
              "pairs": {"V s0 - S": {"difference": 21.9}, "V s1 - S": {"difference": 12.7}},
              "v_held_out_divergence": {0: {"fall": 0.52}, 1: {"fall": 0.31}}}
    found = protocol.settled(report, [0, 1, 2])
    assert found["win"] == {"V beats S in every seed": None, "V beats C2 in every seed": None,
                            "P(full) within 2 of S and C2 on both sets": False}
    assert found["failing"]["retention"] == ["V s0 seen dev 85.9 vs S 88.3"] and found["v_cannot_win"]
    assert list(found["negative"].values()) == [None] and not found["negative_out_of_reach"]

    report["models"]["V s0"]["seen_full"] = 86.3  # exactly the margin under S: kept
    report["models"]["V s1"]["seen_full"] = 88.0
    report["models"]["V s2"] = model(60.0, 90.0)
    report["pairs"]["V s2 - S"] = {"difference": 0.0}  # a tie is no win
    report["v_held_out_divergence"][2] = {"fall": 0.29}
    found = protocol.settled(report, [0, 1, 2])
    assert found["win"] == {"V beats S in every seed": False, "V beats C2 in every seed": None,
                            "P(full) within 2 of S and C2 on both sets": None}  # C2's half unmeasured
    assert found["failing"] == {"retention": [], "falls": ["V s2 29%"]} and found["negative_out_of_reach"]

    report["models"]["C2 s1"] = model(72.0, 88.0)  # V s1's P(full) on B-dev is 2.7 under it
    report["pairs"]["V s1 - C2 s1"] = {"difference": -2.3}
    found = protocol.settled(report, [0, 1, 2])
    assert found["win"]["V beats C2 in every seed"] is False
    assert found["failing"]["retention"] == ["V s1 B-dev 69.3 vs C2 72.0"]
    assert "- win: V beats C2 in every seed: fails" in protocol.settled_markdown(found)


def test_b_test_is_read_once_after_decide_v_against_c2_at_its_chosen_rate_in_every_seed(tmp_path, capsys):
    """btest.sh refuses to start before decide; its read pairs each V seed with C2 at the rate chosen
    on B-dev (1e-4 here) on B-test. V right on 6 of 10 in both seeds, C2 on 5 and 7: mean V - C2 0."""
    out, arms = tmp_path / "out", tmp_path / "out" / "arms"
    script = protocol.prepare(tmp_path / "run", out, seeds=[0, 1], v_steps=32, lrs=["1.0e-4", "2.0e-4"])
    btest = (script.parent / "btest.sh").read_text()
    evaluated = [line.split()[1] for line in btest.splitlines() if line.startswith("evaluate ")]
    assert evaluated == [f"{arms}/eval-btest/{name}" for name in ("s", "v-s0", "c2-lr$C2_RATE-s0", "v-s1", "c2-lr$C2_RATE-s1")]
    refused = subprocess.run(["bash", str(script.parent / "btest.sh")], capture_output=True, text=True)
    assert refused.returncode == 2 and "B-test is read after decide" in refused.stderr

    sharded = lambda right: [1] * right + [0] * (10 - right)  # noqa: E731
    for lr, right in (("1.0e-4", 6), ("2.0e-4", 5)):
        evaluation(arms / "eval" / f"c2-lr{lr}-s0", {"full": [1] * 10, "sharded": sharded(right)})
    for name, right in (("s", 3), ("v-s0", 6), ("v-s1", 6), ("c2-lr1.0e-4-s0", 5), ("c2-lr1.0e-4-s1", 7)):
        evaluation(arms / "eval-btest" / name, {"full": [1] * 10, "sharded": sharded(right)})
    assert protocol.main(["btest", "--out", str(out), "--seeds", "0", "1", "--lrs", "1.0e-4", "2.0e-4"]) == 0
    read = json.loads((arms / "btest.json").read_text())
    assert read["c2_rate"] == "1.0e-4" and read["v_minus_c2_by_seed"] == [10.0, -10.0] and not read["holds"]
    assert read["pairs"]["V s1 - S"]["difference"] == 30.0
    printed = capsys.readouterr().out
    assert "| V s0 - C2 s0 | 10 | +10.0 (" in printed and "P(full), seen dev" not in printed
    assert "(V - C2 > 0 (mean over seeds)): fails\nV - S over 2 seeds: +30.0 (t interval +30.0 to +30.0)" in printed
    assert "arms/eval-btest/v-s1/conversations.jsonl.gz" in protocol.keep(out, s_model(tmp_path / "s", b"w"), tmp_path / "rec")

    (arms / "eval-btest" / "v-s1" / "conversations.jsonl").write_text("")
    assert protocol.main(["btest", "--out", str(out), "--seeds", "0", "1", "--lrs", "1.0e-4", "2.0e-4"]) == 2
    assert "not finished: V s1 on B-test" in capsys.readouterr().err


def test_the_rule_counts_a_seeds_p_only_when_v_is_the_better_arm():
    def rows(differences, p_value, v_full=80.0):
        return {seed: {"v_c2": {"difference": d, "p_value": p_value}, "v_s": {"difference": 4.0},
                       "full": {"V": v_full, "C2": 80.0, "S": 81.0}, "full_seen": {"V": 90.0, "C2": 90.0, "S": 90.0}}
                for seed, d in enumerate(differences)}

    win = protocol.decide(rows([4.0, 3.0, 5.0], 0.01))
    assert win["v_wins_on_dev"] and all(win["checks"].values()) and win["seed_level"]["mean"] == pytest.approx(4.0)
    loss = protocol.decide(rows([-4.0, -3.0, -5.0], 0.01))  # significant, the wrong way
    assert not loss["checks"]["p < 0.05 in >= 2 seeds"]
    assert not protocol.decide(rows([4.0, 3.0, 5.0], 0.01, v_full=78.9))["v_wins_on_dev"]  # 2.1 under S's P(full)


def test_the_scripts_time_a_commands_cpu_seconds_in_the_main_shell_and_in_a_lane(tmp_path):
    """`timed` reads the waiting shell's children's CPU seconds: in the script and in a `( ... ) &` lane
    (a command substitution's own subshell has no children: read there, every label would be 0)."""

    script = prepared(tmp_path).parent / "pilot.sh"
    helpers = script.read_text().split("\nS=")[0]
    busy = "python -c 'import time; t = time.process_time(); exec(\"while time.process_time() - t < 0.3: pass\")'"
    probe = tmp_path / "probe.sh"
    probe.write_text(f"{helpers}\ntimed main {busy}\n( timed lane {busy} ) &\nwait $!\n")
    subprocess.run(["bash", str(probe)], check=True, timeout=60)
    spent = dict(line.split() for line in (tmp_path / "out" / "arms" / "times.tsv").read_text().splitlines())
    assert set(spent) == {"main", "lane"} and all(float(s) >= 0.25 for s in spent.values()), spent


def s_model(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_records_keep_what_the_figures_are_read_from_and_restore_it_for_the_same_s_only(tmp_path, capsys):
    """The machine is lost: OUT goes, the B files and a rebuilt S come back. What `keep` put in the
    records (finished evaluations, the metrics and weights hashes of runs evaluated in full, the gate,
    the CPU seconds of what will not run again) restores into OUT and the report reads the same
    figures; an unfinished evaluation, a run not yet evaluated, checkpoints and weights are not kept;
    records of one S are refused for another, and a second S's keep."""
    out, records, b = tmp_path / "out", tmp_path / "records", tmp_path / "b"
    b.mkdir()
    s = s_model(tmp_path / "s", b"S's weights")
    arms = out / "arms"
    evaluation(out / "bdev", {"full": [1] * 8 + [0] * 2, "sharded": [1] * 4 + [0] * 6}, instances=b / "dev.jsonl")
    evaluation(arms / "eval" / "s", {"full": [1] * 8 + [0] * 2, "sharded": [1] * 4 + [0] * 6}, instances=b / "dev.jsonl")
    evaluation(arms / "eval" / "v-s0", {"full": [1] * 8 + [0] * 2, "sharded": [1] * 6 + [0] * 4}, instances=b / "dev.jsonl")
    evaluation(arms / "eval" / "h-s0", {"full": [1] * 10, "sharded": [1] * 10}, instances=b / "dev.jsonl")
    (arms / "eval" / "v-s0" / "fingerprint.json").write_text('{"model": "v"}')  # what fic eval resumes by
    half = arms / "eval" / "h-s0" / "conversations.jsonl"
    half.write_text(half.read_text().splitlines(keepends=True)[0])  # H's evaluation not finished
    (arms / "v-s0" / "final").mkdir(parents=True)
    (arms / "v-s0" / "final" / "model.safetensors").write_bytes(b"V's weights")
    (arms / "v-s0" / "weights.sha256").write_text("abc\n")
    (arms / "v-s0" / "metrics.jsonl").write_text(json.dumps({"step": 0, "dev_divergence_per_token": 0.1}) + "\n")
    evaluation(arms / "eval-seen" / "v-s0", {"full": [1, 0]}, instances=b / "seen.jsonl")
    # C2 trained, not evaluated yet: after a loss it trains again, so neither it nor its time is kept
    (arms / "c2-lr1.0e-4-s0").mkdir(parents=True)
    (arms / "c2-lr1.0e-4-s0" / "weights.sha256").write_text("def\n")
    (arms / "c2-lr1.0e-4-s0" / "metrics.jsonl").write_text("{}\n")
    (arms / "c1-lr1.0e-4-s0" / "checkpoints").mkdir(parents=True)  # still training: nothing of it kept
    # the labelling runs again after a loss (its files are not kept): its time too, or it counts twice
    (arms / "times.tsv").write_text("label-self 5\nv-s0 100\ncal-c2-2 3\ncal-c2-22 13\nc2-lr1.0e-4-s0 70\n")

    assert protocol.main(["keep", "--out", str(out), "--s", str(s), "--records", str(records)]) == 0
    kept = sorted(str(p.relative_to(records)) for p in records.rglob("*") if p.is_file())
    assert kept == ["arms/eval-seen/v-s0/config.yaml", "arms/eval-seen/v-s0/conversations.jsonl.gz",
                    "arms/eval/s/config.yaml", "arms/eval/s/conversations.jsonl.gz", "arms/eval/v-s0/config.yaml",
                    "arms/eval/v-s0/conversations.jsonl.gz", "arms/eval/v-s0/fingerprint.json.gz", "arms/times.tsv",
                    "arms/v-s0/metrics.jsonl.gz", "arms/v-s0/weights.sha256", "bdev/config.yaml",
                    "bdev/conversations.jsonl.gz", "s.json"]
    assert (records / "arms" / "times.tsv").read_text() == "v-s0 100\ncal-c2-2 3\ncal-c2-22 13\n"
    assert protocol.keep(out, s, records) == []  # nothing changed: nothing written
    before = protocol.compare(out, {"S": "s", "V": "v-s0"}, [("V", "S")])

    import shutil
    shutil.rmtree(out)
    assert protocol.main(["restore", "--out", str(out), "--s", str(s_model(tmp_path / "other", b"other")),
                          "--records", str(records)]) == 2
    assert "not the same model" in capsys.readouterr().err and not out.exists()
    assert protocol.main(["restore", "--out", str(out), "--s", str(s), "--records", str(records)]) == 0
    assert protocol.compare(out, {"S": "s", "V": "v-s0"}, [("V", "S")]) == before
    assert before["pairs"]["V - S"]["difference"] == 20.0
    assert (arms / "eval" / "v-s0" / "fingerprint.json").read_text() == '{"model": "v"}'
    assert (arms / "v-s0" / "weights.sha256").read_text() == "abc\n" and not (arms / "v-s0" / "final").exists()
    assert protocol.main(["finished", str(arms / "eval" / "v-s0")]) == 0
    assert protocol.main(["finished", str(arms / "eval" / "h-s0")]) == 1

    with pytest.raises(FicError, match="another S"):
        protocol.keep(out, s_model(tmp_path / "other", b"other"), records)


def test_a_finished_step_is_passed_over_even_when_its_weights_are_gone(tmp_path):
    """The scripts' `train` writes the weights hash when a run ends and passes a run with one over (a
    restored run has the hash, not the weights); `evaluate` plays nothing into a whole log. `fic` is a
    stand-in that records its arguments and writes a run's weights."""

    script = prepared(tmp_path).parent / "arms.sh"
    helpers = script.read_text().split("\nS=")[0]
    arms = tmp_path / "out" / "arms"
    evaluation(arms / "eval" / "v-s0", {"full": [1, 0], "sharded": [0, 1]})
    evaluation(arms / "eval" / "v-s1", {"full": [1, 0], "sharded": [0, 1]})
    (arms / "eval" / "v-s1" / "conversations.jsonl").write_text("")
    (arms / "v-s0").mkdir()
    (arms / "v-s0" / "weights.sha256").write_text("restored\n")
    calls = tmp_path / "calls"
    probe = tmp_path / "probe.sh"
    probe.write_text(f'{helpers}\nfic() {{ echo "$*" >> {calls}; local out=${{@: -1}}; out=${{out#out=}}; '
                     f'mkdir -p "$out/final"; echo weights > "$out/final/model.safetensors"; }}\n'
                     f'train v-s0 {arms}/v-s0 fic train vasd out={arms}/v-s0\n'
                     f'train v-s1 {arms}/v-s1 fic train vasd out={arms}/v-s1\n'
                     f'evaluate {arms}/eval/v-s0 fic eval out={arms}/eval/v-s0\n'
                     f'evaluate {arms}/eval/v-s1 fic eval out={arms}/eval/v-s1\n')
    subprocess.run(["bash", str(probe)], check=True, timeout=60)
    assert calls.read_text().splitlines() == [f"train vasd out={arms}/v-s1", f"eval out={arms}/eval/v-s1"]
    import hashlib
    assert (arms / "v-s1" / "weights.sha256").read_text().strip() == hashlib.sha256(b"weights\n").hexdigest()
    assert [line.split()[0] for line in (arms / "times.tsv").read_text().splitlines()] == ["v-s1"]
