"""`--dry-run` is as strict as the start of the real run: a model folder that looks local and is
not there is one line at once (no hub lookup), an out folder that cannot be written or holds another
run is refused, `fic demo --from` is honoured and checked, every task's scoring extras are checked
before any model loads, and a failed run never names a folder it removed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import transformers
from scripted import FunctionBackend

from fic.cli.main import main
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.model import is_hub_id
from fic.demo.run import STAGES
from fic.evaluation.evaluate import EvalConfig, evaluate

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "smollm2-135m-instruct"
MATH = {"task_id": "t1", "task": "math", "question": "Ann has 3 apples. She buys 4 more. How many now?",
        "answer": "3+4=7\n#### 7", "shards": [{"shard_id": 1, "shard": "How many apples does Ann have now?"},
                                              {"shard_id": 2, "shard": "She had 3 apples."},
                                              {"shard_id": 3, "shard": "She buys 4 more."}]}
TRANSLATION = {"task_id": "de-1", "task": "translation", "document_de": "Der Hund schläft.\nDie Katze spielt.",
               "document_en": "The dog sleeps.\nThe cat plays.",
               "shards": [{"shard_id": 1, "shard": "Der Hund schläft."}, {"shard_id": 2, "shard": "Die Katze spielt."}]}


@pytest.fixture
def nothing_loads(monkeypatch):
    """Any attempt to load a tokenizer or weights (a hub lookup included) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a tokenizer or model was loaded")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def jsonl(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


# --------------------------------------------------------------------------- the model folder

def test_a_path_whose_first_part_is_a_local_folder_is_no_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_id("Qwen/Qwen3-0.6B")
    (tmp_path / "Qwen").mkdir()
    assert not is_hub_id("Qwen/Qwen3-0.6B")
    for local in ("./org/name", "/org/name", "~/org-name", "runs/sft/final", "org/name/more"):
        assert not is_hub_id(local), local


@pytest.mark.parametrize("model", ["./no-such-model", "/no/such/model", "~/no-such-fic-model", "runs/sft/final",
                                   "models/smollm2-135m-instruc"])
@pytest.mark.parametrize("dry", [True, False])
def test_a_local_looking_model_that_is_not_there_is_one_line_at_once(model, dry, tmp_path, monkeypatch, capsys,
                                                                     nothing_loads):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()  # `models/...` is then a local path, mistyped, not a hub id
    data = jsonl(tmp_path / "d.jsonl", MATH)
    err = one_line_error(capsys, ["eval", f"model.model={model}", f"data.source=jsonl:{data}", "views=[full]",
                                  f"out={tmp_path / 'run'}", *(["--dry-run"] if dry else [])])
    assert "field 'model.model': model folder" in err and "not found" in err
    if model.startswith("models/"):
        assert "models/ is a local folder, so this is read as a path under it, not a hub id" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("verb", [["probe", "data.source=jsonl:{data}"],
                                  ["train", "sft", "data.path={data}"],
                                  ["train", "vasd", "data.source=jsonl:{data}", "regularizer.kind=none", "train.max_steps=1"]])
def test_every_verbs_dry_run_checks_the_model_folder(verb, tmp_path, capsys, nothing_loads):
    data = jsonl(tmp_path / "d.jsonl", MATH)
    key = "model.model" if verb[0] == "probe" else "model.path"
    err = one_line_error(capsys, [*(v.format(data=data) for v in verb), f"{key}={tmp_path / 'nope'}",
                                  f"out={tmp_path / 'run'}", "--dry-run"])
    assert f"model folder {tmp_path / 'nope'} not found" in err


def test_demo_dry_run_checks_its_base_model(tmp_path, capsys):
    err = one_line_error(capsys, ["demo", f"base_model={tmp_path / 'nope'}", f"out={tmp_path / 'd'}", "--dry-run"])
    assert "field 'base_model'" in err and "not found" in err


def test_the_openai_extra_is_checked_in_a_dry_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)
    data = jsonl(tmp_path / "d.jsonl", MATH)
    err = one_line_error(capsys, ["eval", "model.kind=openai", "model.model=m", "model.base_url=http://127.0.0.1:9/v1",
                                  f"data.source=jsonl:{data}", f"out={tmp_path / 'run'}", "--dry-run"])
    assert 'field \'model.kind\': the openai backend (kind: openai) needs the openai package: pip install "fic[openai]"' \
        in err


# --------------------------------------------------------------------------- the out folder

def test_eval_dry_run_refuses_an_out_it_cannot_write_or_would_mix(tmp_path, capsys):
    data = jsonl(tmp_path / "d.jsonl", MATH)
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    common = ["eval", "model.model=some-org/model", f"data.source=jsonl:{data}", "views=[full]"]
    assert "cannot write here" in one_line_error(capsys, [*common, f"out={afile}", "--dry-run"])

    out = tmp_path / "run"
    cfg = load_config(EvalConfig, None, [*common[1:], f"out={out}"])
    evaluate(cfg, assistant=FunctionBackend(lambda messages: "#### 7"), progress=False)
    err = one_line_error(capsys, [*common, f"out={out}", "temperature=0.5", "--dry-run"])
    assert "this folder holds conversations from a different config" in err
    before = sorted(p.name for p in out.iterdir())
    assert main([*common, f"out={out}", "--dry-run"]) == 0  # the same config resumes: nothing written
    assert sorted(p.name for p in out.iterdir()) == before


def test_train_dry_run_refuses_to_start_over_a_finished_run(tmp_path, capsys, tiny_model_dir):
    corpus = jsonl(tmp_path / "c.jsonl", {"messages": [{"role": "user", "content": "Hi"},
                                                      {"role": "assistant", "content": "Hello."}]})
    out = tmp_path / "sft"
    (out / "final").mkdir(parents=True)
    err = one_line_error(capsys, ["train", "sft", f"model.path={tiny_model_dir}", f"data.path={corpus}",
                                  f"out={out}", "--dry-run"])
    assert "already holds a training run; set resume=true" in err


# --------------------------------------------------------------------------- fic demo --from

def test_demo_from_is_checked_and_honoured_by_the_dry_run(tmp_path, capsys):
    out = tmp_path / "d"
    real = one_line_error(capsys, ["demo", f"out={out}", "--from", "vsad"])
    dry = one_line_error(capsys, ["demo", f"out={out}", "--from", "vsad", "--dry-run"])
    assert dry == real and "unknown stage 'vsad'; expected one of data, warmup" in dry

    markers = out / "stages"
    markers.mkdir(parents=True)
    for stage in STAGES[:-1]:  # every stage done before
        (markers / f"{stage}.json").write_text(json.dumps({"stage": stage, "seconds": 60.0, "cpu_seconds": 60.0,
                                                           "peak_rss_mb": 500, "units": 4, "unit": "steps",
                                                           "figures": {"steps": 4, "final_loss": 1.0}}))
    assert main(["demo", f"out={out}", "--dry-run"]) == 0
    assert "stages to run: none" in capsys.readouterr().out
    assert main(["demo", f"out={out}", "--from", "vasd", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "stages to run: vasd, eval-vasd, control, eval-control (done before: data, warmup, eval-start, sft, " \
           "premise, eval-sft)" in printed
    assert all((markers / f"{stage}.json").is_file() for stage in STAGES[:-1])  # a dry run removes nothing


# --------------------------------------------------------------------------- scoring extras

@pytest.mark.parametrize("dry", [True, False])
def test_a_tasks_scoring_extra_is_checked_before_any_model_loads(dry, tmp_path, capsys, monkeypatch, nothing_loads):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # as if fic[text] were not installed
    data = jsonl(tmp_path / "t.jsonl", TRANSLATION)
    err = one_line_error(capsys, ["eval", "model.model=some-org/model", f"data.source=jsonl:{data}",
                                  "data.task=translation", f"out={tmp_path / 'run'}", *(["--dry-run"] if dry else [])])
    assert 'field \'data.task\': scoring the translation task needs the sacrebleu package: pip install "fic[text]"' \
        in err
    assert not (tmp_path / "run").exists()
    # writing the instances scores nothing: fic shard needs no extra
    assert main(["shard", "--source", f"jsonl:{data}", "--task", "translation", "--out", str(tmp_path / "s.jsonl")]) == 0


def test_the_sft_dev_curves_scoring_extra_is_checked_before_the_model_loads(tmp_path, capsys, monkeypatch,
                                                                           tiny_model_dir):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    corpus = jsonl(tmp_path / "c.jsonl", {"messages": [{"role": "user", "content": "Hi"},
                                                      {"role": "assistant", "content": "Hello."}]})
    err = one_line_error(capsys, ["train", "sft", f"model.path={tiny_model_dir}", f"data.path={corpus}",
                                  "dev.every=2", "dev.data.source=[gsm8k:x.jsonl]", "dev.data.task=math",
                                  f"out={tmp_path / 'sft'}", "--dry-run"])
    assert "field 'dev.data.task': scoring the math task needs the math-verify package" in err


# --------------------------------------------------------------------------- a failed run's message

def test_a_run_that_saved_nothing_names_no_folder(tmp_path):
    data = jsonl(tmp_path / "d.jsonl", MATH)
    out = tmp_path / "runs" / "new"

    def gone(messages):
        raise FicError("http://127.0.0.1:9/v1/chat/completions: gave up after 2 attempt(s)")

    cfg = load_config(EvalConfig, None, ["model.model=some-org/model", f"data.source=jsonl:{data}", "views=[full]",
                                         f"out={out}"])
    with pytest.raises(FicError) as caught:
        evaluate(cfg, assistant=FunctionBackend(gone), progress=False)
    message = str(caught.value)
    assert "no conversation had finished, so none is kept; run the same command again to start over" in message
    assert str(out) not in message and not (tmp_path / "runs").exists()
