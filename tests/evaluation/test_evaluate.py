"""`fic eval` end to end on a tiny random model: outputs, resume, config errors; one real SmolLM2 run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from scripted import FunctionBackend

from fic.cli.main import main
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.records import read_records
from fic.evaluation.evaluate import EvalConfig, evaluate
from fic.tasks import Task

REPO = Path(__file__).resolve().parents[2]
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
    from fic.core.generation import BackendConfig

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


def untimed(records):
    """Conversation records without their turns' wall-clock times (two runs differ in nothing else)."""
    return [{**r, "turns": [{k: v for k, v in t.items() if k not in ("sent_at", "replied_at")} for t in r["turns"]]}
            for r in records]


@pytest.mark.slow  # end to end: a full run and its outputs
def test_eval_writes_every_output_and_runs_are_independent_samples(lic_file, tmp_path, tiny_model_dir,
                                                                   tiny_backend):
    out = tmp_path / "run"
    metrics = evaluate(config(lic_file, out, tiny_model_dir), assistant=Counting(tiny_backend), progress=False)
    for name in ("conversations.jsonl", "metrics.json", "report.md", "config.yaml", "fingerprint.json"):
        assert (out / name).is_file(), name
    # The resolved config loads back as it is: `fic eval --config out/config.yaml` reruns the run.
    assert load_config(EvalConfig, out / "config.yaml") == config(lic_file, out, tiny_model_dir)
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
    # No baseline: no recovery rate, and the run's own ratio is not called one.
    assert saved["recovery_rate"] is None and saved["retention"] is None
    assert saved["sharded_over_full"] == (None if not saved["views"]["full"]["P"] else
                                          saved["views"]["sharded"]["P"] / saved["views"]["full"]["P"])
    assert saved["instances"] == {"math": ["t0", "t1", "t2"]} and saved["settings"]["scoring"]["temperature"] == 1.0
    report = (out / "report.md").read_text()
    assert "Recovery rate" not in report and "not the recovery rate" in report
    assert "scores_by_view.png" in report and "answer_timing.png" in report and "premature answers" in report

    # The same config into a fresh folder reproduces every conversation exactly (but when its turns were played).
    again = tmp_path / "again"
    evaluate(config(lic_file, again, tiny_model_dir), assistant=tiny_backend, progress=False)
    assert all(t["sent_at"] and t["replied_at"] for r in records for t in r["turns"])
    assert untimed(log(again)) == untimed(records)


@pytest.mark.slow  # end to end: a run interrupted, then resumed
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


@pytest.mark.parametrize("edit", ["changed", "added", "gone"])
def test_resume_refuses_a_data_file_whose_content_changed(lic_file, tmp_path, tiny_model_dir, tiny_backend, edit):
    out = tmp_path / "run"
    cfg = config(lic_file, out, tiny_model_dir, "views=[full]", "runs=1")
    evaluate(cfg, assistant=tiny_backend, progress=False)
    edited = json.loads(lic_file.read_text())
    if edit == "changed":  # one fact of one instance, under the same file name
        edited[1]["question"] = edited[1]["question"].replace("buys 4", "buys 9")
        edited[1]["shards"][2]["shard"] = "He buys 9 more."
    elif edit == "added":
        edited.append({**edited[0], "task_id": "t9"})
    else:
        edited = edited[:2]
    lic_file.write_text(json.dumps(edited))
    with pytest.raises(FicError) as err:
        evaluate(cfg, assistant=tiny_backend, progress=False)
    assert f"1 {edit}" in str(err.value) and "'t" in str(err.value) and "would mix them" in str(err.value)
    assert len(log(out)) == 3  # nothing was played or dropped


def test_a_second_evaluation_into_the_same_folder_fails_at_once(lic_file, tmp_path, tiny_model_dir):
    from locks import held_by_another_process

    out = tmp_path / "run"

    def never(prompt):
        raise AssertionError("the second run played a conversation")

    with held_by_another_process(out) as pid, \
            pytest.raises(FicError, match=f"another FiC run is writing into this folder \\(process {pid}"):
        evaluate(config(lic_file, out, tiny_model_dir), assistant=FunctionBackend(never), progress=False)
    assert not (out / "conversations.jsonl").exists()


def solver(tokenizer):
    """A scripted assistant for the INSTANCES: answers right when it sees both numbers (full view
    and the last sharded turn), else asks to go on."""
    def reply(prompt):
        had, bought = re.findall(r"has (\d+) apples", prompt), re.findall(r"buys (\d+) more", prompt)
        if had and bought:
            return f"#### {int(had[-1]) + int(bought[-1])}"
        return "Please go on."
    return FunctionBackend(reply, tokenizer)


def test_recovery_rate_against_a_full_view_base_run(lic_file, tmp_path, smollm2_dir, smollm2_tokenizer):
    scripted = solver(smollm2_tokenizer)
    common = [f"model.model={smollm2_dir}", f"data.source=lic:{lic_file}", "max_new_tokens=16"]

    def run(out, *extra, assistant=scripted):
        return evaluate(load_config(EvalConfig, None, [*common, f"out={tmp_path / out}", *extra]),
                        assistant=assistant, progress=False)

    base = run("base", "views=[full]")  # a full-view-only run is a valid baseline
    assert base["views"]["full"]["P"] == 100.0 and base["recovery_rate"] is None
    trained = run("trained", "views=[full,sharded]", f"baseline={tmp_path / 'base'}")
    assert trained["recovery_rate"] == pytest.approx(1.0) and trained["retention"] == pytest.approx(1.0)
    assert trained["baseline_source"].endswith("metrics.json") and trained["by_task"]["math"]["recovery_rate"] == 1.0
    assert "Recovery rate" in (tmp_path / "trained" / "report.md").read_text()

    # Refused before anything plays: other instances, other scoring settings, no full view, an old run.
    with pytest.raises(FicError, match=r"other math instances \(0 here only, 1 there only; e.g. 't2'"):
        run("x1", "views=[sharded]", "data.limit=2", f"baseline={tmp_path / 'base'}")
    with pytest.raises(FicError, match="max_new_tokens: 16 there, 32 here"):
        run("x2", "views=[sharded]", "max_new_tokens=32", f"baseline={tmp_path / 'base'}")
    run("sharded-only", "views=[sharded]")
    with pytest.raises(FicError, match="no full-view score"):
        run("x3", "views=[sharded]", f"baseline={tmp_path / 'sharded-only'}")
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.json").write_text(json.dumps({"views": {"full": {"P": 50.0}}, "tasks": {"math": {"full": {"P": 50.0}}}}))
    with pytest.raises(FicError, match="older FiC"):
        run("x4", "views=[sharded]", f"baseline={old}")
    assert not any((tmp_path / name / "conversations.jsonl").exists() for name in ("x1", "x2", "x4"))
    with pytest.raises(FicError, match="baseline"):
        run("x5", f"baseline={tmp_path / 'nope'}")


def test_a_full_view_run_evaluates_the_instances_a_sharded_run_does(tmp_path, smollm2_dir, smollm2_tokenizer):
    data = tmp_path / "plain.jsonl"
    rows = [{"task_id": "p1", "task": "math", "question": "Tom has 3 apples. He buys 4 more apples. Then he eats "
             "1 apple. How many apples does he have?", "answer": "#### 6"},
            {"task_id": "p2", "task": "math", "question": "How many legs do 3 cats have?", "answer": "#### 12"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [f"model.model={smollm2_dir}", f"data.source=jsonl:{data}", "max_new_tokens=8"]
    scripted = FunctionBackend(lambda prompt: "#### 6", smollm2_tokenizer)
    base = evaluate(load_config(EvalConfig, None, [*common, "views=[full]", f"out={tmp_path / 'b'}"]),
                    assistant=scripted, progress=False)
    assert base["instances"] == {"math": ["p1"]} and sum(base["skipped_instances"].values()) == 1
    run = evaluate(load_config(EvalConfig, None, [*common, "views=[sharded]", f"out={tmp_path / 's'}",
                                                  f"baseline={tmp_path / 'b'}"]), assistant=scripted, progress=False)
    assert run["recovery_rate"] == pytest.approx(1.0)


class CountTask(Task):
    """A second task for mixed-task runs: the answer is a count, the reply must state it exactly."""

    name = "test-count"
    required_fields = ("question", "count")

    def full_prompt(self, instance, prompts="fic"):
        return instance.fields["question"]

    def extract_answer(self, text):
        return text.strip() or None

    def scored(self, text, instance, judge=None):
        return float(text.strip() == f"count: {instance.fields['count']}"), None

    def reference_answer(self, instance):
        return instance.fields["count"]


def test_a_file_of_several_tasks_is_reported_per_task_and_across_tasks(lic_file, tmp_path, smollm2_dir,
                                                                        smollm2_tokenizer):
    from fic import tasks

    if "test-count" not in tasks.names():
        tasks.register(CountTask())
    counts = [{"task_id": f"c{i}", "task": "test-count", "question": f"Count the letters of {'x' * (i + 2)}.",
               "count": str(i + 2), "shards": [{"shard_id": 1, "shard": "Count some letters."},
                                               {"shard_id": 2, "shard": f"The word is {'x' * (i + 2)}."}]}
              for i in range(2)]
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(INSTANCES + counts + [{"task_id": "s1", "task": "summary-like", "x": 1}]))

    def reply(prompt):
        word = re.findall(r"(?:of|is) (x+)\.", prompt)
        return f"count: {len(word[-1])}" if word else solver(smollm2_tokenizer).fn(prompt)

    scripted = FunctionBackend(reply, smollm2_tokenizer)
    common = [f"model.model={smollm2_dir}", f"data.source=lic:{mixed}", "max_new_tokens=16", "runs=2"]
    base = evaluate(load_config(EvalConfig, None, [*common, "data.task=all", "views=[full]",
                                                   f"out={tmp_path / 'base'}"]), assistant=scripted, progress=False)
    assert set(base["tasks"]) == {"math", "test-count"} and base["instances"]["test-count"] == ["c0", "c1"]
    assert base["skipped_instances"] == {"task 'summary-like' is not a FiC task": 1}
    run = evaluate(load_config(EvalConfig, None, [*common, "data.task=[math, test-count]",
                                                  "views=[full,sharded]", f"out={tmp_path / 'run'}",
                                                  f"baseline={tmp_path / 'base'}"]), assistant=scripted,
                   progress=False)
    assert run["tasks"]["test-count"]["full"]["P"] == 100.0 and run["tasks"]["math"]["sharded"]["P"] == 100.0
    assert run["tasks"]["test-count"]["sharded"]["A90"] is not None  # two runs per instance
    assert run["views"]["sharded"]["P"] == pytest.approx((run["tasks"]["math"]["sharded"]["P"]
                                                          + run["tasks"]["test-count"]["sharded"]["P"]) / 2)
    assert run["by_task"]["test-count"]["recovery_rate"] == pytest.approx(
        run["tasks"]["test-count"]["sharded"]["P"] / 100.0)
    assert run["recovery_rate"] == pytest.approx(run["views"]["sharded"]["P"] / 100.0)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| **all** | sharded |" in report and "test-count: R =" in report
    with pytest.raises(FicError, match="unknown task 'nope'"):
        evaluate(load_config(EvalConfig, None, [*common, "data.task=[math, nope]", f"out={tmp_path / 'x'}"]),
                 assistant=scripted, progress=False)


@pytest.mark.parametrize("override, message", [
    ("views=[full,bogus]", "views[1]"),
    ("views=[]", "at least one view"),
    ("runs=0", "runs"),
    ("temperature=-1", "temperature"),
    ("user.kind=llm", "user.backend.model"),
    ("classifier.kind=llm", "classifier.backend.model"),
    ("classifier.kind=gpt", "classifier.kind"),
    ("model.model=", "the assistant model to evaluate"),
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


class VLLMLike(FunctionBackend):
    """A scripted stand-in for fic.backends.vllm.VLLMBackend (no vLLM here): the engine's limit
    where vLLM keeps it (`llm.llm_engine.model_config.max_model_len`), no `model.config`, and
    vLLM's refusal of a prompt over that limit."""

    def __init__(self, fn, tokenizer, max_model_len):
        super().__init__(fn, tokenizer, name="vllm")
        self.max_model_len = max_model_len
        self.llm = SimpleNamespace(llm_engine=SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=max_model_len)))

    def generate(self, prompts, params):
        for prompt in prompts:
            if len(prompt) + params.max_new_tokens > self.max_model_len:
                raise ValueError(f"The decoder prompt (length {len(prompt)}) is longer than the maximum model "
                                 f"length of {self.max_model_len}")
        return super().generate(prompts, params)


def test_a_vllm_engine_s_context_limit_ends_conversations_as_context_full(lic_file, tmp_path, tiny_model_dir,
                                                                         smollm2_tokenizer, capsys, monkeypatch):
    """With the vLLM backend there is no model.config, so there was no context guard: the first
    prompt over max_model_len aborted the evaluation, and resume met it again. The engine's limit
    is read, such conversations end as context-full, and their count is reported."""
    from fic.evaluation import evaluate as evaluate_module

    def reply(prompt):
        return "Go on, tell me more."

    settings = ("views=[full,sharded]", "runs=1", "stop_at_correct=false")
    evaluate(config(lic_file, tmp_path / "roomy", tiny_model_dir, *settings),
             assistant=VLLMLike(reply, smollm2_tokenizer, max_model_len=100_000), progress=False)
    # Room for the single-turn prompt and a reply (6 tokens), not for the sharded view's later turns.
    limit = max(r["prompt_tokens"] for r in log(tmp_path / "roomy") if r["view"] == "full") + 6
    backend = VLLMLike(reply, smollm2_tokenizer, max_model_len=limit)
    metrics = evaluate(config(lic_file, tmp_path / "run", tiny_model_dir, *settings), assistant=backend,
                       progress=False)
    records = log(tmp_path / "run")
    assert len(records) == 6 and metrics["conversations"] == 6
    cut = [r for r in records if r["stop_reason"] == "context_full"]
    assert cut and all(r["view"] == "sharded" for r in cut) and metrics["context_full"] == len(cut)
    assert all(r["stop_reason"] == "last_turn" for r in records if r["view"] == "full")
    monkeypatch.setattr(evaluate_module, "make_backend", lambda cfg: backend)
    assert main(["eval", f"model.model={tiny_model_dir}", f"data.source=lic:{lic_file}", f"out={tmp_path / 'cli'}",
                 "max_new_tokens=6", "views=[full,sharded]", "stop_at_correct=false", "--quiet"]) == 0
    assert f"{len(cut)} conversation(s) ended with a full context" in capsys.readouterr().out


@pytest.mark.slow
def test_eval_recipe_on_smollm2(smollm2_dir, tmp_path, monkeypatch, capsys):
    """The LiC-sample recipe through the CLI on the real model, cut to one LiC math instance."""
    if not LIC_SAMPLE.exists():
        pytest.skip("the Lost-in-Conversation sample is not next to this checkout")
    monkeypatch.chdir(REPO)
    out = tmp_path / "smol"
    code = main(["eval", "--config", "recipes/smollm2-135m-instruct/eval-lic.yaml",
                 f"data.source=lic:{LIC_SAMPLE}", f"model.model={smollm2_dir}",
                 f"out={out}", "data.limit=1", "max_new_tokens=32", "--quiet"])
    assert code == 0
    records = log(out)
    assert sorted(r["view"] for r in records) == ["concat", "full", "sharded"]
    sharded = next(r for r in records if r["view"] == "sharded")
    assert sharded["turns"][0]["user"] == "what's Ara's total basketball score over four years?"
    assert all(t["reply"].strip() for t in sharded["turns"])  # a real model says something each turn
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["conversations"] == 3
    assert "no recovery rate without baseline" in capsys.readouterr().out


def test_a_run_that_failed_before_playing_does_not_bind_the_folder(lic_file, tmp_path, tiny_model_dir, tiny_backend):
    out = tmp_path / "run"
    with pytest.raises(FicError, match="not found"):  # a mistyped model path
        evaluate(config(lic_file, out, tmp_path / "no-such-model"), progress=False)
    assert not (out / "conversations.jsonl").exists()
    evaluate(config(lic_file, out, tiny_model_dir), assistant=tiny_backend, progress=False)
    assert len(log(out)) == 18
    with pytest.raises(FicError, match="different config"):  # once played, the folder is bound
        evaluate(config(lic_file, out, tiny_model_dir, "temperature=0.5"), assistant=tiny_backend, progress=False)


def test_the_shipped_eval_recipe_runs_on_a_fresh_clone(tiny_model_dir, tiny_backend, tmp_path, monkeypatch):
    """recipes/.../eval.yaml reads no file outside the repository: its problems are generated."""
    monkeypatch.chdir(REPO)
    cfg = load_config(EvalConfig, REPO / "recipes/smollm2-135m-instruct/eval.yaml",
                      [f"model.model={tiny_model_dir}", f"out={tmp_path / 'o'}", "data.limit=2", "max_new_tokens=4"])
    assert cfg.data.source[0].startswith("reasoning-gym:")
    metrics = evaluate(cfg, assistant=tiny_backend, progress=False)
    assert metrics["conversations"] == 2 * 3 and metrics["reliability_note"]  # greedy, N = 1: P only
    protocol = load_config(EvalConfig, REPO / "recipes/smollm2-135m-instruct/eval-lic-protocol.yaml")
    assert (protocol.runs, protocol.temperature) == (10, 1.0)
    assert (protocol.data.source, protocol.data.seed) == (cfg.data.source, cfg.data.seed)
    assert (protocol.prompts, cfg.prompts) == ("lic", "fic")  # LiC's protocol with LiC's prompts


@pytest.mark.slow  # end to end: two runs
def test_prompts_lic_reaches_the_assistant_and_binds_the_run(lic_file, tmp_path, smollm2_dir, smollm2_tokenizer):
    seen = []

    def reply(prompt):
        seen.append(prompt)
        return solver(smollm2_tokenizer).fn(prompt)

    scripted = FunctionBackend(reply, smollm2_tokenizer)
    common = [f"model.model={smollm2_dir}", f"data.source=lic:{lic_file}", "max_new_tokens=16", "views=[full,sharded]"]

    def run(out, *extra):
        return evaluate(load_config(EvalConfig, None, [*common, f"out={tmp_path / out}", *extra]),
                        assistant=scripted, progress=False)

    metrics = run("lic", "prompts=lic")
    assert metrics["settings"]["prompts"] == "lic" and metrics["views"]["sharded"]["P"] == 100.0
    assert metrics["scoring_caveats"] == {}  # math scores what it says
    assert all("As an expert problem solver solve step by step" in prompt for prompt in seen)
    full = next(r for r in log(tmp_path / "lic") if r["view"] == "full")
    assert full["turns"][0]["user"] == f"Q: {INSTANCES[0]['question']}\nA:"
    assert "prompts: `lic`" in (tmp_path / "lic" / "report.md").read_text()
    assert json.loads((tmp_path / "lic" / "fingerprint.json").read_text())["prompts"] == "lic"
    with pytest.raises(FicError, match="prompts: 'lic' -> 'fic'"):  # resuming under other prompts
        run("lic")
    # A baseline scored under other prompts is refused; one made before the setting existed reads as fic.
    run("base-fic", "views=[full]")
    with pytest.raises(FicError, match="prompts: 'fic' there, 'lic' here"):
        run("x", "prompts=lic", f"baseline={tmp_path / 'base-fic'}")
    old = json.loads((tmp_path / "base-fic" / "metrics.json").read_text())
    del old["settings"]["scoring"]["prompts"]
    (tmp_path / "base-fic" / "metrics.json").write_text(json.dumps(old))
    assert run("trained", f"baseline={tmp_path / 'base-fic'}")["recovery_rate"] == pytest.approx(1.0)
    # A folder whose fingerprint predates the setting resumes as fic.
    fingerprint = json.loads((tmp_path / "trained" / "fingerprint.json").read_text())
    del fingerprint["prompts"]
    (tmp_path / "trained" / "fingerprint.json").write_text(json.dumps(fingerprint))
    assert run("trained", f"baseline={tmp_path / 'base-fic'}")["conversations"] == 6


def test_database_without_spider_databases_says_so_in_metrics_and_the_report(tmp_path, smollm2_dir,
                                                                            smollm2_tokenizer, monkeypatch):
    monkeypatch.delenv("FIC_SPIDER_DBS", raising=False)
    data = tmp_path / "db.json"
    data.write_text(json.dumps([{
        "task_id": "d1", "task": "database", "db_id": "singers", "schema_sql": "CREATE TABLE singer (name text, age int);",
        "fully_specified_question": "Names of singers?", "reference_sql": "SELECT name FROM singer",
        "shards": [{"shard_id": 1, "shard": "I need singer names."}, {"shard_id": 2, "shard": "All of them."}]}]))
    scripted = FunctionBackend(lambda prompt: "```sql\nSELECT age FROM singer\n```", smollm2_tokenizer)
    metrics = evaluate(load_config(EvalConfig, None, [f"model.model={smollm2_dir}", f"data.source=lic:{data}",
                                                      "data.task=database", f"out={tmp_path / 'o'}",
                                                      "views=[full]"]),
                       assistant=scripted, progress=False)
    assert metrics["tasks"]["database"]["full"]["P"] == 100.0  # a wrong column, but the right number of them
    (caveat,) = metrics["scoring_caveats"]["database"]
    assert "no Spider databases" in caveat and "any query that runs" in caveat
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["scoring_caveats"] == metrics["scoring_caveats"]
    assert "**Scoring caveat, database**: no Spider databases" in (tmp_path / "o" / "report.md").read_text()


def test_a_failed_eval_leaves_no_new_output_folder_behind(lic_file, tmp_path, tiny_model_dir, tiny_backend):
    out = tmp_path / "runs" / "new" / "run"
    with pytest.raises(FicError, match="not found"):
        evaluate(config(tmp_path / "missing.json", out, tiny_model_dir), assistant=tiny_backend, progress=False)
    assert not (tmp_path / "runs").exists()  # not the run folder, its lock and config, nor the folders above
    # Failing after the config and fingerprint are written (before any conversation finished): gone too.
    with pytest.raises(KeyboardInterrupt):
        evaluate(config(lic_file, out, tiny_model_dir), assistant=Counting(tiny_backend, fail_after=0), progress=False)
    assert not (tmp_path / "runs").exists()
    # Conversations saved for a resume stay, and so does a folder that was there before.
    with pytest.raises(KeyboardInterrupt):
        evaluate(config(lic_file, out, tiny_model_dir, "batch_size=4"), assistant=Counting(tiny_backend, fail_after=6),
                 progress=False)
    assert len(log(out)) > 0 and (out / "config.yaml").is_file()
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(FicError):
        evaluate(config(tmp_path / "missing.json", kept, tiny_model_dir), assistant=tiny_backend, progress=False)
    assert kept.is_dir()


def test_a_sampled_eval_resumed_or_played_in_other_chunks_draws_the_same_replies(lic_file, tmp_path, tiny_model_dir,
                                                                                 tiny_backend):
    """Each reply's seed is a function of its conversation (task id, view, run, turn), and the
    backend samples each prompt from its own seed: neither a kill and resume nor another
    batch_size changes a sampled reply (temperature 1 on a tiny random model)."""
    def replies(out):
        return {(r["task_id"], r["view"], r["run"]): [(t["reply"], t["seed"]) for t in r["turns"]] for r in log(out)}

    whole = tmp_path / "whole"
    evaluate(config(lic_file, whole, tiny_model_dir, "batch_size=32"), assistant=tiny_backend, progress=False)
    chunked = tmp_path / "chunked"
    evaluate(config(lic_file, chunked, tiny_model_dir, "batch_size=3"), assistant=tiny_backend, progress=False)
    resumed = tmp_path / "resumed"
    cfg = config(lic_file, resumed, tiny_model_dir, "batch_size=4")
    with pytest.raises(KeyboardInterrupt):
        evaluate(cfg, assistant=Counting(tiny_backend, fail_after=6), progress=False)
    assert 0 < len(log(resumed)) < 18
    evaluate(cfg, assistant=tiny_backend, progress=False)
    expected = replies(whole)
    assert len(expected) == 18 and replies(chunked) == expected and replies(resumed) == expected
    # Sampled, not greedy: the two runs of a conversation drew different first replies.
    assert any(expected[(i, v, 0)][0][0] != expected[(i, v, 1)][0][0] for i, v, _ in expected)


@pytest.mark.parametrize("field,value,needle", [
    ("score", "1", "field 'score': expected a number from 0 to 1, got '1'"),
    ("run", "0", "field 'run': expected a run number, got '0'"),
    ("turns", {"a": 1}, "field 'turns': expected a list of turn objects"),
])
def test_a_saved_record_of_the_wrong_type_is_refused_at_resume_before_any_replay(lic_file, tmp_path, tiny_model_dir,
                                                                                  tiny_backend, field, value, needle):
    """A string score in a saved conversation was a ValueError in the metrics after every other
    conversation had been played again."""
    out = tmp_path / "run"
    cfg = config(lic_file, out, tiny_model_dir, "views=[full]", "runs=1")
    evaluate(cfg, assistant=tiny_backend, progress=False)
    records = log(out)[:2]  # the third is left to play again
    records[0][field] = value
    (out / "conversations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    resumed = Counting(tiny_backend)
    with pytest.raises(FicError) as err:
        evaluate(cfg, assistant=resumed, progress=False)
    assert str(err.value).startswith(f"{out / 'conversations.jsonl'}: line 1: {needle}")
    assert "cannot be resumed" in str(err.value) and resumed.calls == 0  # refused before any reply was played


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_resume_says_what_it_promises_in_each_dtype(lic_file, tmp_path, tiny_model_dir, dtype, capsys):
    """float32: a resumed sampled run draws exactly the replies of an unbroken one (and says nothing);
    bfloat16: a row's logits depend on its batch-mates, so the resume says that its replies may
    differ and that they are reproducible in float32 only (docs/evaluation.md says the same)."""
    from fic.backends import make_backend
    from fic.core.generation import BackendConfig

    backend = make_backend(BackendConfig(model=str(tiny_model_dir), device="cpu", batch_size=32, dtype=dtype))
    whole = tmp_path / "whole"
    evaluate(config(lic_file, whole, tiny_model_dir, "batch_size=32"), assistant=backend, progress=False)
    resumed = tmp_path / "resumed"
    cfg = config(lic_file, resumed, tiny_model_dir, "batch_size=4")
    with pytest.raises(KeyboardInterrupt):
        evaluate(cfg, assistant=Counting(backend, fail_after=6), progress=False)
    capsys.readouterr()
    evaluate(cfg, assistant=backend, progress=False)
    said = capsys.readouterr().out
    note = ("fic eval: resuming with bfloat16 weights: a row's logits depend on the rows batched with it, so the replies "
            "played from here may differ from those an unbroken run would have drawn; replies are reproducible across "
            "a resume or another batch_size in float32 only (model.dtype=float32)")
    if dtype == "float32":
        assert "resuming with" not in said
        assert untimed(log(resumed)) != [] and sorted(map(json.dumps, untimed(log(resumed)))) == \
            sorted(map(json.dumps, untimed(log(whole))))
    else:
        assert note in said.splitlines()
