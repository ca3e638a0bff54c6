"""Generation engines behind the one interface of `fic.core.generation`, built from a `BackendConfig`.

- `hf` (`hf.py`): our own decoding loop (`decoding.py`) over a transformers model, keys and
  values kept between calls (`kv_reuse.py`);
- `vllm` (`vllm.py`): the offline vLLM engine, GPU only;
- `openai` (`openai.py`): an OpenAI-compatible HTTP endpoint.

Engines are imported only when chosen: `import fic.backends` stays light.
"""

from __future__ import annotations

from fic.backends.openai import openai_backend_from_config
from fic.backends.vllm import load_vllm_backend
from fic.core.errors import FicError
from fic.core.generation import KINDS, Backend, BackendConfig


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
