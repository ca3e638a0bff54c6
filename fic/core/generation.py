"""Text generation behind one small interface, whatever engine runs it.

Every role that talks (the assistant under test, the user simulator, the reply classifier,
the sharder) holds a `BackendConfig` and calls `fic.backends.make_backend(cfg)` to get a
`Backend`:

- `hf`: a transformers model on a local checkpoint (`fic/backends/hf.py`);
- `vllm`: the offline vLLM engine on a GPU machine (`fic/backends/vllm.py`);
- `openai`: any OpenAI-compatible `/chat/completions` endpoint (`fic/backends/openai.py`).

This module holds only the types and helpers the backends share; the engines live in
`fic/backends/` and import from here, never the other way round.

Local backends are token-in/token-out: `generate` takes prompt token ids and returns the
generated ids *including* the end-of-turn token, so a conversation can grow by appending ids
and is never re-tokenized. `chat` takes text messages; local backends render them with the
tokenizer's chat template (`fic.core.chat.prompt_ids`) and then call `generate`.

Seeds are per call: the same call (same prompts, same order, same params, same backend
settings) gives the same outputs, and prompts repeated inside one call are still sampled
independently, so N runs of one conversation can be batched together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from fic.core.chat import end_of_turn_ids, prompt_ids
from fic.core.config import setting
from fic.core.errors import FicError

KINDS = ("hf", "vllm", "openai")


@dataclass
class SamplingParams:
    """How to decode. `temperature == 0` is greedy decoding (seeds and top_p are then unused)."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0  # per-call seed; None leaves the engine's random state as it is
    # One seed per prompt, overriding `seed`: each prompt is sampled from its own seed alone, so
    # its reply does not depend on the prompts beside it in the call (a resumed run draws what
    # an uninterrupted one would, whatever its batches).
    seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        # Checked here so that every backend fails the same way, before any work is done.
        if self.max_new_tokens < 1:
            raise FicError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise FicError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise FicError(f"top_p must be in (0, 1], got {self.top_p}")


def request_seeds(params: SamplingParams, count: int) -> list[int | None]:
    """The seed of each of `count` prompts of a call: `params.seeds`, else `params.seed + i` (so
    that repeated prompts differ), else None."""
    if params.seeds is not None:
        if len(params.seeds) != count:
            raise ValueError(f"{len(params.seeds)} seeds for {count} prompts")
        return list(params.seeds)
    return [None if params.seed is None else params.seed + i for i in range(count)]


@dataclass
class Generation:
    """One reply.

    token_ids: generated ids; when `finish_reason == "stop"` the last id is the end-of-turn
        token, kept so that the caller can append these ids to the conversation as they are.
        Empty for the openai backend, which never sees token ids.
    text: the reply decoded without special tokens (and without the end-of-turn token).
    logprobs: one per entry of `token_ids`: log-softmax of the model's *raw* logits at the
        chosen token, i.e. before temperature, top-p or any other logits processing (vLLM's
        default `raw_logprobs` mode means the same thing). For the openai backend: the server's
        log-probs when it returns them, else [].
    finish_reason: "stop" (end-of-turn token, or the server said it stopped) or "length"
        (`max_new_tokens` reached first).
    """

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str


class Backend(Protocol):
    """What every backend offers. `tokenizer` is None for remote (openai) backends."""

    name: str
    tokenizer: Any | None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Continue each prompt (token ids, chat template already applied); one Generation each."""
        ...

    def chat(self, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
        """Answer each conversation (`[{"role", "content"}, ...]`) with the next assistant turn."""
        ...


@dataclass
class BackendConfig:
    """Which engine answers for one role, and how it is set up."""

    kind: str = setting("hf", "Generation engine: hf (transformers, any device), vllm (GPU), "
                        "openai (an OpenAI-compatible HTTP endpoint).", choices=KINDS)
    model: str = setting("", "Model: a local checkpoint folder or hub id for hf/vllm, the served "
                         "model name for openai.")
    dtype: str = setting("auto", "Weights dtype for hf/vllm: auto (bf16 where the device supports "
                         "it, else fp32), bfloat16, float16 or float32.")
    device: str = setting("auto", "hf only: auto, cpu, cuda, cuda:N or mps. vLLM places itself.")
    batch_size: int = setting(16, "hf only: most prompts per generate call (micro-batch).", min=1)
    kv_reuse_mb: float = setting(2048, "hf only: memory (MiB) for keys and values kept between "
                                 "calls, so that a conversation's next turn feeds the model only "
                                 "its new tokens; 0 turns reuse off.", min=0)
    trust_remote_code: bool = setting(False, "hf/vllm: allow model code shipped with the checkpoint.")
    base_url: str = setting("https://api.openai.com/v1", "openai only: endpoint root; requests go "
                            "to {base_url}/chat/completions.")
    api_key_env: str = setting("OPENAI_API_KEY", "openai only: name of the environment variable "
                               "holding the API key; unset is fine for local servers.")
    timeout_s: float = setting(120.0, "openai only: seconds to wait on each socket operation of "
                               "one request.", min=0.001)
    max_retries: int = setting(5, "openai only: retries after a connection error, timeout, 408, 409, 429 or "
                               "5xx (the openai SDK's: exponential backoff with jitter, a server's Retry-After "
                               "honoured up to 2 minutes).", min=0)
    concurrency: int = setting(8, "openai only: requests in flight at once.", min=1)
    request_logprobs: bool = setting(False, "openai only: ask the server for token log-probs "
                                     "(vLLM and OpenAI offer them; some servers reject the field).")
    gpu_memory_utilization: float = setting(0.9, "vllm only: fraction of GPU memory the engine "
                                            "may take.", min=0.01, max=1.0)
    tensor_parallel_size: int = setting(1, "vllm only: GPUs to shard the model over.", min=1)
    max_model_len: int | None = setting(None, "vllm only: context length (prompt + reply); "
                                        "null uses the model's own.", min=1)


def check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    """Reject what no engine can continue: an empty prompt or non-integer ids."""
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise FicError("empty prompt: a prompt needs at least one token id", record=i)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise FicError("prompt must be a list of integer token ids", record=i)


def finish(tokenizer: Any, token_ids: Sequence[int], logprobs: Sequence[float],
           stop_ids: set[int] | frozenset[int], engine_stopped: bool = False) -> Generation:
    """Make a Generation from raw engine output, the same way for every local engine.

    Cuts after the first end-of-turn id (HF pads finished rows; the id itself is kept), and
    names the finish "stop" when the reply ends with an end-of-turn id even if the engine
    counted it as the last allowed token (vLLM checks the length limit first). `engine_stopped`
    covers an engine that stopped on its own eos id outside `stop_ids`.
    """
    ids = [int(t) for t in token_ids]
    lps = [float(x) for x in logprobs]
    cut = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    if cut is not None:
        ids, lps = ids[:cut + 1], lps[:cut + 1]
    stopped = cut is not None or engine_stopped
    body = ids[:-1] if stopped and ids else ids  # the end-of-turn token is never part of the text
    text = tokenizer.decode(body, skip_special_tokens=True)
    return Generation(token_ids=ids, text=text, logprobs=lps,
                      finish_reason="stop" if stopped else "length")


def stop_ids(tokenizer: Any, generation_config: Any = None) -> frozenset[int]:
    """The ids a local engine stops at; a tokenizer without any cannot tell where a reply ends."""

    ids = frozenset(int(t) for t in end_of_turn_ids(tokenizer, generation_config))
    if not ids:
        raise FicError("the tokenizer has no end-of-turn token; cannot tell where a reply ends")
    return ids


def chat_by_generate(backend: Backend, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
    """`chat` for token-in backends: render each conversation with the chat template, then generate."""

    return backend.generate([prompt_ids(backend.tokenizer, conv) for conv in conversations], params)
