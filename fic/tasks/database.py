"""Text-to-SQL (Spider), as Lost in Conversation keeps it: `db_id`, `schema_sql`,
`fully_specified_question`, `reference_sql`.

The schema goes in the system prompt, so every view sees it. The answer is one SQL query,
taken from the reply's last SQL code block (or its last `SELECT`/`WITH` statement). Scoring is
LiC's execution match: the predicted and the reference query run on the instance's database
and their result sets must be equal as multisets of rows (as lists when the reference has
ORDER BY), columns matched in any order; `DISTINCT` is removed from both queries first, as LiC
does. Not done: LiC's substitution of the reference's literal values into the prediction.

Databases: a folder of Spider databases, `<dir>/<db_id>/<db_id>.sqlite` (every `*.sqlite` in
`<dir>/<db_id>/` is used, as Spider's test suites do), named by `FIC_SPIDER_DBS` in the
environment or `fic.tasks.get("database").db_dir`. Without one, each database is built from
`schema_sql`: tables without rows, so the comparison only checks that a query runs and returns
the same columns; the score's note says so. Model SQL runs through `fic.sandbox.sql.run_sql`
(read-only, authorizer, time and row limits).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import random
import re
import shutil
import sqlite3
import tempfile
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.core.parsing import number_values
from fic.sandbox.sql import SQLLimits, run_sql
from fic.tasks import lic_prompts
from fic.tasks.answers import framed_as_template, is_placeholder
from fic.tasks.base import ErrorFactory, Task
from fic.tasks.code import code_blocks

DB_DIR_VARIABLE = "FIC_SPIDER_DBS"
SCHEMA_ONLY_NOTE = "schema only, no rows: the query ran and returned the reference's columns; no rows were compared"
STATEMENT_START = re.compile(r"^\s*(?:select|with)\b", re.IGNORECASE)
MAX_COLUMN_MAPPINGS = 1000

GENERIC_ASKS = (
    "Which columns should the result show?",
    "Are there conditions the rows must meet?",
    "Should the results be counted, sorted or grouped?",
    "Which tables does this involve?",
    "What else should the query take into account?",
    "Could you share the remaining details of what you need?",
)


def split_statements(sql: str) -> list[str]:
    """Statements of `sql` split at semicolons outside quotes and comments."""
    statements, current, quote, i = [], [], None, 0
    while i < len(sql):
        char = sql[i]
        if quote:
            current.append(char)
            if char == quote:
                quote = None
        elif char in "'\"`":
            quote = char
            current.append(char)
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = len(sql) if end < 0 else end
            continue
        elif char == ";":
            statements.append("".join(current).strip())
            current = []
        else:
            current.append(char)
        i += 1
    statements.append("".join(current).strip())
    return [s for s in statements if s]


MAX_SQL_REPLY_CHARS = 100_000  # a longer reply is not read for a query (SQLite refuses long SQL anyway)


def extract_sql(text: str) -> str | None:
    """One query: the last SELECT/WITH statement of the last code block holding one, else of the
    reply's text from its last line that starts a query."""
    if len(text or "") > MAX_SQL_REPLY_CHARS:
        return None
    for tag, code in reversed(code_blocks(text)):
        if tag in ("", "sql", "sqlite"):
            queries = [s for s in split_statements(code) if STATEMENT_START.match(s)]
            if queries:
                return queries[-1]
    lines = (text or "").splitlines()
    starts = [i for i, line in enumerate(lines) if STATEMENT_START.match(line)]
    if not starts:
        return None
    rest = "\n".join(lines[starts[-1]:]).split("\n\n")[0]
    queries = [s for s in split_statements(rest) if STATEMENT_START.match(s)]
    return queries[0] if queries else None


def without_distinct(sql: str) -> str:
    """`sql` with the DISTINCT keyword removed outside quotes (LiC compares without it)."""
    return re.sub(r"""('[^']*'|"[^"]*")|\bdistinct\b\s*""", lambda m: m.group(1) or "", sql, flags=re.IGNORECASE)


def same_result(gold: list[tuple], pred: list[tuple], order_matters: bool) -> bool:
    """Equal result sets: the same rows (as multisets, or as lists when order matters) under some
    matching of the predicted columns to the reference's."""
    if not gold and not pred:
        return True
    if len(gold) != len(pred) or len(gold[0]) != len(pred[0]):
        return False
    width = len(gold[0])
    gold_columns = [Counter(row[i] for row in gold) for i in range(width)]
    pred_columns = [Counter(row[j] for row in pred) for j in range(width)]
    options = [[j for j in range(width) if pred_columns[j] == gold_columns[i]] for i in range(width)]
    want = gold if order_matters else Counter(gold)
    for mapping in islice(_mappings(options, []), MAX_COLUMN_MAPPINGS):
        permuted = [tuple(row[j] for j in mapping) for row in pred]
        if (permuted if order_matters else Counter(permuted)) == want:
            return True
    return False


def _mappings(options: list[list[int]], chosen: list[int]) -> Iterator[list[int]]:
    if len(chosen) == len(options):
        yield list(chosen)
        return
    for j in options[len(chosen)]:
        if j not in chosen:
            yield from _mappings(options, chosen + [j])


QUOTED = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"")
PROSE = re.compile(r"(?-i:\bI\b)|\b(?:you|your|we|me|my|please)\b", re.IGNORECASE)
SLOTS = re.compile(r"\?|(?<![\w:]):[A-Za-z_]\w*|<[A-Za-z_][\w ]*>|\.\.\.|…|\{\w*\}|"
                   r"\b(?:table_name|column_name|column_\d|col\d|some_\w+|your_\w+)\b|\bfrom\s+table\b",
                   re.IGNORECASE)


def _reads_as_sql(query: str) -> bool:
    """Whether a statement that starts with SELECT/WITH is SQL and not a sentence: no pronouns
    outside its quotes, and a FROM clause unless it is a short `SELECT <expression>`."""
    bare = QUOTED.sub("''", query)
    if PROSE.search(bare.replace("'", " ")):
        return False
    return re.search(r"\bfrom\b", bare, re.IGNORECASE) is not None or len(bare.split()) <= 4


def _has_slots(query: str) -> bool:
    """Placeholders in a query: `?`, `:name`, `<country>`, `...`, `table_name`, or a quoted slot."""
    literals = [m.group(0)[1:-1] for m in QUOTED.finditer(query)]
    return SLOTS.search(QUOTED.sub("''", query)) is not None or any(is_placeholder(v) for v in literals)


_built: dict[str, Path] = {}


def _schema_database(schema_sql: str) -> Path:
    """A database file with the schema's tables and no rows, built once per schema and process."""
    key = hashlib.sha256(schema_sql.encode()).hexdigest()[:16]
    if key not in _built:
        if "folder" not in _built:
            folder = Path(tempfile.mkdtemp(prefix="fic-schemas-"))
            atexit.register(shutil.rmtree, folder, True)
            _built["folder"] = folder
        path = _built["folder"] / f"{key}.sqlite"
        connection = sqlite3.connect(path)
        # The schema comes from a data file: let it create tables and indexes, nothing else
        # (an ATTACH in it would create files elsewhere).
        connection.set_authorizer(lambda action, *_: sqlite3.SQLITE_DENY if action in (
            sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH, sqlite3.SQLITE_PRAGMA) else sqlite3.SQLITE_OK)
        try:
            # LiC's schema_sql leaves Spider's column names unquoted, some starting with a digit
            # (`18_49_Rating_Share`), which SQLite refuses: quote those.
            connection.executescript(re.sub(r"(?m)^(\s*)(\d\w*)(\s)", r'\1"\2"\3', schema_sql))
            connection.commit()
        finally:
            connection.close()
        _built[key] = path
    return _built[key]


class DatabaseTask(Task):
    name = "database"
    system_prompt = "You are a helpful assistant that writes SQLite queries."
    required_fields = ("db_id", "schema_sql", "fully_specified_question", "reference_sql")
    db_dir: str | None = None  # a Spider databases folder; else FIC_SPIDER_DBS; else built from schema_sql
    limits = SQLLimits()

    def folder(self) -> Path | None:
        value = self.db_dir or os.environ.get(DB_DIR_VARIABLE)
        return Path(value) if value else None

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        super().validate_fields(fields, error)
        folder = self.folder()
        if folder is not None and not list((folder / fields["db_id"]).glob("*.sqlite")):
            raise error(f"no database {folder / fields['db_id'] / (fields['db_id'] + '.sqlite')} "
                        f"(the Spider folder comes from {'db_dir' if self.db_dir else DB_DIR_VARIABLE})", "db_id")

    def databases(self, instance: Instance) -> tuple[list[Path], bool]:
        """The database files to compare on, and whether they were built from the schema alone."""
        folder = self.folder()
        if folder is None:
            return [_schema_database(instance.fields["schema_sql"])], True
        paths = sorted((folder / instance.fields["db_id"]).glob("*.sqlite"))
        if not paths:
            raise FicError(f"no *.sqlite in {folder / instance.fields['db_id']}", record=instance.task_id,
                           field="db_id")
        return paths, False

    def scoring_caveats(self, judged: bool = False) -> list[str]:
        if self.folder() is not None:
            return []
        return [f"no Spider databases ({DB_DIR_VARIABLE} unset): each database is built from schema_sql with no "
                "rows, so any query that runs and returns the reference's number of columns scores 1; P measures "
                "runnable SQL, not correct SQL"]

    # ------------------------------------------------------------------ prompts

    def system_prompt_for(self, instance: Instance, prompts: str = "fic") -> str:
        fields = instance.fields
        if prompts == "lic":
            return lic_prompts.fill(lic_prompts.DATABASE_SYSTEM, SCHEMA=fields["schema_sql"])
        schema = fields["schema_sql"].strip()
        return (f"{self.system_prompt} The database has this schema:\n\n{schema}\n\n"
                "When you answer, give one SQL query in a ```sql code block.")

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        fields = instance.fields
        if prompts == "lic":  # LiC's full and concat views repeat the schema in the user turn
            return self._lic_query(fields, fields["fully_specified_question"])
        return fields["fully_specified_question"]

    def concat_turn(self, instance: Instance, contents: list[str], prompts: str = "fic") -> str:
        bullets = super().concat_turn(instance, contents, prompts)
        if prompts == "lic":
            return self._lic_query(instance.fields, lic_prompts.DATABASE_CONCAT_HEADER + bullets)
        return bullets

    @staticmethod
    def _lic_query(fields: dict, query: str) -> str:
        return lic_prompts.fill(lic_prompts.DATABASE_FULL, DATABASE_SCHEMA=fields["schema_sql"], USER_QUERY=query)

    # ------------------------------------------------------------------ answers

    def extract_answer(self, text: str) -> str | None:
        return extract_sql(text)

    def scored(self, text: str, instance: Instance, judge: Any = None) -> tuple[float, str | None]:
        predicted = extract_sql(text)
        if predicted is None:
            return 0.0, "no SQL query in the reply"
        reference = instance.fields["reference_sql"]
        order_matters = "order by" in reference.lower()
        predicted = predicted.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")
        paths, schema_only = self.databases(instance)
        for path in paths:
            gold, gold_columns, problem = run_sql(path, without_distinct(reference), self.limits)
            if problem is not None:
                return 0.0, f"the reference query failed on {path.name}: {problem}"
            rows, columns, problem = run_sql(path, without_distinct(predicted), self.limits)
            if problem is not None:
                return 0.0, problem
            if not same_result(gold, rows, order_matters) or (schema_only and columns != gold_columns):
                return 0.0, SCHEMA_ONLY_NOTE.split(":")[0] if schema_only else None
        return 1.0, SCHEMA_ONLY_NOTE if schema_only else None

    def reference_answer(self, instance: Instance) -> str:
        return instance.fields["reference_sql"]

    def gold_reply(self, instance: Instance) -> str:
        return f"```sql\n{self.reference_answer(instance).strip()}\n```"

    # ------------------------------------------------------------------ classifying and SFT replies

    def committed_answer(self, reply: str) -> bool:
        """Committed when the reply holds a query the scorer would run, unless it is
        prose that starts like one ("Select the columns you need and I'll write it."), has
        slots to fill (`?`, `:name`, `<country>`, `...`, `table_name`), or the words before it
        present it as an example or as what the query will be once the user says more."""
        text = reply or ""
        query = extract_sql(text)
        committed = query is not None and _reads_as_sql(query) and not _has_slots(query) \
            and not framed_as_template(text, max(text.find(query[:40]), 0))
        return committed

    @property
    def generic_asks(self) -> tuple[str, ...]:  # type: ignore[override]
        return GENERIC_ASKS

    def values_in(self, text: str, instance: Instance | None = None) -> Counter:
        """Numbers, quoted literals and capitalised names after a sentence's first word: the
        values a question filters on ("written by Todd Casey", "sex F")."""
        values = number_values(text, words=False)
        values.update(m.lower() for m in re.findall(r"""['"]([^'"\n]{1,60})['"]""", text))
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            words = sentence.split()[1:]
            values.update(w.strip(".,;:!?()").lower() for w in words if re.match(r"[A-Z][\w-]*$", w.strip(".,;:!?()"))
                          and w.strip(".,;:!?()").upper() not in ("SQL", "I"))
        return values

    def leak(self, reply: str, revealed: set, instance: Instance) -> str | None:
        if extract_sql(reply) is not None or re.search(r"\bselect\b.+\bfrom\b", reply, re.IGNORECASE | re.DOTALL):
            return "holds a query"
        for value in self.values_in(reply, instance):
            if value not in revealed:
                return f"holds {value}, a value the user has not given yet"
        return None

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        """An early query on the reference's first table that does not match the reference."""
        table = re.search(r"\bfrom\s+([\w\"`]+)", instance.fields["reference_sql"], re.IGNORECASE)
        name = table.group(1) if table else "sqlite_master"
        frame = rng.choice(("Here is a query for what you described so far:", "This should do it:",
                            "Based on that, the query is:"))
        for query in (f"SELECT count(*) FROM {name}", f"SELECT * FROM {name}", f"SELECT * FROM {name} LIMIT 1"):
            text = f"{frame}\n```sql\n{query}\n```"
            if self.score(text, instance) < 1.0:
                return text
        return f"{frame}\n```sql\nSELECT 1 WHERE 0\n```"
