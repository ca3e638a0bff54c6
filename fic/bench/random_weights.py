"""Model folders with random weights: an architecture, SmolLM2's tokenizer, no hub.

    python -m fic.bench.random_weights --out DIR --tokenizer DIR [--layers N] [--device cuda]
        [--set hidden_size=64 ...]                 # SmolLM2-135M-Instruct's shape (`SMOLLM2`)

A shape holds the architecture fields of a model's `config.json` (hidden size, layers, heads, KV
heads, intermediate size, vocabulary, RoPE settings, tied embeddings, model type) and the page they
were copied from. `build_random_model` makes a Hugging Face folder of that architecture with random
weights (initialised by transformers, `initializer_range` 0.02, on `device`: a GPU builds a 14B
model in seconds) and SmolLM2's tokenizer. The vocabulary stays the real model's, so the embedding
and the LM head cost what they cost in the real model; the tokenizer's 49,152 ids are a subset of
it and the special-token ids are SmolLM2's. Every figure made on such a folder is a figure of random
weights: `fic_random.json` in the folder says so. `fic bench zero` trains a few layers of SmolLM2's
shape; the repository's GPU-session tools build the backbones' shapes with the same function.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from fic.core.errors import FicError, exit_status
from fic.core.files import publish_folder
from fic.core.model import BUNDLED_MODEL_DIR

RANDOM_MARKER = "fic_random.json"
TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "chat_template")
# The architecture fields of SmolLM2-135M-Instruct's config.json (weights, tokenizer and special-token
# ids left out: the folder gets random weights and SmolLM2's tokenizer).
SMOLLM2 = {
    "backbone": "smollm2-135m-instruct",
    "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "source": "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json",
    "config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
               "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
               "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
               "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 100000.0, "attention_bias": False,
               "mlp_bias": False, "tie_word_embeddings": True, "initializer_range": 0.02},
}


def parse_sets(items: list[str] | None) -> dict:
    """`key=value` config overrides (values read as JSON where they parse: numbers, true, null)."""
    found = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise FicError(f"expected key=value, got {item!r}", field="--set")
        try:
            found[key.strip()] = json.loads(raw)
        except ValueError:
            found[key.strip()] = raw
    return found


def make_config(shape: dict, layers: int | None = None, sets: dict | None = None, tokenizer: Any = None) -> Any:
    """The transformers config of a shape, with `sets` applied, `layers` decoder layers and, given
    a tokenizer, its special-token ids."""
    from transformers import AutoConfig

    fields = {**shape["config"], **(sets or {})}
    model_type = fields.pop("model_type")
    if layers is not None:
        fields["num_hidden_layers"] = int(layers)
    if tokenizer is not None:
        if fields["vocab_size"] < len(tokenizer):
            raise FicError(f"vocab_size {fields['vocab_size']} is smaller than the tokenizer's {len(tokenizer)} ids",
                           field="--set")
        fields.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    return AutoConfig.for_model(model_type, **fields)


# --------------------------------------------------------------------------- the tokenizer

def tokenizer_dir(given: str | None, candidates: tuple[str, ...] = (str(BUNDLED_MODEL_DIR),)) -> str:
    """`given`, or the first of `candidates` that holds a tokenizer.json (default: the prepared
    bundled model)."""
    for candidate in ([given] if given else list(candidates)):
        if (Path(candidate) / "tokenizer.json").is_file():
            return candidate
    if given:
        raise FicError("no tokenizer.json in this folder", path=given, field="--tokenizer")
    raise FicError(f"no SmolLM2 tokenizer found in {' or '.join(candidates)}: run `fic prepare-model`, or pass "
                   "--tokenizer DIR (a folder with its tokenizer files)", field="--tokenizer")


def copy_tokenizer(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copy a model folder's tokenizer files (tokenizer*, special_tokens_map*, chat_template*)."""
    src, dst = Path(src), Path(dst)
    files = [p for p in sorted(src.iterdir()) if p.is_file() and p.name.startswith(TOKENIZER_FILES)] \
        if src.is_dir() else []
    if not any(p.name == "tokenizer.json" for p in files):
        raise FicError("no tokenizer.json here: point to the prepared SmolLM2 folder (`fic prepare-model`) or to the "
                       "tokenizer files it holds", path=str(src), field="--tokenizer")
    dst.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copy(path, dst / path.name)
    return [p.name for p in files]


def load_tokenizer_files(folder: str | os.PathLike) -> Any:
    """The tokenizer of a folder that may hold its files only (no config.json, no weights), with a
    pad token (the eos token where it has none), as `fic.core.model.load_tokenizer` gives it."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise FicError("no tokenizer.json here: point to the prepared SmolLM2 folder (`fic prepare-model`) or to the "
                       "tokenizer files it holds", path=str(folder), field="--tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# --------------------------------------------------------------------------- the folder

def build_random_model(shape: dict, out: str | os.PathLike, tokenizer_dir: str | os.PathLike, *,
                       layers: int | None = None, sets: dict | None = None, device: str = "cpu",
                       dtype: str = "bfloat16", seed: int = 0) -> dict:
    """Write a Hugging Face folder of `shape`'s architecture with random weights and the tokenizer
    of `tokenizer_dir`; return what `fic_random.json` records. An older folder at `out` is replaced
    only when it is one of these (its `fic_random.json`) or empty: a folder of the user's is refused."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from fic.core.model import resolve_dtype

    if Path(out).is_dir() and any(Path(out).iterdir()) and not (Path(out) / RANDOM_MARKER).is_file():
        raise FicError(f"is in the way: a folder without {RANDOM_MARKER}, so not a random-weight model FiC built; "
                       "FiC replaces only its own: move it away or choose another --out", path=str(out), field="--out")
    tokenizer = load_tokenizer_files(tokenizer_dir)
    full_layers = int({**shape["config"], **(sets or {})}["num_hidden_layers"])
    config = make_config(shape, layers, sets, tokenizer)
    torch_dtype = resolve_dtype(dtype, device)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if device.startswith("cuda"):
                torch.cuda.manual_seed_all(seed)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
        model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                                   eos_token_id=tokenizer.eos_token_id,
                                                   pad_token_id=tokenizer.pad_token_id)
        parameters = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp, max_shard_size="5GB")
        del model
        copy_tokenizer(tokenizer_dir, tmp)
        record = {"random_weights": True, "backbone": shape["backbone"], "hub_id": shape.get("hub_id"),
                  "config_source": shape.get("source"), "layers": config.num_hidden_layers,
                  "full_layers": full_layers, "parameters": parameters, "dtype": str(torch_dtype).split(".")[-1],
                  "seed": seed, "sets": sets or {},
                  "tokenizer": "SmolLM2-135M-Instruct's (the real model's vocabulary size kept)"}
        (tmp / RANDOM_MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o755)
        publish_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


# --------------------------------------------------------------------------- command line

def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of a build: where, which tokenizer, how many layers, overrides, device, dtype, seed."""
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--tokenizer", required=True, help="a folder with SmolLM2's tokenizer files")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--device", default="cpu", help="where the weights are drawn (cuda: fast)")
    parser.add_argument("--dtype", default="bfloat16", help="weights dtype (default bfloat16)")
    parser.add_argument("--seed", type=int, default=0)


def build_from_arguments(shape: dict, args: argparse.Namespace) -> dict:
    return build_random_model(shape, args.out, args.tokenizer, layers=args.layers, sets=parse_sets(args.set),
                              device=args.device, dtype=args.dtype, seed=args.seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fic.bench.random_weights",
                                     description="write a random-weight model folder of SmolLM2-135M-Instruct's shape")
    add_build_arguments(parser)
    args = parser.parse_args(argv)
    return exit_status("fic.bench.random_weights", lambda: print(json.dumps(build_from_arguments(SMOLLM2, args))))


if __name__ == "__main__":
    sys.exit(main())
