"""Random-weight model folders of the backbones' shapes (`tools/gpu/shapes/<backbone>.json`).

    python -m fic.bench.random_models build --backbone llama-3.1-8b-instruct --out DIR [--layers N]
        [--tokenizer DIR] [--device cuda] [--set hidden_size=64 ...]
    python -m fic.bench.random_models view SRC DST --layers N     # the same weights, fewer layers
    python -m fic.bench.random_models tokenizer SRC DST           # copy a model folder's tokenizer files

A shape file holds the architecture fields of the backbone's `config.json` (hidden size, layers,
heads, KV heads, intermediate size, vocabulary, RoPE settings, tied embeddings, model type) and
the page they were copied from. `build` makes a Hugging Face folder of that architecture with
random weights (initialised by transformers, `initializer_range` 0.02, on `--device`: a GPU builds
a 14B model in seconds) and SmolLM2's tokenizer, without any hub. The vocabulary stays the real
model's, so the embedding and the LM head cost what they cost in the real model; the tokenizer's
49,152 ids are a subset of it and the special-token ids are SmolLM2's. Every figure made on such a
folder is a figure of random weights: `fic_random.json` in the folder says so.
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

from fic.core.errors import FicError
from fic.core.files import publish_folder

REPO = Path(__file__).resolve().parents[2]
SHAPES_DIR = REPO / "tools" / "gpu" / "shapes"
RANDOM_MARKER = "fic_random.json"
TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "chat_template")

# --------------------------------------------------------------------------- shapes

def load_shape(backbone: str) -> dict:
    """The shape file of `backbone` (`tools/gpu/shapes/<backbone>.json`), or a path to one."""
    path = Path(backbone) if backbone.endswith(".json") else SHAPES_DIR / f"{backbone}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SHAPES_DIR.glob("*.json")))
        raise FicError(f"no shape file; known backbones: {known}", path=str(path), field="--backbone")
    try:
        shape = json.loads(path.read_text(encoding="utf-8"))
        shape["config"]["model_type"]
    except (ValueError, KeyError, TypeError) as err:
        raise FicError(f"not a shape file (JSON with config.model_type): {err}", path=str(path)) from None
    return shape


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


def parameter_count(config: Any) -> int:
    """Parameters of the model a config builds (on the meta device: no memory, a second at most)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def layer_parameters(config: Any) -> tuple[int, int]:
    """(parameters outside the decoder layers, parameters of one layer) of a config."""
    import copy

    one, two = copy.deepcopy(config), copy.deepcopy(config)
    one.num_hidden_layers, two.num_hidden_layers = 1, 2
    p1, p2 = parameter_count(one), parameter_count(two)
    return p1 - (p2 - p1), p2 - p1


# --------------------------------------------------------------------------- folders

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


def build_random_model(backbone: str, out: str | os.PathLike, tokenizer_dir: str | os.PathLike, *,
                       layers: int | None = None, sets: dict | None = None, device: str = "cpu",
                       dtype: str = "bfloat16", seed: int = 0) -> dict:
    """Write a Hugging Face folder of `backbone`'s architecture with random weights and the tokenizer
    of `tokenizer_dir`; return what `fic_random.json` records."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from fic.core.model import resolve_dtype

    shape = load_shape(backbone)
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


def layer_view(src: str | os.PathLike, dst: str | os.PathLike, layers: int) -> dict:
    """A folder at `dst` that loads the first `layers` decoder layers of the random model at `src`:
    its own config.json, every other file a symbolic link (the weights of the later layers are
    in the files too and are not loaded)."""
    src, dst = Path(src).resolve(), Path(dst)
    record = json.loads((src / RANDOM_MARKER).read_text(encoding="utf-8"))
    if not 1 <= layers <= record["layers"]:
        raise FicError(f"expected 1 to {record['layers']} layers, got {layers}", field="--layers")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for path in src.iterdir():
        if path.name not in ("config.json", RANDOM_MARKER):
            (dst / path.name).symlink_to(path)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config["num_hidden_layers"] = layers
    for key in ("layer_types", "mlp_layer_types"):  # per-layer lists some configs save (transformers 5)
        if isinstance(config.get(key), list):
            config[key] = config[key][:layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    parameters = None
    if record.get("parameters") is not None:
        from transformers import AutoConfig

        parameters = parameter_count(AutoConfig.from_pretrained(dst))
    record = {**record, "layers": layers, "parameters": parameters, "view_of": str(src)}
    (dst / RANDOM_MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


# --------------------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fic.bench.random_models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="write a random-weight model folder of a backbone's shape")
    build.add_argument("--backbone", required=True, help="a name in tools/gpu/shapes/ or a shape file")
    build.add_argument("--out", required=True, help="the folder to write")
    build.add_argument("--tokenizer", required=True, help="a folder with SmolLM2's tokenizer files")
    build.add_argument("--layers", type=int, default=None, help="decoder layers (default: the backbone's)")
    build.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    build.add_argument("--device", default="cpu", help="where the weights are drawn (cuda: fast)")
    build.add_argument("--dtype", default="bfloat16", help="weights dtype (default bfloat16)")
    build.add_argument("--seed", type=int, default=0)
    view = sub.add_parser("view", help="a folder loading fewer layers of a random model")
    view.add_argument("src")
    view.add_argument("dst")
    view.add_argument("--layers", type=int, required=True)
    tok = sub.add_parser("tokenizer", help="copy a model folder's tokenizer files")
    tok.add_argument("src")
    tok.add_argument("dst")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            record = build_random_model(args.backbone, args.out, args.tokenizer, layers=args.layers,
                                        sets=parse_sets(args.set), device=args.device, dtype=args.dtype,
                                        seed=args.seed)
            print(json.dumps(record))
        elif args.command == "view":
            print(json.dumps(layer_view(args.src, args.dst, args.layers)))
        else:
            print(" ".join(copy_tokenizer(args.src, args.dst)))
    except FicError as err:
        print(f"fic.bench.random_models: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
