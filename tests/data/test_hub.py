"""`hf:` sources on datasets built here (never the network): each task with a scorer loads from a
`save_to_disk` folder, Parquet, CSV or JSON through a field mapping, shards, evaluates and scores;
a bad mapping is one line naming the field, the record and the columns."""

from __future__ import annotations

import json
import sqlite3

import pytest
from scripted import FunctionBackend

from fic import tasks
from fic.cli.main import main
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.records import read_records
from fic.data.hub import number_of, parse_spec
from fic.data.sources import InstancesSection, load_source, load_sources
from fic.evaluation.evaluate import EvalConfig, evaluate

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def own_datasets_cache(tmp_path, monkeypatch):
    """datasets converts local files into its cache: keep that in the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


GSM8K = {"question": ["Tom has 3 apples. He buys 4 more apples. How many apples does Tom have now?",
                      "A box holds 6 eggs. Ann buys 2 boxes. She breaks 1 egg. How many eggs are left?"],
         "answer": ["3+4=<<3+4=7>>7\n#### 7", "6*2=12, 12-1=11\n#### 11"]}
MATH = {"problem": ["Ben reads 5 pages a day. He reads for 3 days. How many pages does he read?",
                    "What is the area of a circle of radius 1?", "Find the midpoint of (0, 0) and (2, 4)."],
        "solution": ["$5 \\cdot 3 = \\boxed{15}$.", "It is $\\boxed{\\pi}$.", "The midpoint is $\\boxed{(1, 2)}$."],
        "level": ["Level 1", "Level 2", "Level 2"]}
MBPP = {"task_id": [11, 12],
        "text": ["Write a python function to remove all occurrences of a given character from a string.",
                 "Write a function to find the largest of three numbers."],
        "code": ["def remove_char(s, ch):\n    return s.replace(ch, '')",
                 "def largest(a, b, c):\n    return max(a, b, c)"],
        "test_list": [["assert remove_char('hello', 'l') == 'heo'", "assert remove_char('abc', 'x') == 'abc'"],
                      ["assert largest(1, 5, 3) == 5", "assert largest(-1, -2, -3) == -1"]]}
HUMAN_EVAL = {"task_id": ["HumanEval/0"],
              "prompt": ['def add(x: int, y: int) -> int:\n    """Add two numbers x and y. Return their sum.\n'
                         '    >>> add(2, 3)\n    5\n    """\n'],
              "canonical_solution": ["    return x + y\n"],
              "test": ["def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"],
              "entry_point": ["add"]}
SPIDER = {"db_id": ["concert_singer", "concert_singer"],
          "question": ["How many singers are there?", "What are the names of singers older than 30?"],
          "query": ["SELECT count(*) FROM singer", "SELECT name FROM singer WHERE age > 30"]}
BFCL_FUNCTIONS = [
    [{"name": "get_weather", "description": "Weather in a city.",
      "parameters": {"type": "dict", "properties": {"city": {"type": "string", "description": "The city."}},
                     "required": ["city"]}}],
    [{"name": "convert_currency", "description": "Convert money.",
      "parameters": {"type": "dict", "properties": {
          "amount": {"type": "integer", "description": "How much."},
          "to": {"type": "string", "description": "Target currency.", "enum": ["usd", "eur"]}},
          "required": ["amount", "to"]}}]]
BFCL = {"id": ["simple_0", "simple_1"],
        "question": [[[{"role": "user", "content": "What's the weather in Paris?"}]],
                     [[{"role": "user", "content": "Convert 5 into usd for me."}]]],
        "function": BFCL_FUNCTIONS,
        "ground_truth": [[{"get_weather": {"city": ["Paris"]}}],
                         [{"convert_currency": {"amount": [5], "to": ["usd"]}}]]}
WMT = {"document_de": ["Der Hund schläft im Garten."], "document_en": ["The dog is sleeping in the garden."]}


def spider_dbs(tmp_path, monkeypatch):
    folder = tmp_path / "spider" / "concert_singer"
    folder.mkdir(parents=True)
    connection = sqlite3.connect(folder / "concert_singer.sqlite")
    connection.execute("CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, age INTEGER)")
    connection.executemany("INSERT INTO singer VALUES (?, ?, ?)", [(1, "Joe", 25), (2, "Ann", 41), (3, "Li", 33)])
    connection.commit()
    connection.close()
    monkeypatch.setenv("FIC_SPIDER_DBS", str(tmp_path / "spider"))


def saved(tmp_path, columns: dict, name: str = "ds", kind: str = "disk") -> str:
    dataset = datasets.Dataset.from_dict(columns)
    if kind == "disk":
        dataset.save_to_disk(str(tmp_path / name))
        return str(tmp_path / name)
    path = tmp_path / f"{name}.{kind}"
    {"parquet": dataset.to_parquet, "csv": dataset.to_csv, "jsonl": dataset.to_json}[kind](str(path))
    return str(path)


# Each benchmark by name: its columns, the mapping docs/data.md shows, and a right reply per instance.
CASES = {
    "gsm8k": ("math", GSM8K, {}, lambda r: f"#### {r.split('####')[1].strip()}"),
    "math": ("math", MATH, {"question": "problem", "answer": "solution"}, None),
    "mbpp": ("code", MBPP, {"question_content": "text", "test": "test_list", "canonical_solution": "code"}, None),
    "humaneval": ("code", HUMAN_EVAL, {"metadata.func_name": "entry_point"}, None),
    "spider": ("database", SPIDER, {"fully_specified_question": "question", "reference_sql": "query"}, None),
    "bfcl": ("actions", BFCL, {"task_id": "id", "fully_specified_question": "question",
                               "reference_answer": "ground_truth"}, None),
    "wmt": ("translation", WMT, {}, None),
}


def right_reply(instance) -> str:
    task = tasks.get(instance.task)
    if instance.task == "code":
        solution = instance.fields["canonical_solution"]
        code = solution if "def " in solution else instance.fields["prompt"] + solution
        return f"```python\n{code}\n```"
    if instance.task == "translation":
        return instance.fields["document_en"]
    return task.gold_reply(instance)


@pytest.mark.parametrize("name", list(CASES))
def test_each_benchmark_loads_by_its_mapping_and_its_right_answers_score(name, tmp_path, monkeypatch):
    task, columns, fields, _ = CASES[name]
    spider_dbs(tmp_path, monkeypatch)
    [loaded] = load_sources(InstancesSection(source=[f"hf:{saved(tmp_path, columns)}"], task=task, fields=fields))
    rows = len(next(iter(columns.values())))
    kept = rows - (2 if name == "math" else 0)  # pi and (1, 2) are no numbers: skipped and counted
    assert len(loaded.instances) == kept and sum(loaded.skipped.values()) == rows - kept
    assert loaded.origin["fields"] == {**fields, **{k: k for k in columns if k in loaded.origin["fields"]
                                                     and k not in fields.values()}}
    for instance in loaded.instances:
        assert tasks.get(task).score(right_reply(instance), instance) == 1.0, instance.task_id
    first = loaded.instances[0]
    if name == "math":
        assert first.fields["answer"].endswith("\n#### 15")
    if name == "mbpp":
        assert first.task_id == "11" and first.fields["metadata"] == {"func_name": "remove_char"}
        assert first.fields["test"].startswith("def check(candidate):\n    assert remove_char(")
    if name == "spider":
        assert "CREATE TABLE singer" in first.fields["schema_sql"]
    if name == "bfcl":  # Arrow filled every row with the other rows' keys: they are gone again
        assert first.fields["reference_answer"] == [{"get_weather": {"city": ["Paris"]}}]
        assert set(first.fields["function"][0]["parameters"]["properties"]) == {"city"}


def test_bfcl_stored_as_json_text_and_a_plain_question(tmp_path):
    columns = {"question": ["What's the weather in Rome?"], "function": [json.dumps(BFCL_FUNCTIONS[0])],
               "ground_truth": [json.dumps([{"get_weather": {"city": ["Rome"]}}])]}
    [instance] = load_source(f"hf:{saved(tmp_path, columns, kind='jsonl')}", "actions",
                             fields={"fully_specified_question": "question", "reference_answer": "ground_truth"})
    assert instance.fields["fully_specified_question"] == [[{"role": "user", "content": "What's the weather in Rome?"}]]
    assert tasks.get("actions").score('[get_weather(city="Rome")]', instance) == 1.0


@pytest.mark.parametrize("kind", ["disk", "parquet", "csv", "jsonl"])
def test_every_local_format_reads_the_same_instances(kind, tmp_path):
    instances = load_source(f"hf:{saved(tmp_path, GSM8K, kind=kind)}", "math")
    assert [i.fields for i in instances] == [{"question": q, "answer": a} for q, a in zip(GSM8K["question"],
                                                                                          GSM8K["answer"])]
    assert instances[0].task_id == ("ds/all/0" if kind == "disk" else "ds/train/0")


def test_answers_read_after_hash_in_a_box_or_as_the_value():
    assert [number_of(t) for t in ("5", "-2.5", "1,200", "\\$18.90", "\\frac{3}{4}", "-\\dfrac{1}{2}", "50\\%",
                                   "90^\\circ", "\\pi", "(1, 2)", "x+1", "2\\sqrt{3}")] == \
        ["5", "-2.5", "1200", "18.90", "3/4", "-1/2", "50", "90", None, None, None, None]


def test_value_answers_and_a_dataset_dict_split(tmp_path):
    columns = {"problem": ["Ann has 2 cats and 3 dogs. How many pets does she have?", "Half of 1?"],
               "answer": ["5", "\\frac{1}{2}"]}
    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns),
                          "test": datasets.Dataset.from_dict(columns)}).save_to_disk(str(folder))
    section = InstancesSection(source=[f"hf:{folder}:test"], task="math", fields={"question": "problem"},
                               answer_from="value")
    [loaded] = load_sources(section)
    assert [i.fields["answer"] for i in loaded.instances] == ["#### 5", "#### 1/2"]
    assert loaded.origin["split"] == "test" and loaded.instances[0].task_id == "dd/test/0"
    assert load_source(f"hf:{folder}", "math", fields={"question": "problem"})[0].task_id == "dd/test/0"  # default
    other = tmp_path / "tv"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns),
                          "validation": datasets.Dataset.from_dict(columns)}).save_to_disk(str(other))
    with pytest.raises(FicError, match="several splits and none named; the dataset has train, validation"):
        load_source(f"hf:{other}", "math", fields={"question": "problem"})


def test_hub_specs_go_through_load_dataset_with_revision_config_and_split(monkeypatch):
    calls = []

    def fake(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_dict(GSM8K)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    [loaded] = load_sources(InstancesSection(source=["hf:openai/gsm8k@abc123:main:test"], task="math", limit=1))
    assert calls == [(("openai/gsm8k", "main"), {"split": "test", "revision": "abc123"})]
    assert len(loaded.instances) == 1 and loaded.instances[0].task_id == "openai/gsm8k/test/0"
    assert {k: loaded.origin[k] for k in ("repository", "revision", "config", "split")} == \
        {"repository": "openai/gsm8k", "revision": "abc123", "config": "main", "split": "test"}
    assert parse_spec("openai/gsm8k:train").split == "train" and parse_spec("openai/gsm8k:main").config == "main"
    assert parse_spec("o/d::test[:10]").config is None and parse_spec("o/d::test[:10]").split == "test[:10]"


@pytest.mark.parametrize("fields,needle", [
    ({"question": "prob"}, "record 1: field 'data.fields.question': no column 'prob'; the dataset has columns: "
                           "problem, solution, level"),
    ({"question": "problem"}, "record 1: field 'data.fields.answer': missing: the math task needs 'answer'"),
    ({"quest": "problem"}, "field 'data.fields.quest': the math task has no key 'quest'"),
    ({"question": "level", "answer": "problem"}, "record 1: field 'data.fields.answer': expected a solution"),
])
def test_a_bad_mapping_names_the_field_the_record_and_the_columns(fields, needle, tmp_path):
    source = saved(tmp_path, MATH)
    with pytest.raises(FicError) as err:
        load_sources(InstancesSection(source=[f"hf:{source}"], task="math", fields=fields))
    assert needle in str(err.value) and str(err.value).startswith(f"hf:{source}")


def test_a_null_value_names_its_record(tmp_path):
    source = saved(tmp_path, {"question": ["Tom has 3 pens and 4 more. How many?", None],
                              "answer": ["#### 7", "#### 1"]})
    with pytest.raises(FicError, match=r"record 2: field 'fields.question': empty \(column 'question' is null here\)"):
        load_source(f"hf:{source}", "math")


def test_fic_shard_reads_a_local_dataset_and_writes_its_card(tmp_path, capsys):
    source, out = saved(tmp_path, MATH), tmp_path / "math.jsonl"
    assert main(["shard", "--source", f"hf:{source}", "--task", "math", "--fields",
                 "question=problem,answer=solution", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fields question<-problem, answer<-solution; 2 skipped: its answer is not a number" in printed
    [instance] = read_records(out)
    assert len(instance["shards"]) >= 2 and instance["answer"].endswith("#### 15")
    card = json.loads(out.with_suffix(".card.json").read_text())
    assert card["origin"]["path"] == source and card["origin"]["fields"] == {"question": "problem",
                                                                             "answer": "solution"}
    assert main(["shard", "--source", f"hf:{source}", "--task", "math", "--fields", "question=problem",
                 "--out", str(tmp_path / "x.jsonl")]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"fic shard: error: hf:{source}: record 1: field '--fields answer': missing: the math task "
                     "needs 'answer'; map it to a column (--fields answer=COLUMN); the dataset has columns: problem, "
                     "solution, level")


# MBPP's one-sentence problems have no docstring for the code rule sharder, and `fic eval` shards what it
# plays: MBPP goes through `fic shard --sharder llm` first (its loading and scoring are tested above).
@pytest.mark.parametrize("name", [n for n in CASES if n != "mbpp"])
def test_fic_eval_plays_each_benchmark_and_scores_it(name, tmp_path, monkeypatch, smollm2_tokenizer):
    task, columns, fields, _ = CASES[name]
    spider_dbs(tmp_path, monkeypatch)
    source = saved(tmp_path, columns)
    loaded = load_source(f"hf:{source}", task, fields=fields)
    replies = {tasks.get(task).full_prompt(i)[:60]: right_reply(i) for i in loaded}

    def reply(prompt: str) -> str:
        return next((r for key, r in replies.items() if key in prompt), "no idea")

    views = "[full,sharded]" if tasks.get(task).rule_sharder else "[full]"
    overrides = [f"model.model={tmp_path}", f"data.source=hf:{source}", f"data.task={task}", f"views={views}",
                 f"out={tmp_path / 'run'}"] + [f"data.fields.{k}={v}" for k, v in fields.items()]
    metrics = evaluate(load_config(EvalConfig, None, overrides), assistant=FunctionBackend(reply, smollm2_tokenizer),
                       progress=False)
    assert metrics["views"]["full"]["P"] == 100.0
    assert metrics["data_origins"][0]["path"] == source


def test_the_fic_eval_verb_takes_an_hf_source(tmp_path, tiny_model_dir, capsys):
    source = saved(tmp_path, GSM8K, kind="parquet")
    assert main(["eval", "--quiet", f"model.model={tiny_model_dir}", f"data.source=hf:{source}", "views=[full]",
                 "max_new_tokens=4", f"out={tmp_path / 'run'}"]) == 0
    saved_metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved_metrics["instances"] == {"math": ["ds/train/0", "ds/train/1"]}
    assert saved_metrics["data_origins"][0]["fields"] == {"question": "question", "answer": "answer"}


# --------------------------------------------------------------------------- bounded local files

def test_a_local_jsonl_nested_too_deeply_for_pyarrow_is_one_line_not_a_segfault(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps({"question": GSM8K["question"][0], "answer": GSM8K["answer"][0]}) + "\n"
                    + '{"question": "q", "answer": "#### 1", "x": ' + "[" * 20000 + "]" * 20000 + "}\n")
    # In a child process: pyarrow's JSON reader crashed the interpreter (exit -11, no message).
    code = ("import sys\nfrom fic.data.sources import load_source\nfrom fic.core.errors import FicError\n"
            f"try:\n    load_source('hf:{path}', 'math')\nexcept FicError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "HF_DATASETS_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-500:]
    assert f"{path}: line 2 is nested too deeply to read" in done.stdout


def test_a_local_record_over_the_bound_is_refused_before_pyarrow(tmp_path, monkeypatch):
    from fic.data import formats

    monkeypatch.setattr(formats, "MAX_RECORD_BYTES", 1000)
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n"
                    + json.dumps({"question": "x" * 2000, "answer": "#### 2"}) + "\n")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("pyarrow was asked to read it"))
    with pytest.raises(FicError, match="line 2 is 0.0 MiB, more than the 0 MiB FiC reads as one record"):
        load_source(f"hf:{path}", "math")


def test_megabytes_of_code_are_searched_for_the_function_name_not_parsed(tmp_path):
    import time

    code = "def add(a, b):\n    return a + b\n" + "x = 1\n" * (1 << 20)  # 6 MB: parsing took minutes
    source = saved(tmp_path, {"prompt": ["def add(a, b):\n"], "test": [["assert add(1, 2) == 3"]],
                              "canonical_solution": [code]})
    started = time.monotonic()
    [instance] = load_source(f"hf:{source}", "code")
    assert instance.fields["metadata"]["func_name"] == "add" and time.monotonic() - started < 10


def test_a_huge_number_in_json_text_is_one_line(tmp_path):
    source = saved(tmp_path, {"question": ["What's the weather in Rome?"], "function": [json.dumps(BFCL_FUNCTIONS[0])],
                              "ground_truth": ["[" + "1" * 5000 + "]"]})
    with pytest.raises(FicError, match="record 1: field 'fields.reference_answer': looks like JSON but cannot be read"):
        load_source(f"hf:{source}", "actions",
                    fields={"fully_specified_question": "question", "reference_answer": "ground_truth"})


@pytest.mark.parametrize("kind", ["disk", "parquet", "csv", "jsonl"])
def test_a_split_slice_cuts_a_local_dataset(kind, tmp_path):
    source = saved(tmp_path, {"question": GSM8K["question"] * 3, "answer": GSM8K["answer"] * 3}, kind=kind)
    [loaded] = load_sources(InstancesSection(source=[f"hf:{source}:train[:4]"], task="math"))
    assert len(loaded.instances) == 4 and loaded.origin["split"] == "train[:4]"
    assert len(load_source(f"hf:{source}:test[50%:]", "math")) == 3  # a saved Dataset, or a file, has one split
    with pytest.raises(FicError, match="expected a split name or a slice"):
        load_source(f"hf:{source}:te st", "math")


def test_a_slice_of_one_split_of_a_dataset_dict(tmp_path):
    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(GSM8K),
                          "test": datasets.Dataset.from_dict({k: v * 5 for k, v in GSM8K.items()})}
                         ).save_to_disk(str(folder))
    assert len(load_source(f"hf:{folder}:test[:3]", "math")) == 3
    assert len(load_source(f"hf:{folder}:train[:1]", "math")) == 1


def test_empty_datasets_and_splits_say_so(tmp_path):
    empty = {"question": [], "answer": []}
    with pytest.raises(FicError, match="the dataset is empty: no rows"):
        load_source(f"hf:{saved(tmp_path, empty)}", "math")
    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(GSM8K), "test": datasets.Dataset.from_dict(empty)}
                         ).save_to_disk(str(folder))
    with pytest.raises(FicError, match="the split 'test' is empty: no rows"):
        load_source(f"hf:{folder}:test", "math")
    assert len(load_source(f"hf:{folder}:train", "math")) == 2  # the empty split is not even read
    header = tmp_path / "header.csv"
    header.write_text("question,answer\n")
    with pytest.raises(FicError, match="the dataset is empty: no rows"):
        load_source(f"hf:{header}", "math")
    (tmp_path / "nothing.csv").write_text("")
    with pytest.raises(FicError, match="the file is empty: no rows"):
        load_source(f"hf:{tmp_path / 'nothing.csv'}", "math")
    with pytest.raises(FicError, match="is empty: no rows"):
        load_source(f"hf:{folder}:train[:0]", "math")


def test_a_corrupt_local_file_is_fic_s_one_line_with_the_line_and_no_logger_lines(tmp_path, capfd):
    bad = tmp_path / "bad.csv"
    bad.write_text('question,answer\n"a","#### 1"\nb,c,d,e\n')
    with pytest.raises(FicError, match="Expected 2 fields in line 3, saw 4"):
        load_source(f"hf:{bad}", "math")
    captured = capfd.readouterr()
    assert "Failed to read file" not in captured.err + captured.out  # datasets' logger said it first before
    broken = tmp_path / "bad.jsonl"
    broken.write_text('{"question": "a", "answer": "#### 1"}\n{"question": \n')
    with pytest.raises(FicError, match="bad.jsonl: line 2 is not valid JSON"):
        load_source(f"hf:{broken}", "math")
