"""Random-weight model folders of the backbones' shapes (`tools/gpu/shapes/<backbone>.json`).

    python tools/gpu/random_models.py build --backbone llama-3.1-8b-instruct --out DIR [--layers N]
        [--tokenizer DIR] [--device cuda] [--set hidden_size=64 ...]
    python tools/gpu/random_models.py view SRC DST --layers N     # the same weights, fewer layers
    python tools/gpu/random_models.py tokenizer SRC DST           # copy a model folder's tokenizer files
    python tools/gpu/random_models.py config --backbone B OUT     # the shape's config.json alone (fic bench decode --model-config)

A shape file holds the architecture fields of the backbone's `config.json` and the page they were
copied from; `build` makes a folder of that architecture with random weights and SmolLM2's
tokenizer (`fic.bench.random_weights`, which also holds SmolLM2-135M-Instruct's own shape). Every
figure made on such a folder is a figure of random weights: `fic_random.json` in the folder says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from fic.bench.random_weights import RANDOM_MARKER, add_build_arguments, build_from_arguments, copy_tokenizer
from fic.core.errors import FicError, exit_status
from fic.core.files import write_json

SHAPES_DIR = Path(__file__).resolve().parent / "shapes"

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
    parser = argparse.ArgumentParser(prog="python tools/gpu/random_models.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="write a random-weight model folder of a backbone's shape")
    build.add_argument("--backbone", required=True, help="a name in tools/gpu/shapes/ or a shape file")
    add_build_arguments(build)
    view = sub.add_parser("view", help="a folder loading fewer layers of a random model")
    view.add_argument("src")
    view.add_argument("dst")
    view.add_argument("--layers", type=int, required=True)
    tok = sub.add_parser("tokenizer", help="copy a model folder's tokenizer files")
    tok.add_argument("src")
    tok.add_argument("dst")
    config = sub.add_parser("config", help="write a backbone's config.json (its shape file's config)")
    config.add_argument("--backbone", required=True, help="a name in tools/gpu/shapes/ or a shape file")
    config.add_argument("out")
    args = parser.parse_args(argv)

    def run() -> None:
        if args.command == "build":
            print(json.dumps(build_from_arguments(load_shape(args.backbone), args)))
        elif args.command == "view":
            print(json.dumps(layer_view(args.src, args.dst, args.layers)))
        elif args.command == "config":
            write_json(args.out, load_shape(args.backbone)["config"])
            print(args.out)
        else:
            print(" ".join(copy_tokenizer(args.src, args.dst)))

    return exit_status("tools/gpu/random_models.py", run)

if __name__ == "__main__":
    sys.exit(main())
