"""The hf backend in lockstep across processes: with weights partitioned over ranks (ZeRO-3,
FSDP) every forward pass is a collective, so every rank must run as many as the others whatever
its rows. Two gloo processes on the CPU stand in: each wraps the tiny model so that every forward
first all-reduces (the forward's ordinal, checked equal on both ranks: a rank one pass ahead or
behind fails there), and each gets other rows: rank 0 five prompts that share a system prompt
(three micro-batches, extra prefill passes for the shared prefix, 24 new tokens), rank 1 one
short prompt (10 new tokens) and then, in the second turn, none at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ranks import on_ranks

from fic.core.generation import SamplingParams

WORLD = 2
NEXT_TURN = "<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"


def _workload(tokenizer, rank: int) -> tuple[list[list[int]], SamplingParams]:
    """Rank `rank`'s first-turn prompts and sampling (per-prompt seeds)."""
    from fic.core.chat import prompt_ids

    if rank == 0:
        system = {"role": "system", "content": "You add numbers carefully and say the sum. " * 6}
        questions = ["2 + 3?", "What is 40 + 2?", "Add 7 and 8.", "Sum 1, 2 and 3.", "9 + 9?"]
        prompts = [prompt_ids(tokenizer, [system, {"role": "user", "content": q}]) for q in questions]
        return prompts, SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seeds=(1, 2, 3, 4, 5))
    return [prompt_ids(tokenizer, [{"role": "user", "content": "Hi"}])], \
        SamplingParams(max_new_tokens=10, temperature=1.0, seeds=(6,))


def _play(backend, tokenizer, rank: int) -> list[list[list[int]]]:
    """Two turns: the first samples, the second continues each conversation greedily (its keys
    and values reused); rank 1 has no second turn and calls with no prompts."""
    prompts, params = _workload(tokenizer, rank)
    first = backend.generate(prompts, params)
    extra = tokenizer.encode(NEXT_TURN, add_special_tokens=False)
    nxt = [p + g.token_ids + extra for p, g in zip(prompts, first)] if rank == 0 else []
    second = backend.generate(nxt, SamplingParams(max_new_tokens=params.max_new_tokens))
    return [[g.token_ids for g in first], [g.token_ids for g in second]]


def _backend(model, tokenizer, stops=None, **kwargs):
    from fic.backends.hf import HFBackend

    backend = HFBackend(model, tokenizer, batch_size=2, kv_reuse_mb=64, **kwargs)
    if stops is not None:
        backend.stop_ids = frozenset(stops)
    return backend


def worker(rank: int, model_dir: str, stops: list[int], out: str) -> None:
    """One rank (run in its own process by `on_ranks`, which started the process group)."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from fic.backends.decoding import lockstep_wanted
    from fic.core.model import load_tokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(model_dir)
    forwards = [0]

    def collective(module, args, kwargs):  # what ZeRO-3's all-gathers make of every forward
        forwards[0] += 1
        agreed = torch.tensor([1.0, float(forwards[0]), 0.0])
        dist.all_reduce(agreed)
        if agreed[1].item() != WORLD * forwards[0]:
            raise RuntimeError(f"rank {rank}: forward {forwards[0]} met another rank's forward {agreed[1] - forwards[0]}")

    model.register_forward_pre_hook(collective, with_kwargs=True)
    replies = _play(_backend(model, tokenizer, stops, lockstep=True), tokenizer, rank)
    Path(out).write_text(json.dumps({"replies": replies, "forwards": forwards[0], "auto": lockstep_wanted(model)}))


RANK = """
import json
sys.path.insert(0, argv[0])
from test_decoding_ranks import worker
worker(ranks.rank, argv[1], json.loads(argv[2]), argv[3] + f"/rank{ranks.rank}.json")
"""


@pytest.mark.slow  # two processes load torch and transformers
def test_ranks_in_lockstep_run_the_same_forwards_and_decode_as_one_process(tiny, tiny_model_dir, tmp_path):
    import shutil

    model, tokenizer = tiny
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    for path in Path(tiny_model_dir).iterdir():
        if path.name.startswith(("tokenizer", "special_tokens_map", "chat_template")):
            shutil.copy(path, folder / path.name)
    # Stop ids that rank 0's rows write at different steps: its replies end unevenly.
    free = _backend(model, tokenizer, []).generate(*_workload(tokenizer, 0))
    stops = sorted({g.token_ids[k] for g, k in zip(free, (3, 11, 17)) if g.token_ids[k] not in g.token_ids[:k]}
                   | _backend(model, tokenizer).stop_ids)

    # Each rank's rows decoded by one process alone, forwards counted.
    alone, alone_forwards = [], []
    for rank in range(WORLD):
        calls: list[int] = []
        handle = model.register_forward_pre_hook(lambda *_, seen=calls: seen.append(1))
        try:
            alone.append(_play(_backend(model, tokenizer, stops), tokenizer, rank))
        finally:
            handle.remove()
        alone_forwards.append(len(calls))
    assert len({len(r) for r in alone[0][0]}) >= 3  # rank 0's first replies end at different steps

    ranks = on_ranks(RANK, WORLD, str(Path(__file__).parent), str(folder), json.dumps(stops), str(tmp_path),
                     bound=60, timeout=300)  # a rank one forward off waits 60 s, then fails naming its phase
    assert all(r.returncode == 0 for r in ranks), "\n".join(r.stderr[-3000:] for r in ranks)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]

    assert results[0]["forwards"] == results[1]["forwards"]
    # Rank 1 alone would have run far fewer passes: the difference is idle steps and placeholder passes.
    assert results[1]["forwards"] > alone_forwards[1] and results[0]["forwards"] >= alone_forwards[0]
    for rank in range(WORLD):
        assert results[rank]["replies"] == alone[rank]
    assert results[1]["replies"][1] == []
    # Whole weights on every rank (no ZeRO-3, no FSDP): lockstep is not on by itself.
    assert not results[0]["auto"]
