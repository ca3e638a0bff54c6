"""Resumable checkpoints and the final model folder.

`out/checkpoints/step-N/` holds what Accelerate saves (weights, or only the adapter for LoRA;
optimizer; scheduler; every RNG), plus `trainer_state.json` (step, data position, the
resolved config, the data's sha256), `model/` (the trained network as a Hugging Face folder:
config, weights or the adapter, tokenizer; `checkpoint.model_folder`) and a `complete` marker
written last. A checkpoint is
written under a temporary name and renamed, so a kill at any moment leaves either a complete
checkpoint or none; folders without the marker are never resumed from.

No checkpoint folder is written, rotated or deleted through a link (a `checkpoints` or `step-N`
link is refused, the target untouched), and rotation deletes only the checkpoints this run's
folder made (their `.fic-run` marker holds the token of `out`; `fic.core.files.run_token`).

Resuming refuses settings that change what the saved state means (each recipe lists them in
its `MUST_MATCH`), a different data file, or a different number of processes, and names the
settings that changed but may (learning rate, logging, ...).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from fic import __version__
from fic.core.config import config_to_dict, flatten
from fic.core.errors import FicError, sigterm_note
from fic.core.files import (
    RUN_MARKER,
    check_no_link,
    guard_out,
    make_folder,
    owned,
    publish_folder,
    remove_folder,
    run_token,
    unlock_folder,
    write_json,
    write_text,
)
from fic.core.model import CHECKPOINT_MODEL, check_model_folder
from fic.core.push import push
from fic.core.records import read_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "vocab.txt", "spiece.model")


def checkpoint_dir(out: Path) -> Path:
    return out / "checkpoints"


def step_of(path: Path) -> int | None:
    """The step a `step-N` checkpoint folder holds; None for any other name."""
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        return None
    return int(name[5:])


def complete_checkpoints(out: Path) -> list[Path]:
    """Finished checkpoints, oldest first (folders without the `complete` marker are skipped). A
    link at `checkpoints` or at a `step-N` is a `FicError`: the run would write through it."""
    folder = checkpoint_dir(out)
    check_no_link(folder, root=out)
    if not folder.is_dir():
        return []
    steps = [p for p in folder.iterdir() if step_of(p) is not None]
    for path in steps:
        check_no_link(path, root=out)
    found = [p for p in steps if p.is_dir() and (p / "complete").is_file()]
    return sorted(found, key=step_of)


def lora_state_hooks(accelerator: Any, trainable: set[str]) -> None:
    """With LoRA, checkpoints hold only the trainable (adapter) weights, not the frozen base.
    `trainable`: their names in the unwrapped module, as Accelerate's saved state names them (under
    DDP the wrapper's own names carry `module.`, and no adapter tensor matched)."""

    def save_hook(models: list, weights: list, output_dir: str) -> None:
        for i, state in enumerate(weights):
            weights[i] = {k: v for k, v in state.items() if k in trainable}

    def load_hook(models: list, input_dir: str) -> None:
        from safetensors.torch import load_file

        for i, model in enumerate(models):
            name = "model.safetensors" if i == 0 else f"model_{i}.safetensors"
            state = load_file(os.path.join(input_dir, name))
            if set(state) != trainable:
                raise FicError(f"holds {len(state)} adapter tensors, the model has {len(trainable)} trainable ones",
                               path=input_dir)
            accelerator.unwrap_model(model).load_state_dict(state, strict=False)  # the names it was saved under
        models.clear()  # loaded here; accelerate would load them strictly

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def save_checkpoint(accelerator: Any, out: Path, step: int, state: dict, *, keep_last: int, lora: bool,
                    extra: Callable[[Path], None] | None = None, cfg: Any = None) -> Path:
    """Write `out/checkpoints/step-N` atomically (temp folder, `complete` marker, rename) and
    delete all but the newest `keep_last` complete checkpoints. Every rank must call it.
    `extra(folder)` writes recipe-specific files (e.g. an EMA teacher) on the main process. With
    `cfg` (a run config whose `checkpoint.model_folder` is on), the checkpoint also holds `model/`,
    the trained network as a Hugging Face folder (`AutoModelForCausalLM.from_pretrained`, `fic eval
    model.model=.../step-N`; the adapter for LoRA), written from the run's prepared loss module."""
    from accelerate.utils import DistributedType

    check_finite_weights(accelerator, f"at step {step}")
    final = checkpoint_dir(out) / f"step-{step}"
    tmp = checkpoint_dir(out) / f".step-{step}.tmp"
    guard_out(out)  # every rank: no folder below `out` is written through a link
    token = run_token(out) if accelerator.is_main_process else None
    if accelerator.is_main_process:
        make_folder(checkpoint_dir(out), token=token)  # checkpoints copied in, or of older FiC, may be there
        for stale in checkpoint_dir(out).glob(".step-*.tmp"):  # left by a run killed while writing
            if owned(stale, token):
                remove_folder(stale, token)
        make_folder(tmp, token=token)
    accelerator.wait_for_everyone()
    kwargs = {}
    if lora and accelerator.distributed_type == DistributedType.DEEPSPEED:
        kwargs["exclude_frozen_parameters"] = True
    model_only = cfg is not None and cfg.checkpoint.save_only_model
    with _removed_on_failure(accelerator, tmp, f"checkpoint step-{step}", token), sigterm_note(
            f"while writing checkpoint step-{step}: its partial copy is removed at the next save"):
        if not model_only:
            accelerator.save_state(str(tmp), safe_serialization=True, **kwargs)
        if cfg is not None and cfg.checkpoint.model_folder:  # every rank: ZeRO-3 gathers the weights
            write_model_folder(accelerator, accelerator._models[0], cfg, tmp / CHECKPOINT_MODEL,
                               checkpoint_card(cfg, out, step))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if extra is not None and not model_only:  # the rest of the resumable state (VASD's EMA teacher)
                extra(tmp)
            write_json(tmp / "trainer_state.json", {**state, "model_only": model_only})
            write_text(tmp / "complete", f"step {step}\n")
            publish_folder(tmp, final, token)  # a step-N of the user's in the way is refused, not replaced
    if accelerator.is_main_process:
        # A checkpoint this folder's runs did not make (one copied in, or written before FiC marked
        # its folders) is not this run's to delete: it is kept.
        for old in [p for p in complete_checkpoints(out) if owned(p, token)][:-keep_last]:
            remove_folder(old, token)
    accelerator.wait_for_everyone()
    return final


DISK_FULL_TEXTS = ("No space left", "StorageFull", "Disk quota", "os error 28")
# What torch's zip writer says when a write comes up short; a full disk unless space is plentiful.
SHORT_WRITE_TEXTS = ("unexpected pos", "file write failed")


def disk_full(err: BaseException, folder: Path) -> bool:
    """Whether `err`, raised while writing into `folder`, means the disk (or quota) is full."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    if any(t in text for t in DISK_FULL_TEXTS):
        return True
    if any(t in text for t in SHORT_WRITE_TEXTS):
        try:
            return shutil.disk_usage(folder).free < (256 << 20)
        except OSError:
            return True
    return False


@contextlib.contextmanager
def _removed_on_failure(accelerator: Any, tmp: Path, what: str, token: str | None) -> Iterator[None]:
    """Remove the half-written `tmp` (the main process's, made by the run of `token`) when writing
    it fails (it would keep a full disk full), and say "no space left" in one line instead of
    torch's "unexpected pos"."""
    try:
        yield
    except BaseException as err:
        full = isinstance(err, Exception) and disk_full(err, tmp.parent)
        if accelerator.is_main_process:
            with contextlib.suppress(FicError, OSError):  # the error that stopped the save is the one to say
                remove_folder(tmp, token)
        if full:
            raise FicError(f"no space left on the device while writing {what}; the partial copy was removed. Free "
                           "some space and run again with resume=true", path=str(tmp.parent)) from None
        raise


def check_finite_weights(accelerator: Any, when: str) -> None:
    """Refuse to save weights that hold NaN or inf (an update with a huge learning rate makes
    them so before any loss shows it). Every rank checks its own parameters; the verdict is
    shared so that all ranks stop together. Every rank must call it."""
    import torch

    bad = 0
    for model in getattr(accelerator, "_models", []):
        for name, param in model.named_parameters():
            if param.requires_grad and param.numel() and not bool(torch.isfinite(param.detach()).all()):
                bad += 1
    if accelerator.num_processes > 1:
        bad = int(accelerator.reduce(torch.tensor([bad], device=accelerator.device), reduction="sum").item())
    if bad:
        raise FicError(f"{bad} trained weight tensor(s) hold NaN or inf {when}: training diverged (try a lower "
                       "optim.lr); nothing was saved", field="optim.lr")


def find_resume(out: Path) -> tuple[Path, dict, list[str]]:
    """The newest complete checkpoint, its trainer state, and the names of newer incomplete
    folders passed over (a kill while writing them); a FicError saying why there is none."""
    folder = checkpoint_dir(out)
    found = complete_checkpoints(out)
    if not found:
        partial = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        why = f" (only incomplete ones: {', '.join(partial)})" if partial else ""
        raise FicError(f"resume=true but there is no complete checkpoint in {folder}{why}; "
                       "start without resume=true or point out= at the run to continue", field="resume")
    path = found[-1]
    skipped = sorted((p.name for p in folder.iterdir() if p.is_dir() and (step_of(p) or 0) > step_of(path)),
                     key=lambda name: int(name[5:]))
    try:
        state = read_json(path / "trainer_state.json")
        int(state["step"]), dict(state["config"])
    except (FicError, OSError, ValueError, KeyError, TypeError) as err:
        raise FicError(f"checkpoint is damaged (trainer_state.json: {err}); delete this folder to resume "
                       "from the one before it", path=str(path)) from None
    if state.get("model_only"):
        raise FicError("resume=true but this checkpoint holds the model only (checkpoint.save_only_model=true): no "
                       "optimizer, scheduler or RNG state to continue from; start a new run from its model/ "
                       "(model.path=.../model) or without resume=true", path=str(path), field="resume")
    return path, state, skipped


def check_compatible(saved: dict, cfg: Any, must_match: Sequence[str], data_sha: str, *, data_name: str, world: int,
                     where: Path) -> list[str]:
    """FicError when a setting that must match the checkpoint differs; the names of other changed settings."""
    now = config_to_dict(cfg)
    flat_saved, flat_now = flatten(saved["config"]), flatten(now)
    # A setting newer than the checkpoint, left at its default, changes nothing that was trained.
    defaults = flatten(config_to_dict(type(cfg)()))
    flat_now = {k: v for k, v in flat_now.items() if k in flat_saved or k not in defaults or defaults[k] != v}

    def get(flat: dict, key: str) -> Any:  # a key names a leaf or a whole section
        return {k: v for k, v in flat.items() if k == key or k.startswith(key + ".")}

    differs = [key for key in must_match if get(flat_saved, key) != get(flat_now, key)]
    if saved.get("data_sha256") != data_sha:
        differs.append(f"data file contents ({data_name})")
    if saved.get("world_size", world) != world:
        differs.append(f"number of processes ({saved.get('world_size')} -> {world})")
    if differs:
        raise FicError(f"cannot resume: {', '.join(differs)} differ from the checkpoint; resume with the settings "
                       "it was written with, or start a new run in another out folder", path=str(where))
    return sorted(k for k in flat_now if flat_saved.get(k) != flat_now[k] and k != "resume")


def load_checkpoint(accelerator: Any, path: Path, lora: bool) -> None:
    from accelerate.utils import DistributedType

    kwargs = {}
    if lora and accelerator.distributed_type == DistributedType.DEEPSPEED:
        kwargs["load_module_strict"] = False
    try:
        accelerator.load_state(str(path), **kwargs)
    except FicError:
        raise
    except Exception as err:  # truncated or missing files: tell the user which checkpoint, not a traceback
        raise FicError(f"checkpoint is damaged and cannot be loaded ({type(err).__name__}: {err}); delete this "
                       "folder to resume from the one before it", path=str(path)) from None


# --------------------------------------------------------------------------- final model

def copy_tokenizer(src: str, dst: Path) -> None:
    """The tokenizer files of the model folder `src` (a checkpoint's `model/` when `src` is one)
    into `dst`; a hub model's are in the hub's cache, not copied."""
    folder = check_model_folder(src, adapter_ok=True)
    for name in TOKENIZER_FILES:
        if isinstance(folder, Path) and (folder / name).is_file():
            shutil.copy(folder / name, dst / name)


def checkpoint_card(cfg: Any, out: Path, step: int) -> str:
    """The README of a checkpoint's `model/` folder."""
    kind = "a LoRA adapter over" if cfg.lora.enabled else "a full model trained from"
    return (f"# Checkpoint step-{step} of `{out}`\n\nThe model at optimizer step {step} of the FiC training run in "
            f"`{out}`: {kind} `{cfg.model.path}`. It loads with `AutoModelForCausalLM.from_pretrained` (an adapter "
            "needs peft) and with `fic eval model.model=<this checkpoint>`; the resumable state (optimizer, RNG, "
            "data position) is in the folder above. The run's config is its `config.yaml`.\n")


def write_model_folder(accelerator: Any, loss_model: Any, cfg: Any, folder: Path, card: str) -> None:
    """The trained network of `loss_model` (its `.model`) as a Hugging Face folder: config, weights
    (the adapter for LoRA), generation config, the tokenizer of `cfg.model.path` and `card` as its
    README. Every rank must call it (ZeRO-3 gathers the weights); the main process writes."""
    state = accelerator.get_state_dict(loss_model)  # full weights on the main process, also under ZeRO-3
    if not accelerator.is_main_process:
        return
    inner = accelerator.unwrap_model(loss_model).model
    state = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    inner.save_pretrained(folder, state_dict=state, safe_serialization=True)
    copy_tokenizer(cfg.model.path, folder)
    write_text(folder / "README.md", card)


def save_final(accelerator: Any, loss_model: Any, cfg: Any, out: Path, card: Callable[[str], str]) -> Path:
    """Save the trained model as a Hugging Face folder (`out/final`; the adapter for LoRA) and,
    for LoRA with save_merged, the merged model (`out/final-merged`), each with the model card
    `card(kind)`. Every rank must call it (ZeRO-3 gathers the weights). `loss_model.model` is
    the trained network."""
    check_finite_weights(accelerator, "at the end of training")
    final, tmp = out / "final", out / ".final.tmp"
    guard_out(out)
    token = run_token(out) if accelerator.is_main_process else None
    if accelerator.is_main_process:
        _fresh_temporary(tmp, token)
    with _removed_on_failure(accelerator, tmp, "the final model", token):
        write_model_folder(accelerator, loss_model, cfg, tmp, card("LoRA adapter" if cfg.lora.enabled else "full model"))
        if accelerator.is_main_process:
            _publish_model(tmp, final)
    if accelerator.is_main_process:
        if cfg.save_merged:
            from peft import PeftModel

            from fic.core.model import load_model  # lazy, as peft: only a LoRA run merges

            base = load_model(cfg.model.path, dtype=cfg.model.weights_dtype, trust_remote_code=cfg.model.trust_remote_code)
            merged = PeftModel.from_pretrained(base, final).merge_and_unload()
            tmp = out / ".final-merged.tmp"
            _fresh_temporary(tmp, token)
            with _removed_on_failure(accelerator, tmp, "the merged model", token):
                merged.save_pretrained(tmp, safe_serialization=True)
                copy_tokenizer(cfg.model.path, tmp)
                write_text(tmp / "README.md", card("LoRA merged into the base model"))
                _publish_model(tmp, out / "final-merged")
        unlock_folder(out)  # taken by `fic.training.loop.make_accelerator`
    accelerator.wait_for_everyone()
    if cfg.hub.push and accelerator.is_main_process:  # after the barrier: a failed push strands no rank
        url = push(final, cfg.hub.repo_id, private=cfg.hub.private, revision=cfg.hub.revision)
        accelerator.print(f"pushed {final} to {url}")
    return final


def _fresh_temporary(tmp: Path, token: str) -> None:
    """An empty temporary folder `tmp`, marked as the run of `token`'s; a stale one of an earlier
    run into the same folder (killed while writing) is deleted first."""
    remove_folder(tmp, token)
    make_folder(tmp, token=token)


def _publish_model(tmp: Path, final: Path) -> None:
    """Publish a model folder without FiC's marker: it is the user's to load, copy and upload. The
    marker goes once it is published: a failed publish leaves a temporary that is still the run's
    to remove."""
    publish_folder(tmp, final)
    (final / RUN_MARKER).unlink(missing_ok=True)


def saving_clause(cfg: Any) -> str:
    """The start line's clauses on what the run saves beyond its final model: the disk each
    checkpoint takes (`checkpoint_sizes`) and the push at the end (`hub.push`)."""
    clauses = []
    sizes = checkpoint_sizes(cfg) if cfg.checkpoint.every else None
    if sizes is not None:
        gb = {k: f"{v / 1e9:.2f} GB" for k, v in sizes.items()}
        if cfg.checkpoint.save_only_model:
            clauses.append(f"each checkpoint about {gb['model']} on disk (the model only: not resumable)")
        elif not cfg.checkpoint.model_folder:
            clauses.append(f"each checkpoint about {gb['total']} on disk (the resumable state only: weights, "
                           f"optimizer, RNG), the last {cfg.checkpoint.keep_last} kept")
        else:
            clauses.append(f"each checkpoint about {gb['total']} on disk ({gb['state']} resumable state: weights, "
                           f"optimizer, RNG; {gb['model']} model/; checkpoint.save_only_model=true: {gb['model']}), "
                           f"the last {cfg.checkpoint.keep_last} kept")
    if cfg.hub.push:
        where = f"{cfg.hub.repo_id}" + (f" branch {cfg.hub.revision}" if cfg.hub.revision else "")
        what = "the LoRA adapter" if cfg.lora.enabled else "the model"
        new = "private" if cfg.hub.private else "public"
        clauses.append(f"then {what} in {Path(cfg.out) / 'final'} pushed to the hub as {where} ({new} if new)")
    return "".join(f"; {c}" for c in clauses)


def checkpoint_sizes(cfg: Any) -> dict[str, int] | None:
    """Bytes a checkpoint of `cfg` takes, from the model's config (built on the meta device: no
    weights load): `state` (what Accelerate saves: the trained weights and AdamW's two moments,
    plus an EMA teacher), `model` (`model/`: the weights, or the adapter), `total` (what this
    run's `checkpoint.*` writes). None when the model's config cannot be read here (the run's
    model load then says why)."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
        with init_empty_weights():
            # The class itself where transformers knows it: `from_config` builds under DeepSpeed's
            # zero.Init once a ZeRO-3 launch is set up, which cannot partition meta tensors (every
            # ZeRO-3 run failed at its start line).
            known = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
            model = known(config) if known is not None else \
                AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.model.trust_remote_code)
        model.tie_weights()  # on the meta device tied weights are two tensors until tied again
    except (OSError, ValueError, KeyError, ImportError):
        return None
    width = torch.empty(0, dtype=getattr(torch, cfg.model.weights_dtype)).element_size()
    weights = sum(p.numel() for p in model.parameters())  # tied weights once, as safetensors stores them
    if cfg.lora.enabled:
        targets = set(cfg.lora.target_modules)
        trained = sum(cfg.lora.r * (m.in_features + m.out_features) for name, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets)
        saved = trained
    else:
        trained = saved = weights
    ema = trained * 4 if getattr(getattr(cfg, "teacher", None), "mode", None) == "ema" else 0  # float32 average
    state = saved * width + 2 * trained * width + ema
    model_bytes = saved * width if cfg.checkpoint.model_folder else 0
    total = model_bytes if cfg.checkpoint.save_only_model else state + model_bytes
    return {"state": state, "model": model_bytes, "total": total}


def model_card(cfg: Any, *, title: str, tags: Sequence[str], summary: str, facts: Sequence[str], kind: str) -> str:
    """A model card (`README.md` of a saved model): what trained it, on what, with which config."""
    import yaml


    config_yaml = yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
    method = (f"LoRA r={cfg.lora.r} alpha={cfg.lora.alpha} on {', '.join(cfg.lora.target_modules)}"
              if cfg.lora.enabled else "full fine-tuning")
    library = "peft" if kind == "LoRA adapter" else "transformers"
    return "\n".join([
        "---", f"base_model: {cfg.model.path}", f"library_name: {library}", f"tags: [{', '.join(tags)}]", "---", "",
        f"# {title} ({kind})", "", f"{summary} (FiC {__version__}).", "",
        f"- Base model: `{cfg.model.path}`", *[f"- {fact}" for fact in facts], f"- Method: {method}",
        "", "## Config", "", "```yaml", config_yaml.rstrip(), "```", ""])
