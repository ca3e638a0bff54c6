"""A SIGTERM ends every verb within the documented bound under a load of twice the cores, each verb
with its own line, and a new out folder that holds no finished work is removed (issue 56, item 8:
`fic eval` under `max_retries` took 6-13 s, printed the trainer's line about steps, checkpoints
and resume=true, and left its new out folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from fic.bench.sigterm import terminate_when
from fic.core.errors import SIGTERM_BOUND_S

pytestmark = pytest.mark.slow  # processes under load, killed

REPO = Path(__file__).resolve().parents[2]
MARGIN_S = 1.0  # scheduling on a machine whose every core is busy
INSTANCES = [{"task_id": f"t{i}", "task": "math", "question": f"Tom has {i + 2} apples and buys 3. How many?",
              "answer": f"#### {i + 5}", "shards": [{"shard_id": 1, "shard": "How many apples does Tom have?"},
                                                    {"shard_id": 2, "shard": f"He has {i + 2} and buys 3."}]}
             for i in range(8)]


@pytest.fixture
def loaded():
    """Busy loops on twice the cores this process may use, for the test's length."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(2 * len(os.sched_getaffinity(0)))]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


def killed(args: list[str], *, ready: Callable[[], bool], cwd: Path) -> tuple[float, int, list[str]]:
    """`fic ARGS` in a process of its own, sent SIGTERM once `ready()`."""
    return terminate_when([sys.executable, "-m", "fic", *args], ready, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("server", ["retrying", "slow"])
def test_fic_eval_ends_within_the_bound_with_its_own_line_and_no_folder(server, tmp_path, loaded):
    """An openai backend retrying a 503 with backoff, or waiting on a request that takes a minute
    (in a worker thread): the evaluation ends within the bound and says so as an evaluation."""
    from servers import ChatServer

    data = tmp_path / "lic.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in INSTANCES))
    asked = threading.Event()

    def respond(body, number):
        asked.set()
        if server == "retrying":
            return 503, {"error": {"message": "overloaded"}}, {}, 0
        return 200, {"choices": [{"message": {"role": "assistant", "content": "4"}}]}, {}, 60

    chat = ChatServer(respond)
    out = tmp_path / "runs" / "new"
    try:
        took, status, err = killed(["eval", "--quiet", "model.kind=openai", "model.model=m", f"model.base_url={chat.url}",
                                    "model.max_retries=100", "model.timeout_s=120", f"data.source=lic:{data}",
                                    "views=[sharded]", f"out={out}"], ready=lambda: asked.wait(0) and
                                   (time.sleep(1.0) or True), cwd=tmp_path)
    finally:
        chat.close()
    assert status == 143 and took < SIGTERM_BOUND_S + MARGIN_S, (took, err)
    assert err == ["fic eval: terminated (SIGTERM); no conversation had finished, so none is kept"]
    assert not (tmp_path / "runs").exists()  # the new out folder, its lock and the folder above it


def test_fic_eval_in_a_generation_step_ends_within_the_bound(smollm2_dir, tmp_path, loaded):
    data = tmp_path / "lic.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in INSTANCES))
    out = tmp_path / "run"
    took, status, err = killed(["eval", "--quiet", f"model.model={smollm2_dir}", f"data.source=lic:{data}",
                                "views=[sharded]", "max_new_tokens=256", "temperature=1.0", f"out={out}"],
                               ready=lambda: (out / "config.yaml").is_file() and (time.sleep(3.0) or True), cwd=tmp_path)
    assert status == 143 and took < SIGTERM_BOUND_S + MARGIN_S, (took, err)
    said = [line for line in err if "terminated" in line]  # beside it: the model's loading bar
    assert len(said) == 1 and said[0] == err[-1] and said[0].startswith("fic eval: terminated (SIGTERM); ")
    assert "resume=true" not in said[0]
    finished = (out / "conversations.jsonl").is_file() and (out / "conversations.jsonl").stat().st_size
    assert out.exists() == bool(finished)  # kept for a resume only when it holds a finished conversation


def test_fic_eval_killed_after_finished_conversations_keeps_them_and_resumes(tiny_model_dir, tmp_path, loaded):
    """A SIGTERM once some conversations are saved (the full view's, one turn each, while the sharded
    view's four turns go on): the folder stays, the line says how to resume an evaluation, and the
    same command then plays only the rest, the saved lines untouched."""
    data = tmp_path / "lic.jsonl"
    data.write_text("".join(json.dumps({**i, "shards": [{"shard_id": k + 1, "shard": f"Part {k + 1} of it."}
                                                        for k in range(4)]}) + "\n" for i in INSTANCES))
    out = tmp_path / "run"
    log = out / "conversations.jsonl"
    command = ["eval", "--quiet", f"model.model={tiny_model_dir}", f"data.source=lic:{data}", "views=[full,sharded]",
               "max_new_tokens=32", f"out={out}"]
    took, status, err = killed(command, ready=lambda: log.is_file() and log.stat().st_size > 0, cwd=tmp_path)
    assert status == 143 and took < SIGTERM_BOUND_S + MARGIN_S, (took, err)
    assert err[-1] == (f"fic eval: terminated (SIGTERM); the conversations finished before are kept in {log}; "
                       "run the same command again to resume"), err
    saved = log.read_text().splitlines()
    assert 0 < len(saved) < 2 * len(INSTANCES) and not (out / "metrics.json").exists()

    resumed = subprocess.run([sys.executable, "-m", "fic", *command], capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(saved)} already in the folder" in resumed.stdout
    lines = log.read_text().splitlines()
    assert lines[:len(saved)] == saved  # the finished conversations are kept as they were, not played again
    keys = [(r["task_id"], r["view"], r["run"]) for r in map(json.loads, lines)]
    assert len(keys) == len(set(keys)) == 2 * len(INSTANCES)


def test_fic_train_sft_ends_within_the_bound_and_keeps_its_checkpoints(tiny_model_dir, tmp_path, loaded):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 1? " * 20},
                                                       {"role": "assistant", "content": f"#### {i + 1}"}]}) + "\n"
                              for i in range(64)))
    out = tmp_path / "run"
    took, status, err = killed(["train", "sft", f"model.path={tiny_model_dir}", f"data.path={corpus}", f"out={out}",
                                "train.max_steps=100000", "train.micro_batch_size=2", "checkpoint.every=1",
                                "logging.wandb=false", "logging.progress=false"],
                               ready=lambda: (out / "checkpoints" / "step-2" / "complete").is_file(), cwd=tmp_path)
    assert status == 143 and took < SIGTERM_BOUND_S + MARGIN_S, (took, err)
    said = [line for line in err if "terminated" in line]  # beside it: the libraries' progress bars of saving
    assert len(said) == 1 and said[0] == err[-1] and said[0].startswith("fic train sft: terminated (SIGTERM)")
    assert (out / "checkpoints" / "step-2" / "complete").is_file()  # finished work is kept, to resume from
    last = max(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*") if (p / "complete").is_file())
    assert said[0].endswith(f"the checkpoints saved before are kept in {out / 'checkpoints'}; resume=true continues "
                            f"from step-{last}"), said
