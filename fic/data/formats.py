"""Bounds on every data file a local `hf:` source hands to `datasets`, checked before its parser.

`datasets` reads JSON with pyarrow's reader, whose stack overflows on a record nested some ten
thousand levels deep (the process dies, rc 139), and turns a CSV of 100,000 columns or a Parquet
cell of 60 MB into minutes of work before FiC sees a row. So every file of a local source is
checked first, each in seconds, and a file past a bound is one `FicError` naming it and where:

- JSON and JSONL (`.json`, `.jsonl`, `.ndjson`): FiC's guarded reader (`fic.core.files`): no line
  longer than `MAX_RECORD_BYTES`, nesting within the JSON decoder's depth, no 4,300-digit number;
- CSV and TSV: a bounded stream: no line or row longer than `MAX_RECORD_BYTES`, at most
  `MAX_COLUMNS` columns (said at the header, before the rest is read);
- Parquet and Arrow: the schema (at most `MAX_COLUMNS` leaf columns, nested at most `MAX_NESTING`
  deep) and, for Parquet, the decompressed size (at most `MAX_FILE_BYTES`) from the metadata, then
  the rows a batch of about one record's bound at a time: no cell and no row larger than
  `MAX_RECORD_BYTES`, at most `MAX_FILE_BYTES` in all; an Arrow file of compressed batches is
  refused by name (decompressed whole as it is read, its size unknown before);
- text (`.txt`): no line longer than `MAX_RECORD_BYTES`;
- compressed (`.gz`, `.bz2`, `.xz` around any of those): decompressed through the same checks
  (at most `MAX_FILE_BYTES` decompressed); other archives (`.zip`, `.zst`, `.tar`...) and any
  other file in a data folder (images, audio, XML, HDF5, notes: `datasets` may read any of them)
  are refused by name, with the formats FiC reads; a data folder's `README.md` (the dataset card)
  and files without a suffix (`LICENSE`) are passed over, as `datasets` passes over them.

The Parquet and Arrow checks run pyarrow's readers (C++) in a forked process (`parse_in_child`),
and so does the parser of `datasets` after the checks, so that a crash in either (a reader's bug
on a hostile file) is one line, not the end of the run.
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import gzip
import json
import lzma
import os
import signal
import stat
import struct
import sys
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

from fic.core.errors import FicError, one_line
from fic.core.records import MAX_FILE_BYTES, parse_records, read_data_bytes

MAX_RECORD_BYTES = 32 << 20  # one record (a JSONL line, a CSV row, a Parquet or Arrow row)
MAX_COLUMNS = 2048          # columns of a table (leaf columns of a nested one)
MAX_NESTING = 32            # nested types of a Parquet or Arrow column (Arrow's own writer stops at 64)
BATCH_ROWS = 1024           # Parquet and Arrow rows checked at once

JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
CSV_SUFFIXES = {".csv": ",", ".tsv": "\t"}
PARQUET_SUFFIXES = (".parquet", ".geoparquet", ".gpq")
COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
ARCHIVES = (".zip", ".zst", ".zstd", ".lz4", ".tar", ".tgz", ".7z", ".rar", ".bz", ".lzma", ".z")
READ = "FiC reads .parquet, .arrow, .csv, .tsv, .json, .jsonl, .ndjson and .txt files, and those compressed as " \
    ".gz, .bz2 or .xz"


def check_local(path: Path, source: str) -> None:
    """Check every data file of the local source `path` (one file, a folder of data files, or a
    `save_to_disk` folder) before `datasets` reads it; a `FicError` naming the first past a bound."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
    else:
        files = [path]
    for file in files:
        check_file(file, source, named=file == path)


def _hidden(file: Path, top: Path) -> bool:
    """Files datasets passes over in a data folder: hidden ones, and those in hidden folders."""
    return any(part.startswith((".", "_")) for part in file.relative_to(top).parts[:-1]) or \
        file.name.startswith(".")


def check_file(file: Path, source: str, *, named: bool = False) -> None:
    """Check one data file by its suffixes (see the module's note). `named`: the source names this
    file itself, so a suffix FiC does not read is refused even where datasets would pass over it."""
    suffixes = [s.lower() for s in file.suffixes if " " not in s]
    last = suffixes[-1] if suffixes else ""
    if last in COMPRESSED:
        inner = suffixes[-2] if len(suffixes) > 1 else ""
        if not _known(inner):
            raise FicError(f"a {last} file of {inner or 'no'} data format; {READ}", path=str(file), field="source")
        with _decompressing(file, last) as handle:
            _check_format(handle, inner, file)
        return
    if _known(last):
        if last in JSON_SUFFIXES:
            _check_json(read_data_bytes(file, "a JSON or JSONL file"), file)
        elif last in PARQUET_SUFFIXES or last == ".arrow":
            if not parse_in_child(lambda: _check_table(file, last), str(file), source, parser="pyarrow's reader"):
                _check_table(file, last)
        else:
            with open(file, "rb") as handle:
                _check_format(handle, last, file)
        return
    if file.name == "README.md" or (not named and not last):
        return  # the dataset card; a file without a suffix (LICENSE), which datasets never reads as rows
    what = "an archive" if last in ARCHIVES else "a file"
    raise FicError(f"{what} FiC does not check before datasets reads it ({last or 'no suffix'}); {READ}"
                   + ("" if named else "; move other files out of the data folder"), path=str(file), field="source")


def _known(suffix: str) -> bool:
    return suffix in JSON_SUFFIXES or suffix in CSV_SUFFIXES or suffix in PARQUET_SUFFIXES or suffix in (".arrow",
                                                                                                          ".txt")


@contextlib.contextmanager
def _decompressing(file: Path, suffix: str) -> Iterator[Any]:
    """The decompressed stream of `file`, at most `MAX_FILE_BYTES` of it; a file that does not
    decompress is one line naming it."""
    if not stat.S_ISREG(os.stat(file).st_mode):
        raise FicError("is not a regular file (a device, pipe or socket)", path=str(file), field="source")
    handle = _Bounded(COMPRESSED[suffix](file, "rb"), file)
    try:
        yield handle
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as err:
        raise FicError(f"cannot be decompressed ({one_line(err)[:200]})", path=str(file), field="source") from None
    finally:
        handle.close()


class _Bounded:
    """A binary stream that refuses to yield more than `MAX_FILE_BYTES` (a decompression bomb)."""

    def __init__(self, inner: Any, file: Path):
        self.inner, self.file, self.given = inner, file, 0

    def _count(self, data: bytes) -> bytes:
        self.given += len(data)
        if self.given > MAX_FILE_BYTES:
            raise _past_file_bound(self.file)
        return data

    def read(self, size: int = -1) -> bytes:
        return self._count(self.inner.read(MAX_FILE_BYTES + 1 - self.given if size < 0 else size))

    def readline(self, size: int = -1) -> bytes:
        return self._count(self.inner.readline(size))

    def close(self) -> None:
        self.inner.close()


def _check_format(handle: Any, suffix: str, file: Path) -> None:
    """Check the stream of a JSON, CSV, TSV or text file (`suffix`: its format)."""
    if suffix in JSON_SUFFIXES:
        _check_json(handle.read(), file)
    elif suffix in CSV_SUFFIXES:
        _check_csv(handle, file, CSV_SUFFIXES[suffix])
    elif suffix == ".txt":
        for _ in _lines(handle, file):
            pass
    else:  # Parquet and Arrow need to seek: not read compressed
        raise FicError(f"a compressed {suffix} file; {READ}", path=str(file), field="source")


def _too_large(what: str, size: int) -> str:
    return f"{what} is {size / (1 << 20):.1f} MiB, more than the {MAX_RECORD_BYTES >> 20} MiB FiC reads as one record"


def _check_json(raw: bytes, file: Path) -> None:
    """JSON or JSONL bytes through the guarded reader: each line bounded, then parsed."""
    for number, line in enumerate(raw.splitlines(), start=1):
        if len(line) > MAX_RECORD_BYTES:
            raise FicError(_too_large(f"line {number}", len(line)), path=str(file), field="source")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise FicError(f"not UTF-8 text (byte {err.start}); expected a JSON or JSONL file", path=str(file),
                       field="source") from None
    parse_records(text, file)  # nesting, bad JSON, huge numbers: one line naming the line


def _lines(handle: Any, file: Path) -> Iterator[str]:
    """The lines of a binary stream as text, none longer than `MAX_RECORD_BYTES` (a record is at
    least as long as any of its lines), read without holding more than one."""
    number = 0
    while True:
        line = handle.readline(MAX_RECORD_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_RECORD_BYTES:
            raise FicError(f"line {number} is longer than the {MAX_RECORD_BYTES >> 20} MiB FiC reads as one record",
                           path=str(file), field="source")
        yield line.decode("utf-8", "replace")


def _check_csv(handle: Any, file: Path, delimiter: str) -> None:
    """A CSV or TSV stream, row by row: at most `MAX_COLUMNS` columns, no field or row longer than
    `MAX_RECORD_BYTES`."""
    limit = csv.field_size_limit()
    csv.field_size_limit(MAX_RECORD_BYTES)
    try:
        reader = csv.reader(_lines(handle, file), delimiter=delimiter)
        try:
            for row in reader:
                if len(row) > MAX_COLUMNS:
                    raise FicError(f"line {reader.line_num} has {len(row):,} columns, more than the {MAX_COLUMNS:,} "
                                   "FiC reads", path=str(file), field="source")
                size = sum(len(cell) for cell in row)
                if size > MAX_RECORD_BYTES:
                    raise FicError(_too_large(f"the row ending at line {reader.line_num}", size), path=str(file),
                                   field="source")
        except csv.Error as err:
            if "field larger than field limit" in str(err):
                raise FicError(f"line {reader.line_num} holds a field longer than the {MAX_RECORD_BYTES >> 20} MiB FiC "
                               "reads as one record", path=str(file), field="source") from None
            # Any other malformation is the parser's to report, with its own words.
    finally:
        csv.field_size_limit(limit)


def _check_table(file: Path, suffix: str) -> None:
    """A Parquet or Arrow file: its schema from the metadata, then every row a batch at a time."""
    import pyarrow as pa

    try:
        if suffix == ".arrow":
            batches, schema = _arrow_batches(file)
        else:
            import pyarrow.parquet as pq

            # Text columns read as dictionaries: a dictionary-encoded Parquet column holds a repeated
            # value once, and decoded, 20 rows of one 30 MB value are 600 MB of memory.
            text = [f.name for f in pq.read_schema(file) if pa.types.is_string(f.type) or pa.types.is_binary(f.type)
                    or pa.types.is_large_string(f.type) or pa.types.is_large_binary(f.type)]
            parquet = pq.ParquetFile(file, read_dictionary=text)
            schema = parquet.schema_arrow
            batches = parquet.iter_batches(batch_size=_parquet_batch_rows(parquet.metadata, file))
        _check_schema(schema, file)
        first, held = 1, 0
        for batch in batches:
            held += _check_rows(batch, first, file)
            if held > MAX_FILE_BYTES:  # metadata that understated it: the bound holds on what was read
                raise _past_file_bound(file)
            first += batch.num_rows
    except (pa.ArrowException, OSError) as err:
        raise FicError(f"cannot be read as {'Arrow' if suffix == '.arrow' else 'Parquet'} ({one_line(err)[:200]})",
                       path=str(file), field="source") from None


def _parquet_batch_rows(metadata: Any, file: Path) -> int:
    """Rows of a Parquet file read at once by the check, from its metadata: a file that decompresses
    past `MAX_FILE_BYTES` is refused before any page is read (a 10 KB file of compressed repeats
    held 4.8 GB: minutes and 11 GB of memory), and a batch holds about one record's bound of
    bytes, so that rows of 30 MB are not read a thousand at a time."""
    groups = [metadata.row_group(g) for g in range(metadata.num_row_groups)]
    if sum(group.total_byte_size for group in groups) > MAX_FILE_BYTES:
        raise _past_file_bound(file)
    widest = max((-(-group.total_byte_size // group.num_rows) for group in groups if group.num_rows), default=1)
    return max(1, min(BATCH_ROWS, MAX_RECORD_BYTES // max(widest, 1)))


def _past_file_bound(file: Path) -> FicError:
    return FicError(f"decompresses to more than the {MAX_FILE_BYTES >> 30} GiB FiC reads as one file; split it",
                    path=str(file), field="source")


def _arrow_batches(file: Path) -> tuple[Any, Any]:
    """The record batches and schema of an Arrow file: the stream format (datasets' own files)
    or the file format."""
    import pyarrow as pa

    source = pa.memory_map(str(file))
    _refuse_compressed(source, file)
    try:
        reader = pa.ipc.open_stream(source)
        return iter(reader), reader.schema
    except pa.ArrowInvalid:
        source.seek(0)
        reader = pa.ipc.open_file(source)
        return (reader.get_batch(i) for i in range(reader.num_record_batches)), reader.schema


def _refuse_compressed(source: Any, file: Path) -> None:
    """An Arrow file whose batches are compressed (LZ4 or ZSTD buffers) is refused before a batch
    is read: reading one decompresses it whole, and a 4 KB file held 100 MB (no size is told
    before). datasets writes its Arrow files uncompressed; memory-mapped, they cost no memory."""
    import pyarrow as pa

    source.seek(8 if source.read(6) == b"ARROW1" else 0)  # the file format: its stream follows the magic
    try:
        for message in pa.ipc.MessageReader.open_stream(source):
            if _compressed(message.metadata.to_pybytes()):
                raise FicError("an Arrow file of compressed batches (LZ4 or ZSTD), whose size FiC cannot bound "
                               "before decompressing them; write it uncompressed (datasets' save_to_disk does)",
                               path=str(file), field="source")
    except (struct.error, IndexError):
        raise FicError("cannot be read as Arrow (its message metadata is malformed)", path=str(file),
                       field="source") from None
    finally:
        source.seek(0)


def _compressed(buf: bytes) -> bool:
    """Whether an Arrow IPC message (its flatbuffer metadata) is a record or dictionary batch with a
    `compression` field: Message.header (field 2) of type RecordBatch (3) or DictionaryBatch (2,
    its RecordBatch at field 1), then RecordBatch's field 3 (Arrow's format/Message.fbs)."""

    def field(table: int, index: int) -> int:  # a field's offset in its table, 0 when absent
        vtable = table - struct.unpack_from("<i", buf, table)[0]
        if 4 + 2 * index + 2 > struct.unpack_from("<H", buf, vtable)[0]:
            return 0
        return struct.unpack_from("<H", buf, vtable + 4 + 2 * index)[0]

    def child(table: int, index: int) -> int:
        at = table + field(table, index)
        return at + struct.unpack_from("<I", buf, at)[0]

    root = struct.unpack_from("<I", buf, 0)[0]
    kind = buf[root + field(root, 1)] if field(root, 1) else 0
    if kind not in (2, 3) or not field(root, 2):
        return False
    batch = child(root, 2)
    if kind == 2:
        if not field(batch, 1):
            return False
        batch = child(batch, 1)
    return bool(field(batch, 3))


def _check_schema(schema: Any, file: Path) -> None:
    leaves, deepest = 0, 0
    stack = [(field.type, 1) for field in schema]
    while stack:
        kind, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            raise FicError(f"a column's type is nested more than {MAX_NESTING} levels deep", path=str(file),
                           field="source")
        children = [kind.field(i).type for i in range(kind.num_fields)]
        if not children:
            leaves += 1
            if leaves > MAX_COLUMNS:
                raise FicError(f"has more than {MAX_COLUMNS:,} columns (leaf columns of nested ones counted), more "
                               "than FiC reads", path=str(file), field="source")
        stack.extend((child, depth + 1) for child in children)


def _check_rows(batch: Any, first: int, file: Path) -> int:
    """No cell and no row of `batch` (rows `first`...) larger than `MAX_RECORD_BYTES`; the bytes
    its cells hold."""
    import numpy as np

    total = np.zeros(batch.num_rows, dtype=np.int64)
    for name, column in zip(batch.schema.names, batch.columns):
        cells = _cell_bytes(column)
        if cells.size and cells.max() > MAX_RECORD_BYTES:
            row = int(cells.argmax())
            raise FicError(_too_large(f"row {first + row} column {name!r}", int(cells[row])), path=str(file),
                           field="source")
        total += cells
    if total.size and total.max() > MAX_RECORD_BYTES:
        row = int(total.argmax())
        raise FicError(_too_large(f"row {first + row}", int(total[row])), path=str(file), field="source")
    return int(total.sum())


def _cell_bytes(array: Any) -> Any:
    """The bytes each row's cell of an Arrow array holds (strings and binaries by their length,
    fixed-width values by their width, lists and structs by what they hold), vectorised."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind, rows = array.type, len(array)
    if pa.types.is_dictionary(kind):  # each value counted at each row that names it, never decoded
        values = _cell_bytes(array.dictionary)
        if not len(values):
            return np.zeros(rows, dtype=np.int64)
        named = values[array.indices.fill_null(0).to_numpy(zero_copy_only=False)]
        return np.where(array.is_valid().to_numpy(zero_copy_only=False), named, 0).astype(np.int64)
    if pa.types.is_map(kind):
        return _cell_bytes(array.cast(pa.list_(pa.struct([kind.key_field, kind.item_field]))))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or \
            pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        children = _cell_bytes(array.flatten())
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        return np.bincount(parents, weights=children, minlength=rows).astype(np.int64)
    if pa.types.is_struct(kind):
        total = np.zeros(rows, dtype=np.int64)
        for child in array.flatten():
            total += _cell_bytes(child)
        return total
    try:
        width = max(kind.bit_width // 8, 1)
    except ValueError:  # no fixed width (null, a union): counted as nothing
        width = 0
    return np.full(rows, width, dtype=np.int64)


# --------------------------------------------------------------------------- a parser in a child

def parse_in_child(parse: Callable[[], Any], what: str, source: str, *, parser: str = "the parser of datasets") -> bool:
    """Run `parse` (a `datasets` load that fills its cache, or a check that reads a file with
    pyarrow) once in a forked process first: a crash there (a parser killed by a signal, rc 139) is
    a `FicError` naming `what`, and this process goes on only when the child survived. A `FicError`
    the child raised is raised here, as it was; True when the child finished `parse` (a check need
    not run again; loading again reads the child's cache). False where fork is missing, or the
    child raised another error: this process then runs `parse` itself and raises it in its own
    words."""
    if not hasattr(os, "fork"):
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    # tokenizers warns in a forked child when its threads were used before; it never runs there
    quiet = "TOKENIZERS_PARALLELISM" not in os.environ
    if quiet:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"  # its default: nothing changes but the warning
    said, told = os.pipe()
    try:
        pid = os.fork()
    finally:
        if quiet:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
    if pid == 0:  # the child: its exit status, and a FicError's fields, are all it says
        code = 0
        try:
            os.close(said)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            parse()
        except FicError as err:
            code = 3
            fields = {"message": err.message[:4000], "path": err.path, "record": err.record, "field": err.field}
            os.write(told, json.dumps(fields, default=str).encode()[:60_000])  # within a pipe's buffer
        except BaseException:  # the parent reports it, by parsing again itself
            code = 1
        finally:
            os._exit(code)
    os.close(told)
    try:
        _, status = os.waitpid(pid, 0)
        fields = os.read(said, 65_536)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    finally:
        os.close(said)
    if os.WIFSIGNALED(status):
        try:
            name = signal.Signals(os.WTERMSIG(status)).name
        except ValueError:
            name = f"signal {os.WTERMSIG(status)}"
        raise FicError(f"{parser} crashed reading {what} ({name}); the file is malformed or nested too deeply for "
                       "it", path=source, field="source")
    if os.WEXITSTATUS(status) == 3 and fields:
        raise FicError(**json.loads(fields))
    return os.WEXITSTATUS(status) == 0
