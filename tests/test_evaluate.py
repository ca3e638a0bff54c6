"""`fic eval` end to end on a tiny random model: outputs, resume, config errors; one real SmolLM2 run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fic.cli import main
from fic.config import load_config
from fic.errors import FicError
from fic.evaluate import EvalConfig, evaluate
from fic.files import read_records

REPO = Path(__file__).resolve().parents[1]
LIC_SAMPLE = REPO.parent / "shared" / "data" / "lost_in_conversation" / "sample_5_per_task.json"

INSTANCES = [
    {"task_id": f"t{i}", "task": "math", "question": f"Tom has {i + 2} apples and buys {i + 3} more. How many?",
     "answer": f"#### {2 * i + 5}",
     "shards": [{"shard_id": 1, "shard": "How many apples does Tom have now?"},
                {"shard_id": 2, "shard": f"Tom has {i + 2} apples."},
                {"shard_id": 3, "shard": f"He buys {i + 3} more."}]}
    for i in range(3)
]


@pytest.fixture
def lic_file(tmp_path):
    path = tmp_path / "lic.json"
    path.write_text(json.dumps(INSTANCES))
    return path


@pytest.fixture(scope="module")
def tiny_backend(tiny_model_dir):
    from fic.backends import make_backend
    from fic.generation import BackendConfig

    return make_backend(BackendConfig(model=str(tiny_model_dir), device="cpu", batch_size=32))


class Counting:
    """Wraps a backend: counts prompts and calls, and can fail after `fail_after` calls."""

    def __init__(self, inner, fail_after=None):
        self.inner, self.fail_after = inner, fail_after
        self.tokenizer, self.name = inner.tokenizer, "counting"
        self.calls = self.prompts = 0

    def generate(self, prompts, params):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt  # what Ctrl-C or a killed job looks like from inside the loop
        self.calls += 1
        self.prompts += len(prompts)
        return self.inner.generate(prompts, params)

    def chat(self, conversations, params):
        raise AssertionError("a local backend is driven token-in/token-out")


def config(lic_file, out, tiny_model_dir, *extra):
    return load_config(EvalConfig, None, [f"model.model={tiny_model_dir}", f"data.source=lic:{lic_file}",
                                          f"out={out}", "max_new_tokens=6", "views=[full,concat,sharded]",
                                          "runs=2", "temperature=1.0", *extra])


def log(out):
    return read_records(Path(out) / "conversations.jsonl")


def test_eval_writes_every_output_and_runs_are_independent_samples(lic_file, tmp_path, tiny_model_dir,
                                                                   tiny_backend):
    out = tmp_path / "run"
    metrics = evaluate(config(lic_file, out, tiny_model_dir), assistant=Counting(tiny_backend), progress=False)
    for name in ("conversations.jsonl", "metrics.json", "report.md", "config.yaml", "fingerprint.json"):
        assert (out / name).is_file(), name
    for name in ("scores_by_view.png", "answer_timing.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = log(out)
    assert len(records) == 3 * 3 * 2 and len({(r["task_id"], r["view"], r["run"]) for r in records}) == 18
    sharded = [r for r in records if r["view"] == "sharded"]
    for record in records:
        assert record["turns"] and all({"user", "shard_ids", "reply", "label", "answer", "score", "prompt_tokens",
                                        "reply_tokens"} <= set(t) for t in record["turns"])
    # A noisy tiny model rarely answers right: sharded conversations play all three shards in order.
    assert all([t["shard_ids"] for t in r["turns"]] == [[1], [2], [3]] for r in sharded if r["score"] == 0)
    # Two runs of one conversation at temperature 1 are different samples.
    replies = {(r["task_id"], r["view"], r["run"]): r["turns"][0]["reply"] for r in records}
    assert any(replies[(t, v, 0)] != replies[(t, v, 1)] for t in ("t0", "t1", "t2") for v in ("full", "sharded"))
    saved = json.loads((out / "metrics.json").read_text())
    assert saved == json.loads(json.dumps(metrics))
    assert set(saved["tasks"]["math"]) == {"full", "concat", "sharded"}
    for row in saved["tasks"]["math"].values():
        assert {"P", "A90", "U90_10", "generated_tokens_per_conversation"} <= set(row)
    assert "recovery_rate" in saved and "retention" in saved
    report = (out / "report.md").read_text()
    assert "Recovery rate" in report and "scores_by_view.png" in report and "answer_timing.png" in report

    # The same config into a fresh folder reproduces every conversation exactly.
    again = tmp_path / "again"
    evaluate(config(lic_file, again, tiny_model_dir), assistant=tiny_backend, progress=False)
    assert log(again) == records


def test_resume_after_an_interruption_neither_redoes_nor_loses_conversations(lic_file, tmp_path, tiny_model_dir,
                                                                              tiny_backend):
    out = tmp_path / "run"
    cfg = config(lic_file, out, tiny_model_dir, "batch_size=4")
    # Step 1 needs 5 calls of <= 4 prompts (18 conversations); fail during step 2.
    with pytest.raises(KeyboardInterrupt):
        evaluate(cfg, assistant=Counting(tiny_backend, fail_after=6), progress=False)
    first = log(out)
    assert 0 < len(first) < 18
    assert not (out / "metrics.json").exists()
    # A torn last line (killed while writing) is dropped and replayed.
    with open(out / "conversations.jsonl", "a") as handle:
        handle.write('{"task_id": "t0", "vi')
    resumed = Counting(tiny_backend)
    evaluate(cfg, assistant=resumed, progress=False)
    records = log(out)
    keys = [(r["task_id"], r["view"], r["run"]) for r in records]
    assert len(records) == 18 and len(set(keys)) == 18
    assert records[:len(first)] == first  # what was finished is kept as it was
    # The resumed run generated exactly the turns of the conversations that were missing.
    assert resumed.prompts == sum(r["num_turns"] for r in records[len(first):])
    # A third run has nothing left to play and does not call the model.
    idle = Counting(tiny_backend)
    evaluate(cfg, assistant=idle, progress=False)
    assert idle.calls == 0 and len(log(out)) == 18

    # More runs or views extend the folder; a changed decoding setting is refused.
    more = Counting(tiny_backend)
    evaluate(config(lic_file, out, tiny_model_dir, "runs=3"), assistant=more, progress=False)
    assert len(log(out)) == 27 and more.prompts == sum(r["num_turns"] for r in log(out)[18:])
    with pytest.raises(FicError, match="temperature"):
        evaluate(config(lic_file, out, tiny_model_dir, "temperature=0.5"), assistant=tiny_backend,
                 progress=False)


def test_baseline_from_a_previous_run(lic_file, tmp_path, tiny_model_dir, tiny_backend):
    fake = tmp_path / "base"
    fake.mkdir()
    (fake / "metrics.json").write_text(json.dumps({"views": {"full": {"P": 50.0}},
                                                   "tasks": {"math": {"full": {"P": 50.0}}}}))
    metrics = evaluate(config(lic_file, tmp_path / "run", tiny_model_dir, f"baseline={fake}", "runs=1",
                              "views=[sharded]"), assistant=tiny_backend, progress=False)
    assert metrics["baseline_full_P"] == 50.0
    assert metrics["recovery_rate"] == pytest.approx(metrics["views"]["sharded"]["P"] / 50.0)
    assert metrics["retention"] is None  # no full view in this run
    with pytest.raises(FicError, match="baseline"):
        evaluate(config(lic_file, tmp_path / "x", tiny_model_dir, f"baseline={tmp_path / 'nope'}"),
                 assistant=tiny_backend, progress=False)


@pytest.mark.parametrize("override, message", [
    ("views=[full,bogus]", "views[1]"),
    ("views=[]", "at least one view"),
    ("runs=0", "runs"),
    ("temperature=-1", "temperature"),
    ("user.kind=llm", "user.backend.model"),
    ("classifier.kind=llm", "classifier.backend.model"),
    ("classifier.kind=gpt", "classifier.kind"),
    ("model.model=", "missing the model"),
    ("data.source=", "data.source"),
    ("stop_at_correct=maybe", "stop_at_correct"),
    ("views=[full,full]", "twice"),
])
def test_bad_config_values_are_clear_errors(override, message, tmp_path):
    with pytest.raises(FicError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(EvalConfig, None, ["model.model=m", "data.source=lic:x.json", override])


def test_cli_reports_bad_input_on_one_line(tmp_path, capsys, lic_file):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {model: m}\ndata: {source: 'lic:x'}\nruns: many\n")
    assert main(["eval", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "runs" in err and "integer" in err and "Traceback" not in err
    assert main(["eval", "--config", str(bad), "runs=1", f"data.source=lic:{tmp_path / 'missing.json'}"]) == 2
    assert "file not found" in capsys.readouterr().err


def test_unsharded_sources_are_sharded_on_the_fly(tmp_path, tiny_model_dir, tiny_backend):
    data = tmp_path / "plain.jsonl"
    rows = [{"task_id": "p1", "task": "math", "question": "Sam has 3 cats. Each cat eats 2 cans a day. "
             "How many cans do the cats eat in a day?", "answer": "#### 6"},
            {"task_id": "p2", "task": "math", "question": "What is 2 plus 2?", "answer": "#### 4"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = evaluate(load_config(EvalConfig, None, [f"model.model={tiny_model_dir}", f"data.source=jsonl:{data}",
                                                      f"out={tmp_path / 'o'}", "max_new_tokens=4"]),
                       assistant=tiny_backend, progress=False)
    assert metrics["tasks"]["math"]["sharded"]["instances"] == 1  # p2 has a single fact: skipped
    assert sum(metrics["skipped_instances"].values()) == 1
    (record,) = [r for r in log(tmp_path / "o") if r["view"] == "sharded"]
    assert record["num_shards"] == 3


@pytest.mark.slow
def test_eval_recipe_on_smollm2(smollm2_dir, tmp_path, monkeypatch, capsys):
    """The shipped recipe through the CLI on the real model, cut to one LiC math instance."""
    if not LIC_SAMPLE.exists():
        pytest.skip("the Lost-in-Conversation sample is not next to this checkout")
    monkeypatch.chdir(REPO)
    out = tmp_path / "smol"
    code = main(["eval", "--config", "recipes/smollm2-135m-instruct/eval.yaml", f"model.model={smollm2_dir}",
                 f"out={out}", "data.limit=1", "max_new_tokens=32", "--quiet"])
    assert code == 0
    records = log(out)
    assert sorted(r["view"] for r in records) == ["concat", "full", "sharded"]
    sharded = next(r for r in records if r["view"] == "sharded")
    assert sharded["turns"][0]["user"] == "what's Ara's total basketball score over four years?"
    assert all(t["reply"].strip() for t in sharded["turns"])  # a real model says something each turn
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["conversations"] == 3
    assert "recovery rate" in capsys.readouterr().out


def test_a_run_that_failed_before_playing_does_not_bind_the_folder(lic_file, tmp_path, tiny_model_dir, tiny_backend):
    out = tmp_path / "run"
    with pytest.raises(FicError, match="not found"):  # a mistyped model path
        evaluate(config(lic_file, out, tmp_path / "no-such-model"), progress=False)
    assert not (out / "conversations.jsonl").exists()
    evaluate(config(lic_file, out, tiny_model_dir), assistant=tiny_backend, progress=False)
    assert len(log(out)) == 18
    with pytest.raises(FicError, match="different config"):  # once played, the folder is bound
        evaluate(config(lic_file, out, tiny_model_dir, "temperature=0.5"), assistant=tiny_backend, progress=False)
