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
  allowed token is reported as "length"; `fic.core.generation.finish` names that case "stop";
- `logprobs=0` returns the sampled token's log-prob only; in vLLM's default `raw_logprobs`
  mode it is the log-softmax of the raw logits, before temperature and top-p, the same quantity
  the hf backend reports.

Seeds: each request gets its own seed (`params.seeds[i]`, else params.seed + its index in the
call), so a prompt's sample does not depend on what else is in the batch, and repeated prompts
still differ.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from fic.core.errors import FicError
from fic.core.generation import (
    BackendConfig,
    Generation,
    SamplingParams,
    chat_by_generate,
    check_prompts,
    finish,
    request_seeds,
    stop_ids,
)
from fic.core.ranks import Ranks

# The vLLM versions FiC's engine code is written against (the `vllm` extra pins the same window): the
# colocated weight sync reaches into the engine (`_engine_model`), which vLLM does not keep stable.
SUPPORTED_VLLM = ("0.10.2", "0.12")  # at least, below


def import_vllm() -> Any:
    """Import vllm or explain how to get it; refuse a version outside the tested window."""
    try:
        import vllm
    except ImportError as err:
        raise FicError(f"the vllm backend needs vLLM ({err}): pip install 'fic[vllm]' on a GPU machine, "
                       "or use backend kind hf") from None
    check_version(getattr(vllm, "__version__", "unknown"))
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
        per_request = [self._sampling(params, seed) for seed in request_seeds(params, len(prompts))]
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(inputs, per_request, use_tqdm=False)
        return [self._to_generation(out.outputs[0]) for out in outputs]

    def _sampling(self, params: SamplingParams, seed: int | None) -> Any:
        return self.vllm.SamplingParams(
            n=1, max_tokens=params.max_new_tokens, temperature=params.temperature,
            top_p=params.top_p, seed=seed,
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
    from fic.core.model import load_tokenizer, resolve_dtype  # lazy: the module is imported without vLLM too

    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    # Same dtype names as the hf backend (bf16, fp32, ...); "auto" stays vLLM's own choice.
    dtype = cfg.dtype if cfg.dtype == "auto" else resolve_dtype(cfg.dtype, "cuda")
    kwargs: dict[str, Any] = {"model": cfg.model, "dtype": dtype, "seed": 0,
                              "trust_remote_code": cfg.trust_remote_code,
                              "gpu_memory_utilization": cfg.gpu_memory_utilization,
                              "tensor_parallel_size": cfg.tensor_parallel_size}
    if cfg.max_model_len is not None:
        kwargs["max_model_len"] = cfg.max_model_len
    return VLLMBackend(vllm.LLM(**kwargs), tokenizer)


# --------------------------------------------------------------------------- a colocated rollout engine

def colocated_engine(policy: Any, tokenizer: Any, model_path: str, gpu_memory_utilization: float,
                     max_model_len: int) -> VLLMBackend:
    """A vLLM engine in this training process, on this rank's GPU, for on-policy rollouts.

    The engine starts from the checkpoint on disk and gets the trainer's weights with
    `sync_weights` after every optimizer step. The model must live in this process for that
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`); with several ranks each one runs its own engine
    (`distributed_executor_backend="external_launcher"`, vLLM's mode for engines started by
    torchrun/accelerate), sampling its own share of the rollouts.
    """

    import torch

    vllm = import_vllm()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    # max_num_batched_tokens: the tokens one engine step takes; one whole context fits (a prompt is
    # never refused), and the engine's activations beside the trainer's stay bounded by it.
    kwargs: dict[str, Any] = {"model": model_path, "dtype": "bfloat16", "gpu_memory_utilization": gpu_memory_utilization,
                              "max_model_len": max_model_len, "max_num_batched_tokens": max_model_len,
                              "enable_prefix_caching": True, "seed": torch.distributed.get_rank() if distributed else 0}
    if distributed:
        kwargs["distributed_executor_backend"] = "external_launcher"
    backend = VLLMBackend(vllm.LLM(**kwargs), tokenizer)
    Ranks.current().barrier()  # every rank's engine holds its memory before any rank trains beside it
    sync_weights(backend, policy, [], 0.0, lambda message: None)  # the policy may already differ from disk
    return backend


def check_version(installed: str) -> None:
    """One line naming the installed vLLM and the supported window when it is outside it: the engine
    internals `_engine_model` reaches move between releases."""
    from packaging.version import InvalidVersion, Version

    low, high = SUPPORTED_VLLM
    try:
        inside = Version(low) <= Version(installed) < Version(high)
    except InvalidVersion:
        inside = False
    if not inside:
        raise FicError(f"vLLM {installed} is installed; FiC's vllm backend is tested with vllm>={low},<{high} "
                       f"(pip install 'fic[vllm]'), or use backend kind hf", field="vllm")


def _engine_model(llm: Any) -> Any:
    """The torch module inside an in-process engine: vLLM's private attribute path, the one place FiC
    reaches into the engine (the window `SUPPORTED_VLLM`, checked by `import_vllm`, is where it was
    read; vLLM's public weight-transfer API is newer than the window)."""
    executor = llm.llm_engine.model_executor
    worker = executor.driver_worker
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    if runner is None or not hasattr(runner, "model"):
        raise FicError("cannot reach the vLLM engine's model to load new weights into it; set "
                       "VLLM_ENABLE_V1_MULTIPROCESSING=0 or use rollout.backend=hf", field="rollout.backend")
    return runner.model


def _lora_layers(policy: Any) -> dict[str, Any]:
    """The policy's LoRA-wrapped modules with an adapter on, by the state-dict name of the base
    weight they wrap (`...q_proj.base_layer.weight`)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft: no adapters
        return {}
    found = {}
    for name, module in policy.named_modules():
        if isinstance(module, LoraLayer) and not module.disable_adapters and not module.merged:
            found[f"{name}.base_layer.weight"] = module
    return found


def _lora_delta(module: Any, adapter: str) -> Any:
    """scale x B @ A of one adapter of one LoRA layer, in float32, computed out of place."""
    from peft.tuners.lora import layer

    if adapter in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(adapter):
        raise FicError(f"the weight sync merges plain LoRA only; adapter {adapter!r} is a variant (DoRA, ...)",
                       field="lora")
    if isinstance(module, layer.Embedding):
        a, b = module.lora_embedding_A[adapter].float(), module.lora_embedding_B[adapter].float()
        return (b @ a).T * module.scaling[adapter]
    if isinstance(module, layer.Linear):
        delta = module.lora_B[adapter].weight.float() @ module.lora_A[adapter].weight.float()
        return (delta.T if module.fan_in_fan_out else delta) * module.scaling[adapter]
    return module.get_delta_weight(adapter).float()  # convolutions and the rest: peft's own, out of place


def _merged(module: Any, name: str, base: Any) -> Any:
    """The base weight (or bias) of a LoRA layer with its active adapters added: base + the sum of
    scale x B @ A, in float32 and cast once to the base's dtype. The trainer's base is only read."""
    adapters = [a for a in module.active_adapters if a in module.lora_A or a in getattr(module, "lora_embedding_A", {})]
    if name.endswith(".weight"):
        total = base.float()
        for adapter in adapters:
            total = total + _lora_delta(module, adapter)
        return total.to(base.dtype)
    total = base.float()
    for adapter in adapters:
        if getattr(module, "lora_bias", {}).get(adapter):
            total = total + module.lora_B[adapter].bias.float() * module.scaling[adapter]
    return total.to(base.dtype)


def engine_name(name: str) -> str:
    """The checkpoint's name of a trainer's (PEFT-wrapped) weight: what the engine loads it as."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def check_pushable(policy: Any) -> None:
    """PEFT's `modules_to_save` (a trained copy beside the frozen original) has no name in the
    checkpoint the engine loaded: refused rather than pushed under the wrong name or dropped."""
    saved = sorted({n.split(".modules_to_save")[0] for n, _ in policy.named_parameters() if ".modules_to_save." in n})
    if saved:
        raise FicError(f"the vLLM weight sync cannot push PEFT modules_to_save ({', '.join(saved[:3])}): train those "
                       "modules as LoRA targets or use rollout.backend=hf", field="rollout.backend")


def policy_weights(policy: Any) -> Iterator[tuple[str, Any]]:
    """The policy's weights under the checkpoint's names, one at a time, for `load_weights`.

    A LoRA-wrapped module's weight is merged out of place (`_merged`); merging into the
    trainer's bf16 base and taking the adapter out again (`merge_adapter`/`unmerge_adapter`) is
    not exact: W + d - d moved 9% of a q_proj's entries in one sync, 49.6% after 100, so the
    frozen teacher, the student's base, `final-merged` and a resume drifted. Only one merged
    tensor exists at a time. Under ZeRO-3 the caller gathers the partitions first."""
    check_pushable(policy)
    layers = _lora_layers(policy)
    state = policy.state_dict()  # no non-persistent buffers (rotary tables)
    unmatched = sorted(set(layers) - set(state))
    if unmatched:
        raise FicError(f"cannot find the base weight of LoRA layer {unmatched[0].removesuffix('.base_layer.weight')} "
                       "to merge it for the engine", field="lora.target_modules")
    for name, tensor in state.items():
        if "lora_" in name:
            continue
        module = layers.get(name) or layers.get(name.removesuffix(".bias") + ".weight")
        if module is not None:
            tensor = _merged(module, name, tensor)
        yield engine_name(name), tensor.detach()


def push_weights(engine: Any, policy: Any) -> None:
    """Load the policy's weights into the engine's model. Under ZeRO-3 full fine-tuning each weight
    is gathered alone and pushed (as TRL does): one full weight at a time beside the engine's copy,
    not the whole model on every rank. A LoRA policy's partitions are gathered together (merging
    needs a layer's base and adapter at once; the adapter's base is frozen and bf16 in the recipes)."""
    import torch

    params = list(policy.parameters())
    zero3 = bool(params) and hasattr(params[0], "ds_id")
    with torch.no_grad():
        if zero3 and not _lora_layers(policy):
            import deepspeed

            check_pushable(policy)
            for name, param in policy.named_parameters():
                with deepspeed.zero.GatheredParameters([param]):
                    engine.load_weights([(engine_name(name), param.data.detach())])
            return
        gather = contextlib.nullcontext()
        if zero3:
            import deepspeed

            gather = deepspeed.zero.GatheredParameters(params)
        with gather:
            engine.load_weights(policy_weights(policy))


def sync_weights(backend: VLLMBackend, policy: Any, rollouts: list, tolerance: float, say: Any,
                 ranks: Ranks | None = None) -> None:
    """Load the policy's current weights into the engine (LoRA merged out of place, the trainer's
    weights untouched), reset its prefix cache (cached keys and values belong to the old
    weights), and check on one rollout that the engine's log-probs now agree with the trainer's.

    Every rank calls it. The rollout checked is agreed across ranks first (the main process picks
    the first rank's that ended on its end-of-turn token), and every rank runs the trainer's
    forward on it: under ZeRO-3 that forward gathers weights on every rank."""
    ranks = ranks or Ranks.current()
    push_weights(_engine_model(backend.llm), policy)
    backend.llm.reset_prefix_cache()
    finished = [c for c in rollouts if c.turns and c.turns[-1].finish_reason == "stop"]
    mine = (list(finished[0].ids), finished[0].turns[-1].prompt_tokens) if finished else None
    offered = ranks.gather(mine)
    chosen = ranks.share(next((c for c in offered if c is not None), None) if offered is not None else None)
    if chosen is not None:
        drift = logprob_drift(backend, policy, *chosen)
        if drift > tolerance:
            say(f"warning: after the weight sync the engine's mean log-prob of a rollout differs from the "
                f"trainer's by {drift:.3f} (> {tolerance}); rollouts may be off-policy")


def logprob_drift(backend: VLLMBackend, policy: Any, ids: list[int], start: int) -> float:
    """|mean engine log-prob - mean trainer log-prob| over a rollout's final reply tokens (`ids`
    from position `start`)."""
    import torch

    vllm = backend.vllm
    ids = list(ids)
    (out,) = backend.llm.generate([{"prompt_token_ids": ids}],
                                  vllm.SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    engine = [float(out.prompt_logprobs[t][ids[t]].logprob) for t in range(start, len(ids))]
    device = next(policy.parameters()).device
    with torch.no_grad():
        logits = policy(input_ids=torch.tensor([ids], device=device)).logits[0, start - 1:len(ids) - 1].float()
        trainer = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[start:], device=device)[:, None])
    return abs(sum(engine) / len(engine) - float(trainer.mean()))
