"""Issue 20's user-side reliability cases: a broken model folder, `fic masks` and missing chat
template errors that name the file and record, SIGTERM in the middle of a write, a full disk
while a checkpoint is written. Each ends in one line naming what is wrong, and leaves no
temporary behind."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fic.cli.main import main
from fic.core.errors import FicError
from fic.core.model import load_model, load_tokenizer

pytestmark = pytest.mark.slow  # end to end: processes killed mid-write, full disks, real model folders

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- broken model folders

def _truncate(folder: Path, keep: float) -> None:
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:int(len(data) * keep)])


def _config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


BROKEN = {
    "truncated weights": (lambda f: _truncate(f, 0.5), "weights file (*.safetensors) is damaged"),
    "a cut header": (lambda f: _truncate(f, 0.00001), "weights file (*.safetensors) is damaged"),
    "empty weights": (lambda f: _truncate(f, 0), "weights file (*.safetensors) is damaged"),
    "unknown model_type": (lambda f: _config(f, model_type="llama-9000"), "model_type 'llama-9000'"),
    "no model_type": (lambda f: _config(f, model_type=None, architectures=None), "model_type"),
    "config of another model": (lambda f: _config(f, hidden_size=128), "do not fit the shapes"),
    "config not JSON": (lambda f: (f / "config.json").write_text("{not json"), "not a valid JSON"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "no file named model.safetensors"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_model_folder_names_the_folder_and_what_is_wrong(case, tiny_model_dir, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    damage, needle = BROKEN[case]
    damage(folder)
    with pytest.raises(FicError) as err:
        load_model(folder)
    assert str(err.value).startswith(f"{folder}: cannot load the model: ") and needle in str(err.value)
    assert "\n" not in str(err.value)
    # The same through a verb: one line, exit 2.
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"task_id": "t", "task": "math", "question": "Ann has 2 apples. She buys 3 more. "
                                "How many now?", "answer": "#### 5"}) + "\n")
    capsys.readouterr()
    assert main(["eval", f"model.model={folder}", f"data.source=jsonl:{data}", "views=[full]",
                 f"out={tmp_path / 'run'}", "--quiet"]) == 2
    printed = capsys.readouterr().err  # transformers may draw its loading bar first
    last = printed.strip().splitlines()[-1]
    assert "Traceback" not in printed and last.startswith("fic eval: error: ") and str(folder) in last
    assert needle in last


def test_a_tokenizer_without_chat_template_names_its_folder(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    _config_path = folder / "tokenizer_config.json"
    config = json.loads(_config_path.read_text())
    config.pop("chat_template", None)
    _config_path.write_text(json.dumps(config))
    with pytest.raises(FicError, match="has no chat template") as err:
        load_tokenizer(folder)
    assert err.value.path == str(folder)


# --------------------------------------------------------------------------- fic masks

MASKS = {
    "the final reply is not trained": ([{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": "yo", "train": False}], "train: false"),
    "a message without a role": ([{"content": "hi"}], "needs a 'role'"),
    "content that is a number": ([{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}],
                                 "cannot render"),
    "a message that is a string": (["hello"], "needs a 'role'"),
    "no messages": ([], "non-empty 'messages'"),
}


@pytest.mark.parametrize("case", sorted(MASKS))
def test_fic_masks_errors_name_the_file_and_the_record(case, smollm2_dir, tmp_path, capsys):
    messages, needle = MASKS[case]
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    data = tmp_path / "corpus.jsonl"
    data.write_text(json.dumps(good) + "\n" + json.dumps({"messages": messages}) + "\n")
    assert main(["masks", "--model", str(smollm2_dir), "--data", str(data), "--show", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fic masks: error: {data}: record 2: ") and needle in err
    assert len(err.splitlines()) == 1


# --------------------------------------------------------------------------- SIGTERM

SLOW_VERB = '''
import time
from fic.core.files import atomic_open

def add_arguments(parser, verb):
    parser.add_argument("out")

def run(args):
    with atomic_open(args.out) as handle:
        handle.write("partial")
        print("writing", flush=True)
        time.sleep(60)
        handle.write("rest")
    return 0
'''


def test_sigterm_during_a_write_leaves_no_temporary_and_one_line(tmp_path):
    (tmp_path / "slowverb.py").write_text(SLOW_VERB)
    script = ("import sys\nfrom fic.cli import main as m\n"
              "m.VERBS['slow-write'] = ('slowverb', 'writes slowly')\nsys.exit(m.main(sys.argv[1:]))\n")
    out = tmp_path / "out" / "result.json"
    child = subprocess.Popen([sys.executable, "-c", script, "slow-write", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"})
    assert child.stdout.readline().strip() == "writing"
    assert next(p.name for p in out.parent.iterdir()).startswith(".result.json.")  # the temporary exists now
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 143
    assert err.strip() == "fic slow-write: terminated (SIGTERM)"
    assert list(out.parent.iterdir()) == []  # neither the file nor its hidden temporary


# --------------------------------------------------------------------------- a full disk while checkpointing

@pytest.mark.usefixtures("fresh_accelerate_state")
@pytest.mark.parametrize("failure", ["torch", "enospc", "safetensors"])
def test_a_full_disk_while_checkpointing_is_one_line_and_removes_the_partial_copy(failure, tiny_model_dir, tmp_path,
                                                                                    monkeypatch):
    from accelerate import Accelerator

    from fic.core.config import load_config
    from fic.train_sft import train
    from fic.training.sft import SFTConfig

    def full_disk(self, output_dir, **kwargs):
        Path(output_dir, "model.safetensors").write_bytes(b"\0" * 4096)  # what was written before the disk filled
        if failure == "torch":
            raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                               "data/3: file write failed; unexpected pos 7232 vs 7120")
        if failure == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
                           'left on device" })')

    monkeypatch.setattr(Accelerator, "save_state", full_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{i} + 1?"},
                                                       {"role": "assistant", "content": f"#### {i + 1}"}]}) + "\n"
                              for i in range(4)))
    out = tmp_path / "run"
    cfg = load_config(SFTConfig, None, [f"model.path={tiny_model_dir}", f"data.path={corpus}", f"out={out}",
                                        "train.max_steps=1", "checkpoint.every=1", "logging.wandb=false",
                                        "logging.progress=false", "train.micro_batch_size=2"])
    with pytest.raises(FicError, match="no space left on the device while writing checkpoint step-1") as err:
        train(cfg)
    assert "resume=true" in str(err.value)
    # the partial .step-1.tmp is gone; the run's marker stays
    assert [p.name for p in (out / "checkpoints").iterdir()] == [".fic-run"]
