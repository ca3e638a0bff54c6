"""Evaluation problems never in the training data: fic.data.splits and the SFT corpus's `exclude`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.files import write_jsonl
from fic.core.records import read_records
from fic.corpus.build import SFTDataConfig, build_corpus, load_instances
from fic.data.sources import load_source
from fic.data.splits import ExcludeSection, exclude_instances, normalise
from fic.evaluation.evaluate import EvalConfig
from fic.evaluation.evaluate import load_instances as eval_instances

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes" / "smollm2-135m-instruct"


def eval_recipe(tmp_path, seed=0, limit=6, name="eval.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"model": {"model": "m"}, "views": ["full", "sharded"], "out": str(tmp_path / "o"),
                                    "data": {"source": "reasoning-gym:gsm_symbolic", "limit": limit, "seed": seed}}))
    return path


def test_two_seeds_of_a_generator_overlap_after_a_shift_and_the_exclusion_finds_it(tmp_path):
    # reasoning-gym builds problem i from seed + i: seed 5's problems 0..4 are seed 0's problems 5..9.
    evaluation = tmp_path / "eval.jsonl"
    write_jsonl(evaluation, [i.to_dict() for i in load_source("reasoning-gym:chain_sum", limit=10, seed=0)])
    training = load_source("reasoning-gym:chain_sum", limit=20, seed=5)
    assert not {i.task_id for i in training} & {r["task_id"] for r in read_records(evaluation)}  # ids differ
    kept, report = exclude_instances(training, ExcludeSection(sources=[f"jsonl:{evaluation}"]))
    assert report["overlap"] == {"task_id": 0, "prompt": 5, "template": 0} and report["dropped"] == 5
    assert report["evaluation_instances"] == 10
    assert [i.task_id for i in kept] == [f"reasoning-gym/chain_sum/5/{i}" for i in range(5, 20)]
    with pytest.raises(FicError, match="reasoning-gym/chain_sum/5/0.*same prompt"):
        exclude_instances(training, ExcludeSection(sources=[f"jsonl:{evaluation}"], on_overlap="refuse"))


def test_prompts_match_whatever_their_spacing_case_and_punctuation():
    assert normalise("Tom has 3.5 apples!  How MANY?") == normalise("tom has 3.5 apples, how many") \
        == "tom has 3.5 apples how many"


def test_an_eval_recipe_names_exactly_the_instances_it_evaluates(tmp_path):
    recipe = eval_recipe(tmp_path)
    evaluated, _ = eval_instances(load_config(EvalConfig, recipe))
    training = load_source("reasoning-gym:gsm_symbolic", limit=30, seed=0)
    kept, report = exclude_instances(training, ExcludeSection(sources=[str(recipe)]))
    assert report["dropped"] == report["overlap"]["task_id"] == len(evaluated) >= 4
    assert not {i.task_id for i in kept} & {i.task_id for i in evaluated} and len(kept) == 30 - len(evaluated)
    # An eval run folder names the same instances through its config.yaml.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(recipe.read_text())
    assert exclude_instances(training, ExcludeSection(sources=[str(run)]))[1]["dropped"] == len(evaluated)


@pytest.mark.parametrize("spec, message", [
    ("reasoning-gym:gsm_symbolic", "seed and limit"),
    ("{tmp}", "config.yaml"),
    ("jsonl:{tmp}/missing.jsonl", "file not found"),
])
def test_an_exclusion_source_that_names_no_instances_is_an_error(spec, message, tmp_path):
    with pytest.raises(FicError, match=message):
        exclude_instances([], ExcludeSection(sources=[spec.format(tmp=tmp_path)]))


def test_holding_out_templates_leaves_only_unseen_problem_shapes(tmp_path):
    recipe = eval_recipe(tmp_path, seed=1000, limit=8)
    evaluated, _ = eval_instances(load_config(EvalConfig, recipe))
    shapes = {i.fields["template"] for i in evaluated}
    assert all(re.fullmatch(r"gsm_symbolic/\d+", shape) for shape in shapes)
    training = load_source("reasoning-gym:gsm_symbolic", limit=200, seed=0)
    same_shape = [i for i in training if i.fields["template"] in shapes]
    assert same_shape  # 200 problems of about 85 templates share some with the evaluation
    kept, report = exclude_instances(training, ExcludeSection(sources=[str(recipe)], templates=True))
    assert not {i.fields["template"] for i in kept} & shapes
    assert report["overlap"]["template"] == len(same_shape) and report["templates_held_out"] == sorted(shapes)
    with pytest.raises(FicError, match="records its template"):
        chain = tmp_path / "chain.jsonl"
        write_jsonl(chain, [i.to_dict() for i in load_source("reasoning-gym:chain_sum", limit=3)])
        exclude_instances(training, ExcludeSection(sources=[f"jsonl:{chain}"], templates=True))


def test_the_sft_corpus_drops_evaluation_problems_and_its_card_says_how_many(tmp_path):
    recipe = eval_recipe(tmp_path)
    evaluated = {i.task_id for i in eval_instances(load_config(EvalConfig, recipe))[0]}
    out = tmp_path / "corpus.jsonl"
    info = build_corpus(load_config(SFTDataConfig, None, ["data.source=reasoning-gym:gsm_symbolic", "data.limit=20", f"out={out}",
                                                          f"exclude.sources=[{recipe}]"]), progress=False)
    assert info["evaluation_excluded"]["dropped"] == info["evaluation_excluded"]["overlap"]["task_id"] == len(evaluated)
    assert info["sources"][0]["dropped"]["an evaluation problem (same task id)"] == len(evaluated)
    assert not {r["task_id"] for r in read_records(out)} & evaluated
    card = (tmp_path / "corpus.card.md").read_text()
    assert f"overlap found and dropped: {len(evaluated)}" in card and str(recipe) in card
    with pytest.raises(FicError, match="evaluation problem"):
        build_corpus(load_config(SFTDataConfig, None, ["data.source=reasoning-gym:gsm_symbolic", "data.limit=20", f"out={out}",
                                                       f"exclude.sources=[{recipe}]", "exclude.on_overlap=refuse"]),
                     progress=False)


def test_the_shipped_recipes_train_and_evaluate_on_disjoint_problems(monkeypatch):
    """By construction: the eval recipes generate from a seed far past the corpus's seeds, and the
    corpus recipe names them under `exclude`; the overlap found is 0."""
    monkeypatch.chdir(REPO)
    cfg = load_config(SFTDataConfig, RECIPES / "sft-data.yaml")
    evaluations = [load_config(EvalConfig, path) for path in cfg.exclude.sources]
    assert {str(RECIPES.relative_to(REPO) / name) for name in ("eval.yaml", "eval-lic-protocol.yaml")} \
        <= set(cfg.exclude.sources)
    for evaluation in evaluations:  # the generated seeds seed..seed+limit-1 do not meet the corpus's
        assert evaluation.data.source == ["reasoning-gym:gsm_symbolic"]
        assert evaluation.data.seed >= cfg.data.seed + cfg.data.limit or \
            evaluation.data.seed + evaluation.data.limit <= cfg.data.seed
    instances, sources = load_instances(cfg)
    assert sources[0]["evaluation_overlap"] == {"task_id": 0, "prompt": 0, "template": 0}
    assert len(instances) > 900
    card_overlap = json.loads(json.dumps(sources[0]["evaluation_overlap"]))
    assert sum(card_overlap.values()) == 0


def test_a_deep_eval_recipe_named_in_exclude_sources_is_one_line(tmp_path):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text("data:\n  source: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(FicError, match="nested more than 64 levels deep") as err:
        exclude_instances([], ExcludeSection(sources=[str(recipe)]))
    assert str(recipe) in str(err.value)
