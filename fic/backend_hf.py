"""The transformers backend: `model.generate` on any device torch runs on.

Prompts are grouped into micro-batches of similar length (sorted longest first, so an
out-of-memory error shows up on the first batch rather than after an hour), LEFT-padded so
every row's last prompt token sits in the final column, and decoded with the KV cache.
`generate` derives position ids from the attention mask, so a padded row sees the same
positions as it would alone: batched greedy output equals unbatched greedy output (up to
floating-point ties).

Every built-in logits processor is switched off, so a checkpoint's `generation_config.json`
(top_k=50, repetition_penalty, ...) cannot silently change what is sampled; one processor of
our own records the raw log-probs and then applies temperature and top-p. The distribution is
exactly softmax(logits / temperature) cut to top_p, the one vLLM samples from, and greedy
decoding is the argmax of the raw logits.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (GenerationConfig, LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper,
                          TopPLogitsWarper)

from fic.generation import (BackendConfig, Generation, SamplingParams, chat_by_generate, check_prompts, finish,
                            stop_ids)


class HFBackend:
    """Generation with a loaded transformers causal LM. Build it from a model already in memory
    (the trainer's live policy, a test model) or from a config with `load_hf_backend`."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, max(1, int(batch_size))
        # The checkpoint's generation_config may list more eos ids (Llama 3: eot, eom, eos).
        generation_config = getattr(model, "generation_config", None)
        self.stop_ids = stop_ids(tokenizer, generation_config)
        pad = getattr(tokenizer, "pad_token_id", None)
        # Any id works as padding (masked out, trimmed afterwards); an end-of-turn id is always there.
        self.pad_id = int(pad) if pad is not None else min(self.stop_ids)

    def chat(self, conversations: list[list[dict]], params: SamplingParams) -> list[Generation]:
        return chat_by_generate(self, conversations, params)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        check_prompts(prompts)
        if not prompts:
            return []
        # Longest first: similar lengths share a batch (less padding) and OOM fails early.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
        results: list[Generation | None] = [None] * len(prompts)
        device = _model_device(self.model)
        sampling = params.temperature > 0
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; restored below for a live training model
        # fork_rng scopes the per-call seed: the caller's global RNG state is restored afterwards.
        fork_devices = []
        if device.type == "cuda":
            fork_devices = [device.index if device.index is not None else torch.cuda.current_device()]
        try:
            with torch.random.fork_rng(devices=fork_devices, enabled=sampling and params.seed is not None):
                if sampling and params.seed is not None:
                    torch.manual_seed(params.seed)
                for start in range(0, len(order), self.batch_size):
                    batch = order[start:start + self.batch_size]
                    outputs = self._generate_batch([prompts[i] for i in batch], params, device)
                    for i, out in zip(batch, outputs):
                        results[i] = out
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams,
                        device: torch.device) -> list[Generation]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        recorder = _RecordThenWarp(params)
        with torch.inference_mode():
            sequences = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                logits_processor=LogitsProcessorList([recorder]),
                **_generate_kwargs(params, sorted(self.stop_ids), self.pad_id))
        new_ids = sequences[:, width:]
        logprobs = recorder.chosen_logprobs(new_ids).cpu().tolist()
        return [finish(self.tokenizer, ids, lps, self.stop_ids)
                for ids, lps in zip(new_ids.cpu().tolist(), logprobs)]


class _RecordThenWarp(LogitsProcessor):
    """The one logits processor `generate` runs (every built-in one is switched off).

    It sees the raw logits of each step first, keeps their log-softmax for one step only, and
    at the next step (whose `input_ids` end with the token just chosen) keeps the chosen
    token's log-prob: memory is one (batch, vocab) tensor instead of the (batch, steps, vocab)
    that `output_logits=True` would hold. Then it applies temperature and top-p with
    transformers' own warpers, in vLLM's order (temperature first).
    """

    def __init__(self, params: SamplingParams):
        self.warpers: list[LogitsProcessor] = []
        if params.temperature > 0:
            if params.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(params.temperature))
            if params.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(params.top_p))
        self.last: torch.Tensor | None = None
        self.chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.last is not None:
            self.chosen.append(self.last.gather(-1, input_ids[:, -1:]))
        self.last = torch.log_softmax(scores.float(), dim=-1)
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        return scores

    def chosen_logprobs(self, new_ids: torch.Tensor) -> torch.Tensor:
        """(batch, steps) raw log-probs of the generated ids (the last step's is gathered here)."""
        if self.last is None:
            return new_ids.new_zeros(new_ids.shape, dtype=torch.float32)
        steps = self.chosen + [self.last.gather(-1, new_ids[:, -1:])]
        if len(steps) != new_ids.shape[1]:
            raise RuntimeError(f"recorded {len(steps)} steps for {new_ids.shape[1]} generated tokens; "
                               "another logits processor or a different decoding loop is in play")
        return torch.cat(steps, dim=1)


def _generate_kwargs(params: SamplingParams, stop_ids: list[int], pad_id: int) -> dict:
    """`generate` keyword arguments with every built-in logits processor switched off, so the
    checkpoint's generation_config.json cannot add one (see the module docstring)."""
    kwargs = dict(
        max_new_tokens=params.max_new_tokens, eos_token_id=stop_ids, pad_token_id=pad_id,
        do_sample=params.temperature > 0, use_cache=True, num_beams=1, num_return_sequences=1,
        return_dict_in_generate=False,
        # Everything but the sampling warpers that could add a processor, pinned neutral.
        repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0, bad_words_ids=None, min_length=0, min_new_tokens=None,
        sequence_bias=None, guidance_scale=None, forced_bos_token_id=None, forced_eos_token_id=None,
        remove_invalid_values=False, exponential_decay_length_penalty=None, suppress_tokens=None,
        begin_suppress_tokens=None, watermarking_config=None, renormalize_logits=False,
    )
    if params.temperature > 0:
        # Warpers are built only when sampling: neutral values here, _RecordThenWarp applies
        # temperature and top-p after recording the raw logits. (Greedy builds no warpers, and
        # passing these would only draw "flag not used" warnings.)
        kwargs.update(temperature=1.0, top_p=1.0, top_k=0, min_p=None, typical_p=1.0,
                      epsilon_cutoff=0.0, eta_cutoff=0.0, top_h=None)
    # Older transformers lack some knobs (top_h, ...); what a version does not know it cannot apply.
    known = GenerationConfig().to_dict()
    return {key: value for key, value in kwargs.items() if key in known}


def _model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def load_hf_backend(cfg: BackendConfig) -> HFBackend:
    """Load `cfg.model` with fic.model (dtype resolved for the device: bf16 where supported)."""
    from fic.model import default_device, load_model, load_tokenizer

    device = default_device() if cfg.device == "auto" else cfg.device
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    model = load_model(cfg.model, dtype=cfg.dtype, device=device,
                       trust_remote_code=cfg.trust_remote_code)
    return HFBackend(model, tokenizer, batch_size=cfg.batch_size)
