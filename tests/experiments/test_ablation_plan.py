"""`python experiments/ablation.py --dry-run`: the ablation's runs, what is left of them, and its estimate;
its settings file and the overrides a demo stage's process is given."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import ablation
import pytest
from ablation import check_variants, load, vasd_config

from fic.cli.main import main

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m-instruct"
VARIANTS = "ablation.variants={a: [], b: [terms.labels.weight=1.0, train.max_steps=64]}"


def dry_run(capsys, out: Path, *overrides: str) -> str:
    assert ablation.main(["--recipes", str(RECIPES), "--dry-run", f"out={out}", VARIANTS, "ablation.seeds=[0,1]",
                          *overrides]) == 0
    return capsys.readouterr().out.strip().splitlines()[-2:]


def minutes(line: str) -> int:
    return int(re.search(r"about (\d+) min", line).group(1))


def test_the_ablation_dry_run_lists_its_runs_and_prices_only_those_left(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FIC_CPU_FLAGS", "amx_bf16")  # the reference machine's CPU: its figures price the plan
    out = tmp_path / "demo"
    plan, estimate = dry_run(capsys, out, "data.dev=96")  # 192 dev conversations a run, as finished() records
    assert plan.startswith("experiments/ablation.py: ")  # not the demo's own plan
    assert "2 variant(s) (a, b) x seeds 0, 1, the equal-compute control per seed" in plan
    assert "dev split (96 instances, full and sharded, float32)" in plan
    assert "runs left: sft, a, b, control, a@1, b@1, control@1;" in plan
    assert "stages first: data, warmup, sft" in plan
    assert "reference machine figures" in estimate
    assert "6 training run(s)" in estimate and "7 dev evaluation(s)" in estimate
    before = minutes(estimate)

    finished(out, trained={"a": 320.0}, evaluated={"sft": 192.0})
    plan, estimate = dry_run(capsys, out, "data.dev=96")
    assert "runs left: a, b, control, a@1, b@1, control@1 (done before: sft);" in plan
    # what finished here prices the rest: 10 s a VASD step (a: 32 steps in 320 s), 1 s a dev conversation
    assert "(measured here figures)" in estimate
    # b 64 steps (10.7 min), a 32 (5.3), each control their mean (8.0): 42.7 min; 6 x 192 conversations
    assert "5 training run(s) 43 min" in estimate and "6 dev evaluation(s) of about 3 min each" in estimate
    assert minutes(estimate) < before


def finished(out: Path, trained: dict[str, float], evaluated: dict[str, float]) -> None:
    """The markers finished ablation runs leave: a training run's seconds, a dev evaluation's."""
    for key, seconds in trained.items():
        (out / "ablation" / key / "train").mkdir(parents=True)
        (out / "ablation" / key / "train" / "trained.json").write_text(json.dumps({"seconds": seconds}))
    for key, seconds in evaluated.items():
        (out / "ablation" / key / "dev").mkdir(parents=True)
        (out / "ablation" / key / "dev" / "metrics.json").write_text("{}")
        (out / "ablation" / key / "dev" / "evaluated.json").write_text(
            json.dumps({"seconds": seconds, "conversations": 192}))


def test_a_variants_own_steps_price_it_and_settings_with_no_figures_are_said(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FIC_CPU_FLAGS", "amx_bf16")
    _, estimate = dry_run(capsys, tmp_path / "d", "ablation.seeds=[0]", "ablation.control=false",
                          "ablation.variants={a: []}")
    _, longer = dry_run(capsys, tmp_path / "d", "ablation.seeds=[0]", "ablation.control=false",
                        "ablation.variants={a: [train.max_steps=64]}")
    one = re.search(r"1 training run\(s\) (\d+) min", estimate).group(1)
    two = re.search(r"1 training run\(s\) (\d+) min", longer).group(1)
    assert abs(int(two) - 2 * int(one)) <= 1  # 64 steps against the recipe's 32
    _, unknown = dry_run(capsys, tmp_path / "d", "vasd.train.micro_batch_size=8")
    assert unknown == "[ablation] estimate: no figures for these settings yet"


def test_a_cpu_without_fast_bf16_is_not_priced_from_the_reference_machine(tmp_path, capsys, monkeypatch):
    """The reference figures are bf16 on AMX; a CPU without it computes in float32, several times
    slower: the plan says so instead of printing the reference machine's minutes."""
    monkeypatch.setenv("FIC_CPU_FLAGS", "avx2 fma")
    _, estimate = dry_run(capsys, tmp_path / "d")
    assert estimate.startswith("[ablation] estimate: no figures for these settings yet; this CPU has no fast "
                               "bfloat16") and "min" not in estimate
    assert main(["demo", "--recipes", str(RECIPES), "--dry-run", f"out={tmp_path / 'd'}"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]  # the demo never prices from the reference list
    # (what follows is the machine's load, when it has some)
    assert line.startswith("[demo] estimate: no figures for these settings yet (they will come from the first stages)")
    assert "min for" not in line
    # once stage 1 and a first arm have run here, their own figures price the rest
    out = tmp_path / "d"
    (out / "stages").mkdir(parents=True)
    for stage in ("data", "warmup", "sft"):
        (out / "stages" / f"{stage}.json").write_text("{}")
    finished(out, trained={"a": 320.0}, evaluated={"sft": 192.0})
    _, estimate = dry_run(capsys, out)
    assert estimate.startswith("[ablation] estimate: about ") and "(measured here figures)" in estimate


def test_variants_that_come_to_the_same_settings_are_refused_before_anything_runs(tmp_path, capsys):
    # demo.yaml's vasd section already has the full-view teacher, so [] and [teacher.view=full] are one run
    code = ablation.main(["--recipes", str(RECIPES), "--dry-run", f"out={tmp_path / 'demo'}",
                          "ablation.variants={plain: [], labels: [teacher.view=full]}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "field 'ablation.variants'" in err and "variants plain and labels come to the same vasd settings" in err
    assert "Traceback" not in err and not (tmp_path / "demo").exists()


def test_the_shipped_variants_are_each_their_own_run():
    cfg = load(str(RECIPES), None, [])
    check_variants(cfg)  # raises where two shipped variants are one run under two names
    configs = {name: vasd_config(cfg, list(o), Path("train")) for name, o in cfg.ablation.variants.items()}
    assert configs["vasd-full-view"].teacher.view == "full" != configs["vasd-hinted"].teacher.view  # the paper's VASD
    assert configs["vasd-labels"].terms.labels.weight == 1.0 and configs["vasd-hinted"].terms.labels.weight == 0
    assert configs["corrections"].loss.weight == 0 == configs["reward"].loss.weight  # no teacher pass
    assert configs["reward"].terms.reward.weight == 1.0 and configs["reward"].rollout.temperature > 0
    assert configs["reward"].terms.reward.unanswered_reward < 0 and configs["reward"].terms.reference.weight > 0
    assert configs["reward"].anchor.share > 0  # beside the anchor: the demo's `both`
    # 16 rollouts a step, the arm measured on dev, in the student micro-batches that keep it under 8 GB
    assert (configs["reward"].train.micro_batch_size, configs["reward"].train.grad_accum_steps) == (2, 8)


def test_a_start_that_is_not_a_saved_model_is_refused_before_anything_runs(tmp_path, capsys):
    code = ablation.main(["--recipes", str(RECIPES), "--dry-run", f"out={tmp_path / 'demo'}",
                          f"ablation.start={tmp_path / 'nowhere'}"])
    err = capsys.readouterr().err
    assert code == 2 and "field 'ablation.start'" in err and "no saved model (config.json)" in err
    assert "Traceback" not in err and not (tmp_path / "demo").exists()


def test_the_test_table_is_priced_by_what_it_has_left_to_play(tmp_path, capsys, monkeypatch):
    """ablation.test: before the choice, the start, stage 1, the control and one choice each play
    test and test-unseen (the start's test also in concat); once the table has chosen the control,
    the control is the choice; a finished evaluation is not priced again."""
    from ablation import test_conversations_left

    out = tmp_path / "demo"
    settings = [f"out={out}", VARIANTS, "data.test=10", "data.test_unseen=4", "ablation.test=true"]
    cfg = load(str(RECIPES), None, settings)
    # 4 models x (2 x 10 + 2 x 4), and the start's concat view of test
    assert test_conversations_left(cfg) == 4 * 28 + 10
    (out / "ablation").mkdir(parents=True)
    (out / "ablation" / "ablation.json").write_text(json.dumps({"choice": {"choice": "control"}}))
    assert test_conversations_left(cfg) == 3 * 28 + 10
    (out / "ablation" / "start" / "test").mkdir(parents=True)
    (out / "ablation" / "start" / "test" / "metrics.json").write_text("{}")
    assert test_conversations_left(cfg) == 3 * 28 - 20
    assert test_conversations_left(load(str(RECIPES), None, settings[:-1])) == 0  # off: nothing to play

    monkeypatch.setenv("FIC_CPU_FLAGS", "amx_bf16")
    finished(out, trained={"a": 320.0}, evaluated={"sft": 192.0})  # 1 s a conversation
    _, estimate = dry_run(capsys, out, "data.test=10", "data.test_unseen=4", "ablation.test=true")
    assert "the test table 1 min" in estimate  # (3 x 28 - 20) conversations at 1 s


def test_test_runs_that_name_no_variant_are_refused_before_anything_runs(tmp_path, capsys):
    code = ablation.main(["--recipes", str(RECIPES), "--dry-run", f"out={tmp_path / 'demo'}", VARIANTS,
                          "ablation.test=true", "ablation.test_runs=[a, c]"])
    err = capsys.readouterr().err
    assert code == 2 and "field 'ablation.test_runs'" in err and "names c, not a variant" in err
    assert "Traceback" not in err and not (tmp_path / "demo").exists()


def test_the_ablations_rule_picks_a_variant_only_when_it_beats_the_control_in_every_seed():
    from ablation import choose

    def row(p, better, worse, p_value, full=88.0):
        return {"P_sharded": p, "P_full": full, "vs_control": {"better": better, "worse": worse, "p_value": p_value}}

    rows = {"a": row(60, 30, 5, 1e-5), "a@1": row(58, 28, 6, 1e-4), "b": row(70, 40, 2, 1e-9),
            "b@1": row(40, 10, 12, 0.8), "control": {"P_full": 89.0}, "control@1": {"P_full": 90.5}}
    assert choose(rows, [0, 1], ["a", "b"])["choice"] == "a"  # b won one seed only
    # a P(full) more than max_full_drop below its seed's control's in any seed is not chosen, and said
    dropped = choose(rows, [0, 1], ["a", "b"], max_full_drop=2.0)  # a: 1.0 and 2.5 points below
    assert dropped["choice"] == "control" and "a (P(full) 2.5 points below the control's)" in dropped["why"]
    kept = choose(rows | {"a@1": row(58, 28, 6, 1e-4, full=88.5)}, [0, 1], ["a", "b"], max_full_drop=2.0)
    assert kept["choice"] == "a"  # 2.0 below: within the bound
    rows["a@1"] = row(58, 28, 6, 0.07)
    chosen = choose(rows, [0, 1], ["a", "b"])
    assert chosen["choice"] == "control" and "no variant beat" in chosen["why"]


def test_the_seeds_pooled_sum_each_seeds_wins_and_losses_into_one_exact_sign_test():
    from ablation import pooled_vs

    def row(better, worse, tied=0, against="control"):
        return {f"vs_{against}": {"better": better, "worse": worse, "tied": tied, "p_value": 1.0}}

    rows = {"a": row(6, 2, 10), "a@1": row(3, 1, 5), "b": row(4, 4), "control": {}, "control@1": {}}
    pooled = pooled_vs(rows, [0, 1], ["a", "b"])
    assert set(pooled) == {"a"}  # b has no seed-1 run: nothing to pool
    assert pooled["a"]["better"] == 9 and pooled["a"]["worse"] == 3 and pooled["a"]["tied"] == 15
    assert pooled["a"]["p_value"] == pytest.approx(2 * sum(math.comb(12, i) for i in range(4)) / 2 ** 12)
    # against stage 1 as well: the control's own runs too
    rows = {"a": row(5, 1, against="sft"), "a@1": row(2, 2, against="sft"), "control": row(1, 4, against="sft"),
            "control@1": row(0, 3, against="sft")}
    against_sft = pooled_vs(rows, [0, 1], ["a", "control"], "sft")
    assert [against_sft[k]["better"] for k in ("a", "control")] == [7, 1] and against_sft["control"]["worse"] == 7


def test_the_power_sentence_is_computed_from_the_tables_n_seeds_and_discordance():
    from ablation import POWER_GAINS, power_text

    from fic.core.stats import detectable_gain, sign_test_power

    # two runs against their controls: 50 and 70 of 200 instances differ, a mean share of 0.3
    rows = {"sft": {}, "a": {"vs_control": {"better": 30, "worse": 20}}, "a@1": {"vs_control": {"better": 40, "worse": 30}}}
    text = power_text(rows, 200, 2)
    powers = " / ".join(f"{sign_test_power(200, 0.3, g, 2):.0%}" for g in POWER_GAINS)
    assert text.startswith("Power: with N = 200 and 2 seed(s), where 30% of instances differ")
    assert f"points {powers} of the time; 80% needs a true gain of about {detectable_gain(200, 0.3, 2):g} points" in text
    assert power_text({"sft": {}}, 200, 2) is None  # nothing compared yet


def test_the_ablations_settings_file_is_read_and_the_command_line_wins(tmp_path, capsys):
    """--config holds the `ablation` keys (checked as that file's); key=value overrides either the
    demo's settings or the ablation's, and a demo stage's own process is given only the demo's."""
    settings = tmp_path / "ablation.yaml"
    settings.write_text("variants: {a: [], b: [terms.labels.weight=1.0]}\nseeds: [0, 1]\ntest: true\n")
    cfg = load(str(RECIPES), str(settings), ["ablation.seeds=[0,2]", "data.dev=96"])
    assert list(cfg.ablation.variants) == ["a", "b"] and cfg.ablation.test and cfg.data.dev == 96
    assert cfg.ablation.seeds == [0, 2] and cfg.ablation.control  # the command line wins; the rest keeps its default
    overrides = ["data.dev=96", "ablation.seeds=[0,2]", "ablation=other.yaml", "out=runs/x"]
    assert ablation.demo_overrides(overrides) == ["data.dev=96", "out=runs/x"]

    (tmp_path / "bad.yaml").write_text("variant: {a: []}\n")
    assert ablation.main(["--recipes", str(RECIPES), "--config", str(tmp_path / "bad.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "field 'ablation.variant'" in err and "unknown key" in err
    assert ablation.main(["--recipes", str(RECIPES), "--config", str(tmp_path / "settings.txt"), "--dry-run"]) == 2
    assert "field '--config'" in capsys.readouterr().err


def test_fic_demo_ablate_says_where_the_ablation_went(capsys):
    assert main(["demo", "--ablate", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "python experiments/ablation.py" in err and "Traceback" not in err


def test_the_reference_figures_price_only_the_shipped_settings_on_a_machine_like_it(monkeypatch):
    import reference_costs

    from fic.demo import costs
    from fic.demo.run import STAGES, load_demo

    shipped = load_demo(str(RECIPES), [])
    monkeypatch.setenv("FIC_CPU_FLAGS", "amx_bf16")  # the reference machine's CPU
    markers = reference_costs.reference_markers(shipped, shipped)
    planned = {stage: costs.estimate(shipped, stage, markers) for stage in STAGES[:-1]}
    assert all(c is not None and c["source"].startswith("reference machine") for c in planned.values())
    assert costs.unit_cost("vasd", markers)["seconds"] == reference_costs.REFERENCE["vasd"]["seconds"]
    assert costs.unit_cost("sft", markers)["seconds"] == pytest.approx(reference_costs.REFERENCE["sft"]["seconds"])
    faster = load_demo(str(RECIPES), ["vasd.train.micro_batch_size=8"])
    assert costs.estimate(faster, "vasd", reference_costs.reference_markers(faster, shipped)) is None  # not measured
    monkeypatch.setenv("FIC_CPU_FLAGS", "avx2 fma")
    assert reference_costs.reference_markers(shipped, shipped) == {}
