"""Pushing to the Hugging Face hub: a trained model or adapter (a Hugging Face folder with the model
card FiC wrote as its README) or a dataset FiC wrote (a JSONL file with its `.card.json`), through
`huggingface_hub`'s `HfApi.create_repo` and `HfApi.upload_folder`, as TRL's and `datasets`'
`push_to_hub` do.

`check` runs before any work (the token, the repository id), so a run that would fail to push stops
in its first second, not after training; `push` makes the repository if it is new and uploads in
one commit. A dataset is uploaded from a staging folder outside the user's tree (the file, its card,
a README whose `configs` let `datasets.load_dataset(REPO)` read it), so a failed upload leaves
nothing local half-done; the error is one line saying what is kept and how to push it again.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fic.core.config import setting
from fic.core.errors import FicError

MODEL_FILES = ("config.json", "adapter_config.json")  # a folder holding one is a model (or an adapter)


@dataclass
class HubSection:
    push: bool = setting(False, "Push the final model (the LoRA adapter for LoRA; the model card, with the run's "
                         "config, as its README) to the Hugging Face hub at the end of the run; the token "
                         "(`hf auth login` or HF_TOKEN) and hub.repo_id are checked at start. `fic push FOLDER` "
                         "pushes a saved model or dataset later.")
    repo_id: str | None = setting(None, "The hub repository, USER/NAME or ORG/NAME; made if it does not exist.")
    private: bool = setting(True, "Make a new repository private (an existing one keeps its visibility).")
    revision: str | None = setting(None, "The branch to push to (default: the repository's main branch).")

    def check(self, source: str | None) -> None:
        if self.push:
            check(self.repo_id, source, field="repo_id")


def check(repo_id: str | None, source: str | None = None, field: str | None = None) -> None:
    """Refuse, in one line, a push that cannot work: no repository id, or no token to push with."""
    if not repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise FicError(f"expected a hub repository as USER/NAME or ORG/NAME, got {repo_id!r}", path=source,
                       field=field)
    from huggingface_hub import get_token

    if not get_token():
        raise FicError("pushing to the hub needs a token: run `hf auth login` or set HF_TOKEN (a token with write "
                       "access)", path=source, field=field)


def kind_of(path: Path) -> str:
    """`model` for a model or adapter folder, `dataset` for a JSONL file FiC wrote; else a FicError."""
    if path.is_dir() and any((path / name).is_file() for name in MODEL_FILES):
        return "model"
    if path.is_file() and path.suffix == ".jsonl":
        return "dataset"
    raise FicError("expected a model folder (config.json or adapter_config.json: out/final, out/final-merged, "
                   "out/checkpoints/step-N/model) or a JSONL dataset (out of fic shard or fic sft-data)", path=str(path))


def plan(path: Path, repo_id: str, *, private: bool, revision: str | None) -> str:
    """What `push` would upload, in one line (`--dry-run`, the start line of a run that pushes)."""
    kind = kind_of(path)
    files = sorted(p.name for p in path.iterdir() if p.is_file()) if kind == "model" else _dataset_files(path)
    where = f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{repo_id}"
    return (f"push {path} ({kind}: {', '.join(files)}) to {where}" + (f" branch {revision}" if revision else "")
            + (" (a new repository is private)" if private else " (a new repository is public)"))


def push(path: Path, repo_id: str, *, private: bool, revision: str | None) -> str:
    """Upload `path` (a model folder or a JSONL dataset) to `repo_id` in one commit; its URL."""
    from huggingface_hub import HfApi

    check(repo_id)
    kind = kind_of(path)
    api = HfApi()
    with tempfile.TemporaryDirectory(prefix="fic-push-") as staging:
        folder = path if kind == "model" else _stage_dataset(path, Path(staging))
        try:
            api.create_repo(repo_id, repo_type=kind, private=private, exist_ok=True)
            if revision:
                api.create_branch(repo_id, branch=revision, repo_type=kind, exist_ok=True)
            api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type=kind, revision=revision,
                              commit_message=f"Upload {path.name} with FiC")
        except FicError:
            raise
        except Exception as err:  # HTTP, auth, network: one line, whatever huggingface_hub raised
            text = " ".join(str(err).split())[:300]
            raise FicError(f"the push to {repo_id} failed ({type(err).__name__}: {text}); {path} is unchanged: push it "
                           f"again with `fic push {path} --repo-id {repo_id}`", path=str(path)) from None
    return f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{repo_id}"


def _card_of(path: Path) -> Path:
    return path.with_suffix(".card.json")


def _dataset_files(path: Path) -> list[str]:
    card = _card_of(path)
    return [path.name, *([card.name] if card.is_file() else []), "README.md"]


def _stage_dataset(path: Path, staging: Path) -> Path:
    """The dataset's files in `staging`: the JSONL, its card, and a dataset card (README.md) whose
    `configs` name the file, so `datasets.load_dataset(REPO)` reads it."""
    card = _card_of(path)
    shutil.copy(path, staging / path.name)
    facts = []
    if card.is_file():
        shutil.copy(card, staging / card.name)
        try:
            info = json.loads(card.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise FicError(f"cannot read the data card ({err})", path=str(card)) from None
        facts = [f"- {key}: `{json.dumps(value, ensure_ascii=False)[:200]}`" for key, value in info.items()
                 if isinstance(value, (str, int, float, list)) and not isinstance(value, bool)][:20]
    readme = "\n".join([
        "---", "configs:", "- config_name: default", f"  data_files: {path.name}", "tags: [fic, multi-turn, sharded]",
        "---", "", f"# {path.stem}", "",
        f"Written by FiC (Found in Conversation): `{path.name}`, one record a line"
        + (f"; where it came from is `{card.name}`:" if card.is_file() else "."), "", *facts, ""])
    (staging / "README.md").write_text(readme, encoding="utf-8")
    return staging
