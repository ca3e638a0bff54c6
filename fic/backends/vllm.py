"""The vLLM backend: the offline `vllm.LLM` engine, for fast sampling on GPU machines.

vLLM is an optional extra (it pins its own torch and transformers), so it is imported only
when this backend is chosen.

Token-in/token-out: prompts go in as `{"prompt_token_ids": [...]}` (vLLM's TokensPrompt), so
nothing is re-tokenized. What vLLM returns, as read in its source (vllm/v1/core/sched/utils.py
`check_stop`, vllm/v1/engine/detokenizer.py `IncrementalDetokenizer.update`) and in the
`SamplingParams.stop_token_ids` docstring ("The returned output will contain the stop tokens"):

- a request stops when the sampled id is the model's eos id or one of `stop_token_ids`; that
  id stays in `CompletionOutput.token_ids` (the detokenizer leaves it out of `.text` only), so
  `token_ids` matches FiC's convention (end-of-turn id included) with no fix-up;
- the length limit is checked *before* the stop ids, so an end-of-turn id sampled as the last
  allowed token is reported as "length"; `fic.generation.finish` names that case "stop";
- `logprobs=0` returns the sampled token's log-prob only; in vLLM's default `raw_logprobs`
  mode it is the log-softmax of the raw logits, before temperature and top-p, the same quantity
  the hf backend reports.

Seeds: each request gets its own seed (params.seed + its index in the call), so a prompt's
sample does not depend on what else is in the batch, and repeated prompts still differ.
"""

from __future__ import annotations

from typing import Any

from fic.errors import FicError
from fic.generation import (
    BackendConfig,
    Generation,
    SamplingParams,
    chat_by_generate,
    check_prompts,
    finish,
    stop_ids,
)


def import_vllm() -> Any:
    """Import vllm or explain how to get it."""
    try:
        import vllm
    except ImportError as err:
        raise FicError(f"the vllm backend needs vLLM ({err}): pip install 'fic[vllm]' on a GPU machine, "
                       "or use backend kind hf") from None
    return vllm


class VLLMBackend:
    """Generation with an offline vLLM engine."""

    name = "vllm"

    def __init__(self, llm: Any, tokenizer: Any):
        self.vllm = import_vllm()
        self.llm, self.tokenizer = llm, tokenizer
        self.stop_ids = stop_ids(tokenizer)

    def chat(self, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
        return chat_by_generate(self, conversations, params)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        check_prompts(prompts)
        if not prompts:
            return []
        per_request = [self._sampling(params, i) for i in range(len(prompts))]
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(inputs, per_request, use_tqdm=False)
        return [self._to_generation(out.outputs[0]) for out in outputs]

    def _sampling(self, params: SamplingParams, index: int) -> Any:
        return self.vllm.SamplingParams(
            n=1, max_tokens=params.max_new_tokens, temperature=params.temperature,
            top_p=params.top_p, seed=None if params.seed is None else params.seed + index,
            stop_token_ids=sorted(self.stop_ids), logprobs=0, skip_special_tokens=True)

    def _to_generation(self, completion: Any) -> Generation:
        ids = list(completion.token_ids)
        logprobs = []
        for token_id, entry in zip(ids, completion.logprobs or []):
            logprobs.append(float(entry[token_id].logprob))
        # finish_reason "stop" without a stop id at the end: the model's own eos stopped it.
        return finish(self.tokenizer, ids, logprobs, self.stop_ids,
                      engine_stopped=completion.finish_reason == "stop")


def load_vllm_backend(cfg: BackendConfig) -> VLLMBackend:
    """Start a vLLM engine for `cfg.model` (the tokenizer is loaded the same way as for hf)."""
    vllm = import_vllm()
    from fic.model import load_tokenizer, resolve_dtype

    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    # Same dtype names as the hf backend (bf16, fp32, ...); "auto" stays vLLM's own choice.
    dtype = cfg.dtype if cfg.dtype == "auto" else resolve_dtype(cfg.dtype, "cuda")
    kwargs: dict[str, Any] = dict(model=cfg.model, dtype=dtype, seed=0,
                                  trust_remote_code=cfg.trust_remote_code,
                                  gpu_memory_utilization=cfg.gpu_memory_utilization,
                                  tensor_parallel_size=cfg.tensor_parallel_size)
    if cfg.max_model_len is not None:
        kwargs["max_model_len"] = cfg.max_model_len
    return VLLMBackend(vllm.LLM(**kwargs), tokenizer)
