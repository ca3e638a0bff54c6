"""Generation engines behind the one interface of `fic.core.generation`, built from a `BackendConfig`.

- `hf` (`hf.py`): our own decoding loop over a transformers model, keys and values kept
  between calls (`kv_reuse.py`);
- `vllm` (`vllm.py`): the offline vLLM engine, GPU only;
- `openai` (`openai.py`): an OpenAI-compatible HTTP endpoint.

Engines are imported only when chosen: `import fic.backends` stays light.
"""

from __future__ import annotations

from fic.backends.openai import openai_backend_from_config
from fic.backends.vllm import load_vllm_backend
from fic.core.errors import FicError
from fic.core.generation import KINDS, Backend, BackendConfig
from fic.core.optional import installed, missing


def check_backend(cfg: BackendConfig, field: str) -> None:
    """What building `cfg` would refuse, found without loading anything (a --dry-run, the start of a
    run): the kind, the model named, an hf/vllm model folder that looks local and is not there (never
    taken for a hub id: `fic.core.model.check_model_folder`), the openai extra. `field` is the
    section's key (`model`, `user.backend`, ...)."""
    if cfg.kind not in KINDS:
        raise FicError(f"unknown backend kind {cfg.kind!r}; expected one of {', '.join(KINDS)}", field=f"{field}.kind")
    if not cfg.model:
        raise FicError("backend model is not set", field=f"{field}.model")
    if cfg.kind == "openai":
        if not installed("openai"):
            raise missing("openai", "the openai backend (kind: openai)", field=f"{field}.kind")
        return
    from fic.core.model import check_model_folder  # lazy: loads torch

    check_model_folder(cfg.model, adapter_ok=True, field=f"{field}.model")


def make_backend(cfg: BackendConfig) -> Backend:
    """Build the backend `cfg.kind` names. Engines are imported only when chosen."""
    if cfg.kind not in KINDS:
        raise FicError(f"unknown backend kind {cfg.kind!r}; expected one of {', '.join(KINDS)}",
                       field="kind")
    if not cfg.model:
        raise FicError("backend model is not set", field="model")
    if cfg.kind == "hf":
        from fic.backends.hf import load_hf_backend  # lazy: engines load torch only when chosen
        return load_hf_backend(cfg)
    if cfg.kind == "vllm":
        return load_vllm_backend(cfg)
    return openai_backend_from_config(cfg)
