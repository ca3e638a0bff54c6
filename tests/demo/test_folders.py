"""The demo deletes only folders it made, writes no stage folder through a link, and refuses a
stage `out` it would not honour (issue 56, items 3 and 4). No model runs: the refusals come
before any training or evaluation, which are stand-ins that fail the test if called."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fic.cli.main import main
from fic.core import files
from fic.core.errors import FicError
from fic.demo import run

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m-instruct"


def never(*args, **kwargs):
    raise AssertionError("the demo went on past a folder it should have refused")


@pytest.fixture
def demo(tmp_path, monkeypatch):
    monkeypatch.setattr(run.train_sft, "train", never)
    monkeypatch.setattr(run, "evaluate", never)
    return run.load_demo(str(RECIPES), [f"out={tmp_path / 'demo'}"])


def test_a_users_folder_in_a_stages_place_is_refused_not_deleted(demo):
    warmup = Path(demo.out) / "warmup"
    warmup.mkdir(parents=True)
    (warmup / "notes.txt").write_text("mine")
    with pytest.raises(FicError, match="is in the way: FiC did not make this folder") as err:
        run.stage_warmup(demo, progress=False)
    assert err.value.path == str(warmup) and (warmup / "notes.txt").read_text() == "mine"
    with pytest.raises(FicError, match="is in the way") as err:  # nor does --from delete it
        run.run_demo(demo, start_from="warmup", say=lambda line: None)
    assert (warmup / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("stage", ["sft", "vasd", "control"])
def test_every_trained_stage_refuses_a_users_folder_in_its_place(demo, stage, monkeypatch):
    monkeypatch.setattr(run.train_vasd, "train", never)
    monkeypatch.setattr(run, "control_steps", lambda cfg: 1)  # it reads the earlier stages' figures
    monkeypatch.setattr(run, "model_of", lambda cfg, stage: Path(demo.out) / "a model")
    folder = Path(demo.out) / stage
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(FicError, match="is in the way: FiC did not make this folder") as err:
        getattr(run, f"stage_{stage}")(demo, progress=False)
    assert err.value.path == str(folder) and (folder / "notes.txt").read_text() == "mine"


def test_the_demos_own_stage_folder_of_a_killed_run_is_started_over(demo, monkeypatch):
    warmup = Path(demo.out) / "warmup"
    files.make_folder(warmup, token=run.demo_token(demo))  # as the demo made it, before it was killed
    (warmup / "metrics.jsonl").write_text("{}\n")
    seen = []

    def train(cfg):
        seen.append(sorted(p.name for p in warmup.iterdir()))
        (warmup / "checkpoints").mkdir()
        return {"steps": 1, "final_loss": 0.0, "model_dir": warmup / "final"}

    monkeypatch.setattr(run.train_sft, "train", train)
    run.stage_warmup(demo, progress=False)
    assert seen == [[files.RUN_MARKER]]  # emptied and marked again; its checkpoints removed after
    assert not (warmup / "checkpoints").exists()


def test_a_link_at_a_stage_folder_is_refused_and_its_target_untouched(demo, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("mine")
    Path(demo.out).mkdir()
    os.symlink(elsewhere, Path(demo.out) / "warmup")
    with pytest.raises(FicError, match="is a symbolic link; FiC does not write through links") as err:
        run.stage_warmup(demo, progress=False)
    assert err.value.path == str(Path(demo.out) / "warmup")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["notes.txt"]


def test_a_link_above_an_evaluations_out_folder_is_refused_and_its_target_untouched(demo, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(demo.out).mkdir()
    os.symlink(elsewhere, Path(demo.out) / "eval-start")  # the parent of eval-start/test, the evaluation's out
    with pytest.raises(FicError, match="symbolic link") as err:
        run.evaluate_stage(demo, "start", Path(demo.out) / "warmup" / "final", progress=False)
    assert err.value.path == str(Path(demo.out) / "eval-start")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("key", ["warmup.out", "vasd.out", "sft_data.out", "eval.out"])
def test_a_stage_out_the_demo_would_not_honour_is_refused_in_the_dry_run(key, tmp_path, capsys):
    assert main(["demo", "--recipes", str(RECIPES), f"out={tmp_path / 'demo'}", f"{key}={tmp_path / 'other'}",
                 "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"field '{key}'" in err and "set out= to move the whole demo" in err
    assert not (tmp_path / "other").exists() and not (tmp_path / "demo").exists()
    # where the demo writes it anyway is no override to refuse: the shipped demo.yaml says so for every stage
    wired = str(run.wired_outs(run.load_demo(str(RECIPES), [f"out={tmp_path / 'demo'}"]))[key])
    assert main(["demo", "--recipes", str(RECIPES), f"out={tmp_path / 'demo'}", f"{key}={wired}", "--dry-run"]) == 0


@pytest.mark.parametrize("folder", ["data", "warmup", "eval-start", "sft", "control", "eval-control"])
def test_a_users_folder_in_a_stages_place_stops_the_dry_run_and_the_run_before_any_stage(folder, tmp_path, capsys):
    """Refused before the stages ahead of it run (the data stage, hours of training), in --dry-run too."""
    out = tmp_path / "demo"
    (out / folder).mkdir(parents=True)
    (out / folder / "notes.txt").write_text("mine")
    for dry in (["--dry-run"], []):
        assert main(["demo", "--recipes", str(RECIPES), f"out={out}", *dry]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(out / folder) in err and "is in the way" in err
    assert sorted(p.name for p in out.iterdir()) == [folder]  # nothing made beside it, nothing in it
    assert [p.name for p in (out / folder).iterdir()] == ["notes.txt"]


def test_a_link_in_a_stages_place_stops_the_dry_run(demo, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(demo.out).mkdir()
    os.symlink(elsewhere, Path(demo.out) / "eval-sft")
    assert main(["demo", "--recipes", str(RECIPES), f"out={demo.out}", "--dry-run"]) == 2
    assert "eval-sft: is a symbolic link" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_the_data_stage_writes_nothing_into_a_users_data_folder(demo, monkeypatch):
    monkeypatch.setattr(run, "prepare_model", never)
    monkeypatch.setattr(run, "load_source", never)
    data = Path(demo.out) / "data"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text("my own train split\n")
    with pytest.raises(FicError, match="is in the way") as err:
        run.stage_data(demo, progress=False)
    assert err.value.path == str(data) and [p.name for p in data.iterdir()] == ["train.jsonl"]
    assert (data / "train.jsonl").read_text() == "my own train split\n"


def test_an_evaluation_writes_nothing_into_a_users_eval_folder(demo):
    theirs = Path(demo.out) / "eval-start"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(FicError, match="is in the way") as err:
        run.evaluate_stage(demo, "start", Path(demo.out) / "warmup" / "final", progress=False)
    assert err.value.path == str(theirs) and [p.name for p in theirs.iterdir()] == ["notes.txt"]
    # nor into a split folder of the user's below the demo's own eval folder
    (theirs / "notes.txt").unlink()
    files.own_folder(theirs, run.demo_token(demo))  # empty now: the demo takes it
    split = theirs / "test"
    split.mkdir()
    (split / "conversations.jsonl").write_text("mine\n")
    with pytest.raises(FicError, match="is in the way") as err:
        run.evaluate_stage(demo, "start", Path(demo.out) / "warmup" / "final", progress=False)
    assert err.value.path == str(split) and (split / "conversations.jsonl").read_text() == "mine\n"


def test_a_trained_stage_resumes_only_its_own_killed_run(demo):
    """A folder of the user's holding complete checkpoints in a stage's place is not resumed into."""
    step = Path(demo.out) / "warmup" / "checkpoints" / "step-1"
    step.mkdir(parents=True)
    (step / "complete").write_text("theirs\n")
    with pytest.raises(FicError, match="is in the way") as err:
        run.stage_warmup(demo, progress=False)
    assert err.value.path == str(Path(demo.out) / "warmup")
    assert (step / "complete").read_text() == "theirs\n"
