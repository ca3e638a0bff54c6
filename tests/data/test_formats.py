"""Every file of a local `hf:` source is bounded before `datasets` parses it (issue 56, item 2):
compressed JSON through the guarded reader, CSV and TSV as a bounded stream, Parquet and Arrow
from their metadata and a batch at a time; a parser's crash is one line; a failed `fic eval`
leaves no out folder. Each refusal is one line naming the file."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fic.core.errors import FicError
from fic.data import formats
from fic.data.sources import load_source

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

REPO = Path(__file__).resolve().parents[2]
_REAL_SCHEMA = formats._check_schema
GOOD = [{"question": "Tom has 3 apples and buys 4. How many now?", "answer": "3+4=7\n#### 7"},
        {"question": "A box holds 6 eggs; 2 boxes, 1 broken. How many?", "answer": "12-1=11\n#### 11"}]
DEEP = '{"question": "q", "answer": "#### 1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"


@pytest.fixture(autouse=True)
def own_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))  # for the processes the tests start


def _jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _fic(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`fic ARGS` in a process of its own: before the checks, pyarrow crashed the whole process."""
    return subprocess.run([sys.executable, "-m", "fic", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_compressed_record_nested_100000_deep_is_one_line_and_a_failed_eval_leaves_no_folder(tmp_path):
    """The issue's case: `data.jsonl.gz` in a data folder; `fic shard` and `fic eval` died with rc 139
    and no message, and `fic eval` left a new out folder holding `.fic-lock`."""
    folder = tmp_path / "data"
    folder.mkdir()
    with gzip.open(folder / "data.jsonl.gz", "wt") as handle:
        handle.write(_jsonl(GOOD) + DEEP)
    shard = _fic("shard", "--source", f"hf:{folder}", "--task", "math", "--out", str(tmp_path / "x.jsonl"),
                 cwd=tmp_path)
    assert shard.returncode == 2, shard.stderr[-500:]
    assert shard.stderr.strip().splitlines() == [
        f"fic shard: error: {folder / 'data.jsonl.gz'}: line 3 is nested too deeply to read (JSON nested more than "
        f"about {sys.getrecursionlimit()} levels)"]
    out = tmp_path / "runs" / "new"
    run = _fic("eval", f"model.model={tmp_path / 'no-model'}", f"data.source=hf:{folder}", "data.task=math",
               f"out={out}", "--quiet", cwd=tmp_path)
    assert run.returncode == 2, run.stderr[-500:]
    assert "line 3 is nested too deeply" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # neither the out folder, its lock, nor the folder made above it


@pytest.mark.parametrize("compress", [gzip.open, bz2.open])
def test_a_compressed_jsonl_file_loads_through_the_same_checks(compress, tmp_path):
    path = tmp_path / f"math.jsonl.{'gz' if compress is gzip.open else 'bz2'}"
    with compress(path, "wt") as handle:
        handle.write(_jsonl(GOOD))
    assert [i.fields["answer"] for i in load_source(f"hf:{path}", "math")] == ["3+4=7\n#### 7", "12-1=11\n#### 11"]


def test_a_decompression_bomb_is_refused_at_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAX_FILE_BYTES", 1 << 20)
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b" " * (4 << 20))  # 4 MiB of spaces: a few KiB compressed
    with pytest.raises(FicError, match="decompresses to more than the 0 GiB FiC reads as one file") as err:
        load_source(f"hf:{path}", "math")
    assert err.value.path == str(path)


@pytest.mark.parametrize("name", ["data.jsonl.zst", "data.zip", "data.xml", "scan.png"])
def test_formats_not_checked_are_refused_by_name_with_the_ones_read(name, tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked to read it"))
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "good.jsonl").write_text(_jsonl(GOOD))
    (folder / "README.md").write_text("# the card: passed over")
    (folder / "LICENSE").write_text("no suffix: passed over")
    (folder / name).write_bytes(b"\x28\xb5\x2f\xfd" * 4)
    with pytest.raises(FicError, match=r"FiC does not check before datasets reads it .*FiC reads \.parquet, \.arrow, "
                                       r"\.csv, \.tsv, \.json, \.jsonl, \.ndjson and \.txt files, and those compressed "
                                       r"as \.gz, \.bz2 or \.xz") as err:
        load_source(f"hf:{folder}", "math")
    assert err.value.path == str(folder / name)


# --------------------------------------------------------------------------- CSV and TSV

def test_a_csv_of_100000_columns_is_refused_at_its_header_in_seconds(tmp_path):
    path = tmp_path / "wide.csv"
    path.write_text(",".join(f"c{i}" for i in range(100_000)) + "\n" + ",".join("1" for _ in range(100_000)) + "\n")
    began = time.monotonic()
    with pytest.raises(FicError, match="line 1 has 100,000 columns, more than the 2,048 FiC reads"):
        load_source(f"hf:{path}", "math")
    assert time.monotonic() - began < 10  # 149 s before


def test_a_csv_cell_of_40_mib_is_refused_before_datasets_reads_it(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked to read it"))
    path = tmp_path / "big.csv"
    with open(path, "w") as handle:
        handle.write('question,answer\nq,"#### 1"\n"' + "x" * (40 << 20) + '","#### 2"\n')
    with pytest.raises(FicError, match="line 3 is longer than the 32 MiB FiC reads as one record") as err:
        load_source(f"hf:{path}", "math")
    assert err.value.path == str(path)


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".tsv.gz"])
def test_a_quoted_cell_over_several_lines_and_a_row_over_the_bound_are_refused(suffix, tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAX_RECORD_BYTES", 1000)
    sep = "\t" if ".tsv" in suffix else ","
    opener = gzip.open if suffix.endswith(".gz") else open
    cell = path = tmp_path / f"cell{suffix}"
    with opener(path, "wt") as handle:  # one quoted cell of 2,000 characters over lines of 100
        handle.write(f'question{sep}answer\n"' + ("y" * 99 + "\n") * 20 + f'"{sep}#### 1\n')
    with pytest.raises(FicError, match="holds a field longer than the 0 MiB FiC reads as one record") as err:
        load_source(f"hf:{cell}", "math")
    assert err.value.path == str(cell)
    row = tmp_path / f"row{suffix}"
    with opener(row, "wt") as handle:  # two cells of 600: each within the bound, the row not
        handle.write(f'question{sep}answer\n"' + ("z" * 59 + "\n") * 10 + f'"{sep}"' + ("w" * 59 + "\n") * 10 + '"\n')
    with pytest.raises(FicError, match="the row ending at line 22 is 0.0 MiB, more than the 0 MiB"):
        load_source(f"hf:{row}", "math")


# --------------------------------------------------------------------------- Parquet and Arrow

def _arrow_file(table, path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_table_cell_or_row_over_the_bound_is_refused_naming_the_row(kind, tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAX_RECORD_BYTES", 1000)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked to read it"))
    write = (lambda table, path: pq.write_table(table, path)) if kind == "parquet" else _arrow_file
    questions = [f"q{i}" for i in range(3000)]
    cases = {  # row 2,500: past the first batch of rows
        "cell": ({"question": [*questions[:2499], "x" * 2000, *questions[2500:]], "answer": ["#### 1"] * 3000},
                 "row 2500 column 'question' is 0.0 MiB"),
        "nested": ({"question": questions, "answer": ["#### 1"] * 3000,
                    "steps": [[{"text": "s"}]] * 2499 + [[{"text": "y" * 300}] * 4] + [[]] * 500},
                   "row 2500 column 'steps' is 0.0 MiB"),
        "row": ({"question": [*questions[:2499], "x" * 600, *questions[2500:]],
                 "answer": ["#### 1"] * 2499 + ["z" * 600] + ["#### 1"] * 500}, "row 2500 is 0.0 MiB"),
    }
    for name, (columns, needle) in cases.items():
        path = tmp_path / f"{name}.{kind}"
        write(pa.table(columns), path)
        with pytest.raises(FicError, match=f"{needle}, more than the 0 MiB FiC reads as one record") as err:
            load_source(f"hf:{path}", "math")
        assert err.value.path == str(path)


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_table_of_too_many_or_too_deeply_nested_columns_is_refused_from_its_schema(kind, tmp_path):
    write = (lambda table, path: pq.write_table(table, path)) if kind == "parquet" else _arrow_file
    wide = tmp_path / f"wide.{kind}"
    write(pa.table({f"c{i}": [1] for i in range(2049)}), wide)
    with pytest.raises(FicError, match="has more than 2,048 columns"):
        load_source(f"hf:{wide}", "math")
    kind_ = pa.string()
    for _ in range(40):
        kind_ = pa.list_(kind_)
    deep = tmp_path / f"deep.{kind}"
    value = "x"
    for _ in range(40):
        value = [value]
    write(pa.table({"question": pa.array([value], type=kind_)}), deep)
    with pytest.raises(FicError, match="a column's type is nested more than 32 levels deep") as err:
        load_source(f"hf:{deep}", "math")
    assert err.value.path == str(deep)


def test_a_parquet_file_that_decompresses_past_the_file_bound_is_refused(tmp_path, monkeypatch):
    """A few KB of Parquet can hold gigabytes: repeats of one value, dictionary-encoded, are stored once
    (a 10 KB file of 160 rows of 30 MB took minutes and 11 GB of memory). Plain-encoded, the metadata
    says so before any row is read; dictionary-encoded, the rows read say so, without decoding them."""
    monkeypatch.setattr(formats, "MAX_FILE_BYTES", 1 << 20)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked to read it"))
    table = pa.table({"question": ["x" * 100_000] * 20, "answer": ["#### 1"] * 20})  # 2 MB decoded
    plain = tmp_path / "plain.parquet"
    pq.write_table(table, plain, use_dictionary=False)
    real_rows = formats._check_rows
    monkeypatch.setattr(formats, "_check_rows", lambda *a: pytest.fail("rows read: the metadata said enough"))
    with pytest.raises(FicError, match="decompresses to more than the 0 GiB FiC reads as one file") as err:
        load_source(f"hf:{plain}", "math")
    assert err.value.path == str(plain)
    monkeypatch.setattr(formats, "_check_rows", real_rows)
    repeated = tmp_path / "repeated.parquet"
    pq.write_table(table, repeated, compression="zstd")
    assert pq.ParquetFile(repeated).metadata.row_group(0).total_byte_size < 1 << 20  # the metadata cannot tell
    with pytest.raises(FicError, match="decompresses to more than the 0 GiB FiC reads as one file") as err:
        load_source(f"hf:{repeated}", "math")
    assert err.value.path == str(repeated)


def test_a_repeated_parquet_value_is_checked_without_decoding_it(tmp_path):
    """20 rows of one 5 MB value: each within every bound, so the file is read; the check holds the
    value once (a dictionary), not 100 MB of decoded rows. In a process of its own: Arrow's pool
    counts its peak since the process began."""
    path = tmp_path / "repeated.parquet"
    pq.write_table(pa.table({"question": ["x" * (5 << 20)] * 20, "answer": ["#### 1"] * 20}), path)
    code = ("import pyarrow as pa\nfrom pathlib import Path\nfrom fic.data import formats\n"  # the check itself, unforked
            f"formats._check_table(Path({str(path)!r}), '.parquet')\nprint(pa.default_memory_pool().max_memory())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-500:]
    assert int(done.stdout) < 40 << 20  # decoded, the batch alone is 100 MB


def test_a_gsm8k_parquet_file_is_checked_like_an_hf_one(tmp_path, monkeypatch):
    """`gsm8k:PATH` reads a Parquet file itself, without datasets: the same checks come first."""
    monkeypatch.setattr(formats, "MAX_RECORD_BYTES", 1000)
    path = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.table({"question": ["q", "x" * 2000], "answer": ["#### 1", "#### 2"]}), path)
    with pytest.raises(FicError, match="row 2 column 'question' is 0.0 MiB, more than the 0 MiB") as err:
        load_source(f"gsm8k:{path}", "math")
    assert err.value.path == str(path)


@pytest.mark.parametrize("layout", ["stream", "file"])
def test_an_arrow_file_of_compressed_batches_is_refused_before_a_batch_is_read(layout, tmp_path, monkeypatch):
    """A 4 KB Arrow file of ZSTD batches held 100 MB, decompressed whole as a batch is read; nothing
    tells its size before. Uncompressed, the same table is read (memory-mapped)."""
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked to read it"))
    table = pa.table({"question": pa.array(["x" * (5 << 20)] * 20).dictionary_encode(), "answer": ["#### 1"] * 20})
    new = pa.ipc.new_stream if layout == "stream" else pa.ipc.new_file
    for compression in ("zstd", "lz4", None):
        path = tmp_path / f"{compression}.arrow"
        with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema, options=pa.ipc.IpcWriteOptions(
                compression=compression)) as writer:
            writer.write_table(table)
        if compression is None:
            formats.check_file(path, "hf:x", named=True)
            continue
        assert path.stat().st_size < 100_000
        with pytest.raises(FicError, match=r"an Arrow file of compressed batches \(LZ4 or ZSTD\)") as err:
            load_source(f"hf:{path}", "math")
        assert err.value.path == str(path)


def test_a_saved_datasets_folder_is_checked_too(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAX_RECORD_BYTES", 1000)
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"question": ["q", "x" * 2000], "answer": ["#### 1", "#### 2"]}).save_to_disk(folder)
    with pytest.raises(FicError, match="row 2 column 'question' is 0.0 MiB") as err:
        load_source(f"hf:{folder}", "math")
    assert err.value.path.endswith(".arrow")


# --------------------------------------------------------------------------- a parser's crash

@pytest.mark.parametrize("crashing", ["datasets", "pyarrow"])
def test_a_parser_that_crashes_is_one_line_not_the_end_of_the_process(crashing, tmp_path):
    """A parser killed by a signal (here made to, on input the checks pass) ends only its forked
    child: the run says so in one line and the process goes on. datasets' parser, and pyarrow's
    Parquet reader the checks themselves use."""
    path = tmp_path / ("math.jsonl" if crashing == "datasets" else "math.parquet")
    if crashing == "datasets":
        path.write_text(_jsonl(GOOD))
        crash, parser = "import datasets\ndatasets.load_dataset", "the parser of datasets"
    else:
        pq.write_table(pa.Table.from_pylist(GOOD), path)
        crash, parser = "import pyarrow.parquet\npyarrow.parquet.ParquetFile", "pyarrow's reader"
    code = ("import os, signal\nfrom fic.core.errors import FicError\nfrom fic.data.sources import load_source\n"
            f"{crash} = lambda *a, **k: os.kill(os.getpid(), signal.SIGSEGV)\n"
            f"try:\n    load_source('hf:{path}', 'math')\nexcept FicError as err:\n    print(err)\nprint('alive')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.splitlines() == [
        f"hf:{path}: field 'source': {parser} crashed reading {path} (SIGSEGV); the file is malformed "
        "or nested too deeply for it", "alive"]


def test_a_refusal_in_the_checking_child_is_raised_as_it_was(tmp_path, monkeypatch):
    """The Parquet check runs in a forked child; its FicError comes back whole (file, field, words),
    and the check does not run a second time in this process."""
    monkeypatch.setattr(formats, "MAX_COLUMNS", 2)
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"a": [1], "b": [2], "c": [3]}), path)
    ran = []  # filled in the process that checks: the child's copy, never this one's
    monkeypatch.setattr(formats, "_check_schema", lambda *a: (ran.append(1), _REAL_SCHEMA(*a)))
    with pytest.raises(FicError) as err:
        formats.check_file(path, "hf:x", named=True)
    assert (err.value.path, err.value.field, err.value.message) == (
        str(path), "source", "has more than 2 columns (leaf columns of nested ones counted), more than FiC reads")
    assert ran == []  # it ran in the child alone
