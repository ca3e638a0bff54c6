"""Pushing to the hub (`fic push`, `hub.push=true`): huggingface_hub's API is replaced at its public
entry points (`HfApi.create_repo`, `create_branch`, `upload_folder`) by a recorder that keeps what
each upload held; no hub is reachable here. A missing token or a failed upload is one line, exit 2,
with nothing local changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError

from fic.cli.main import main
from fic.core.config import load_config
from fic.core.errors import FicError

TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The hub's calls, recorded: repos made, branches, and each upload's files and their text."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored token from the machine
    for name in TOKEN_VARS:
        monkeypatch.delenv(name, raising=False)
    calls = {"repos": [], "branches": [], "uploads": []}

    def create_repo(self, repo_id, **kw):
        calls["repos"].append({"repo_id": repo_id, **kw})

    def create_branch(self, repo_id, **kw):
        calls["branches"].append({"repo_id": repo_id, **kw})

    def upload_folder(self, *, repo_id, folder_path, **kw):
        folder = Path(folder_path)
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        calls["uploads"].append({"repo_id": repo_id, "files": files, **kw})

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_branch", create_branch)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def dataset(tmp_path) -> Path:
    data = tmp_path / "data" / "x.jsonl"
    assert main(["shard", "--source", "actions-gen:train", "--task", "actions", "--limit", "3", "--out", str(data)]) == 0
    data.with_suffix(".card.json").write_text(json.dumps({"file": str(data), "built_by": "fic shard", "written": 3}))
    return data


def only_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_a_dataset_goes_to_a_dataset_repo_with_its_card_and_a_readme_datasets_reads(hub, tmp_path, monkeypatch,
                                                                                  capsys):
    data = dataset(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    before = sorted(p.name for p in data.parent.iterdir())
    capsys.readouterr()
    assert main(["push", str(data), "--repo-id", "me/lost-actions", "--revision", "v1"]) == 0
    assert "pushed" in capsys.readouterr().out
    [repo] = hub["repos"]
    assert repo["repo_id"] == "me/lost-actions" and repo["repo_type"] == "dataset" and repo["private"] is True
    assert hub["branches"] == [{"repo_id": "me/lost-actions", "branch": "v1", "repo_type": "dataset", "exist_ok": True}]
    [upload] = hub["uploads"]
    assert upload["repo_type"] == "dataset" and upload["revision"] == "v1"
    assert sorted(upload["files"]) == ["README.md", "x.card.json", "x.jsonl"]
    assert upload["files"]["x.jsonl"] == data.read_bytes()
    readme = upload["files"]["README.md"].decode()
    assert "data_files: x.jsonl" in readme and "built_by" in readme
    assert sorted(p.name for p in data.parent.iterdir()) == before  # staged elsewhere: nothing added here


def test_a_dry_run_says_what_would_go_and_uploads_nothing(hub, tmp_path, monkeypatch, capsys):
    data = dataset(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    capsys.readouterr()
    assert main(["push", str(data), "--repo-id", "me/d", "--public", "--dry-run"]) == 0
    line = only_line(capsys.readouterr().out)
    assert "x.jsonl, x.card.json, README.md" in line and "datasets/me/d" in line and "public" in line
    assert hub == {"repos": [], "branches": [], "uploads": []}


def test_no_token_is_one_line_and_nothing_is_sent(hub, tmp_path, capsys):
    data = dataset(tmp_path)
    capsys.readouterr()
    assert main(["push", str(data), "--repo-id", "me/d"]) == 2
    line = only_line(capsys.readouterr().err)
    assert "needs a token" in line and "HF_TOKEN" in line
    assert hub["uploads"] == [] and hub["repos"] == []


@pytest.mark.parametrize("repo_id", ["lost-actions", "a/b/c", "/b"])
def test_a_repo_id_that_is_not_user_slash_name_is_refused(hub, tmp_path, monkeypatch, capsys, repo_id):
    data = dataset(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    capsys.readouterr()
    assert main(["push", str(data), "--repo-id", repo_id]) == 2
    assert "USER/NAME" in only_line(capsys.readouterr().err)


def test_a_failed_upload_is_one_line_and_leaves_the_files_as_they_were(hub, tmp_path, monkeypatch, capsys):
    import httpx2

    data = dataset(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    before = {p.name: p.read_bytes() for p in data.parent.iterdir()}

    def refused(self, **kw):
        response = httpx2.Response(403, request=httpx2.Request("POST", "https://huggingface.co/api"))
        raise HfHubHTTPError("403 Forbidden: you do not have write access\nto me/d", response=response)

    monkeypatch.setattr(HfApi, "upload_folder", refused)
    capsys.readouterr()
    assert main(["push", str(data), "--repo-id", "me/d"]) == 2
    line = only_line(capsys.readouterr().err)
    assert "the push to me/d failed" in line and "403 Forbidden" in line and f"fic push {data} --repo-id me/d" in line
    assert {p.name: p.read_bytes() for p in data.parent.iterdir()} == before


def test_a_path_that_is_neither_a_model_nor_a_dataset_is_refused(hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    (tmp_path / "notes").mkdir()
    assert main(["push", str(tmp_path / "notes"), "--repo-id", "me/m"]) == 2
    assert "expected a model folder" in only_line(capsys.readouterr().err)


# ---------------------------------------------------------------- training runs: hub.push

def test_a_training_run_that_would_push_without_a_token_stops_at_load(hub, tmp_path):
    from fic.training.sft import SFTConfig

    with pytest.raises(FicError) as err:
        load_config(SFTConfig, None, ["hub.push=true", "hub.repo_id=me/m", f"out={tmp_path / 'run'}"])
    assert err.value.field == "hub.repo_id" and "needs a token" in str(err.value)
    with pytest.raises(FicError, match="USER/NAME"):
        load_config(SFTConfig, None, ["hub.push=true"])
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_sft_pushes_its_final_model_with_its_card(hub, tiny_model_dir, tmp_path, monkeypatch, capsys):
    from fic.train_sft import plan, train
    from fic.training.sft import SFTConfig
    from tests.training.test_checkpoint_models import write_corpus

    monkeypatch.setenv("HF_TOKEN", "hf_test")
    out = tmp_path / "run"
    cfg = load_config(SFTConfig, None, [
        f"model.path={tiny_model_dir}", f"data.path={write_corpus(tmp_path / 'c.sft.jsonl')}", f"out={out}",
        "train.micro_batch_size=2", "train.max_steps=1", "checkpoint.every=0", "logging.wandb=false",
        "logging.progress=false", "hub.push=true", "hub.repo_id=me/fic-sft", "hub.private=false"])
    assert "pushed to the hub as me/fic-sft (public if new)" in plan(cfg)
    train(cfg)
    [repo] = hub["repos"]
    assert repo["repo_id"] == "me/fic-sft" and repo["repo_type"] == "model" and repo["private"] is False
    [upload] = hub["uploads"]
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json"} <= set(upload["files"])
    assert upload["files"]["README.md"] == (out / "final" / "README.md").read_bytes()
    card = upload["files"]["README.md"].decode()
    assert f"base_model: {tiny_model_dir}" in card and "## Config" in card
    assert f"pushed {out / 'final'} to https://huggingface.co/me/fic-sft" in capsys.readouterr().out
