"""The backends' tiny model: conftest's random Llama with weights redrawn so that it writes
varied tokens (`sharpen`), and prompts of different lengths for it."""

from __future__ import annotations

import pytest
import torch


def _sharpen(model: torch.nn.Module) -> torch.nn.Module:
    """Re-draw the weights at a larger scale, with an untied output layer. A default random
    init (std 0.02, tied embeddings) gives near-uniform logits and repeats its input token
    forever, which would make the batching and stopping tests vacuous; this one writes varied
    tokens with log-probs around -4, far from argmax ties."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                scale = 1.0 if "embed" in name else 2.0 / param.shape[1] ** 0.5
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(torch.randn(head.weight.shape, generator=gen) * 2.0 / head.weight.shape[1] ** 0.5)
        model.config.tie_word_embeddings = False
    return model.float().eval()


@pytest.fixture(scope="session")
def sharpen():
    """The function that redraws a model's weights (for models other than `tiny`)."""
    return _sharpen


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    """(model, tokenizer) from conftest's tiny Llama: fp32, eval mode, sharpened logits."""
    from transformers import AutoModelForCausalLM

    from fic.core.model import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return _sharpen(model), load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(tiny):
    from fic.core.chat import prompt_ids

    _, tokenizer = tiny
    texts = ["Hi", "What is 2 + 2?", "Tell me a long story about a cat who learns to count " * 3,
             "ok", "Name three colours.", "Why is the sky blue? Explain briefly."]
    return [prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts]
