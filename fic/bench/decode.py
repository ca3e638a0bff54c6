"""`fic bench decode`: the hf backend's decoding loop alone, against transformers' `generate`.

One model (a tiny random Llama built from a config by default; `--model` a checkpoint folder such
as the bundled SmolLM2, `--model-config` a transformers config.json to build random weights
from, e.g. a 3B backbone's on a GPU), `--rows` prompts of random ids, from half `--prompt-tokens` long to all of it, left-padded (as the
backend lays out a batch), and
`--steps` decoding steps for every row (no stop id can come up, so every way runs the same
steps). Three ways decode them, greedy and sampled (`--temperature`, `--top-p`, top-k off), each
timed `--repeats` times in turn so that load from other processes weighs on all alike:

- `fast`: `fic.backends.decoding.decode`, the loop the backend runs (`--check-every`);
- `legacy`: `decode_legacy`, the loop before it (`decode_loop=legacy`);
- `generate`: `model.generate` on the same ids, mask, steps and sampling settings.

Printed per way and mode: ms a step (the median call over its steps, the first step's prompt
read included), the host's waits for the device a step (`SyncCounter`, one extra untimed call
each), and the ratios `fast/generate`, `legacy/generate` and `fast/legacy` of ms a step
(`ratio`: fast over generate, sampled). `roofline_*`: the bytes a step must read (the weights
once, plus the keys and values the rows attend to) over the step's time, as a share of this
device's copy bandwidth measured in the same run (`fic.bench.roofline.copy_bandwidth`).

`--stops N` adds a sweep of `check_every` with replies that end: N stop ids drawn at random, so
that sampled replies end after about vocabulary / N tokens (capped at `--steps`); printed, ms
per reply token written (padding after a stop not counted) for each of `--sweep`'s values and
for the legacy loop. The fast loop writes the same replies whatever its `check_every`. A larger `check_every` waits on the device less often but runs finished rows
and batches for up to `check_every - 1` steps past their end.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fic.backends.decoding import CHECK_EVERY, decode, decode_legacy
from fic.bench.roofline import copy_bandwidth
from fic.core.errors import FicError
from fic.core.generation import SamplingParams

WAYS = ("fast", "legacy", "generate")


class SyncCounter(TorchDispatchMode):
    """Counts, while active, the operations that make the host wait for the device: reading a
    value (`.item()`, `int()`, `bool()`: `aten._local_scalar_dense`, or under inference mode
    `aten.item` and `aten.is_nonzero`), `nonzero`, indexing with a boolean mask (its result's size
    is data), other data-sized results (`unique`, `repeat_interleave` without a size,
    `masked_select`), `equal`, and copies to the host.

    A copy to the host (`.tolist()`, `.cpu()`, `.numpy()`) of a tensor already in host memory
    is no dispatched operation, so on a CPU those three are counted by wrapping the methods:
    every call counts, as it would wait on a GPU. `counts` holds the tally by kind."""

    # item and is_nonzero: what `.item()` and `bool()` dispatch under inference_mode
    SCALAR = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal")
    DATA_SIZED = ("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique", "aten::_unique2",
                  "aten::unique_consecutive", "aten::unique_dim")
    INDEXING = ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_")
    HOST_METHODS = ("tolist", "cpu", "numpy")

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self._saved: dict[str, Callable] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> SyncCounter:  # noqa: PYI034 (a TorchDispatchMode, not a plain class)
        for name in self.HOST_METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def counted(tensor: torch.Tensor, *args: Any, _original: Callable = original, _name: str = name,
                        **kwargs: Any) -> Any:
                if tensor.device.type == "cpu":  # elsewhere the copy is dispatched, and counted there
                    self.counts[f"host read ({_name})"] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        if name in self.SCALAR:
            self.counts["scalar read"] += 1
        elif name in self.DATA_SIZED or (name == "aten::repeat_interleave" and kwargs.get("output_size") is None
                                         and isinstance(args[0], torch.Tensor) and len(args) < 3):
            self.counts["data-sized result"] += 1
        elif name in self.INDEXING and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                           for i in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple))
                                                     else ())):
            self.counts["boolean mask"] += 1
        elif name in ("aten::_to_copy", "aten::copy_") and _to_host(args, kwargs):
            self.counts["copy to host"] += 1
        return func(*args, **kwargs)


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether a copy moves a device tensor into host memory."""
    if not args or not isinstance(args[0], torch.Tensor):
        return False
    if len(args) > 1 and isinstance(args[1], torch.Tensor):  # copy_(destination, source)
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    target = kwargs.get("device")
    return target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="checkpoint folder (e.g. models/smollm2-135m-instruct); default: a tiny random "
                             "Llama (hidden 64, 2 layers, SmolLM2's vocabulary of 49,152)")
    parser.add_argument("--model-config", default=None,
                        help="a transformers config.json: random weights of that shape (e.g. a backbone's, on a GPU)")
    parser.add_argument("--rows", type=int, default=16, help="rows decoded together (default: 16)")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length of every row (default: 16)")
    parser.add_argument("--steps", type=int, default=64, help="decoding steps every row runs (default: 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per way and mode (default: 5)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampled mode's temperature (default: 1.0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="sampled mode's top-p (default: 1.0)")
    parser.add_argument("--check-every", type=int, default=CHECK_EVERY,
                        help=f"the fast loop's steps between reads of the device (default: {CHECK_EVERY})")
    parser.add_argument("--stops", type=int, default=0,
                        help="also sweep check_every with replies that end: this many random stop ids (0: no sweep)")
    parser.add_argument("--sweep", default="1,4,8,16,32", help="check_every values of the sweep (default: 1,4,8,16,32)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default: auto)")
    parser.add_argument("--dtype", default="float32", help="weights dtype: float32, bfloat16, float16 (default: float32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompts (default: 0)")


def _model(args: argparse.Namespace, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    if args.model and args.model_config:
        raise FicError("give --model or --model-config, not both", field="--model-config")
    if args.model:
        from fic.core.model import check_model_folder

        folder = check_model_folder(args.model)
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    if args.model_config:
        from fic.core.records import read_json

        fields = read_json(args.model_config, "a transformers config.json")
        if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
            raise FicError("expected a transformers config.json with its model_type", path=args.model_config,
                           field="--model-config")
        from transformers import CONFIG_MAPPING

        fields = dict(fields)
        kind = fields.pop("model_type")
        if kind not in CONFIG_MAPPING:
            raise FicError(f"model_type {kind!r} is not one this transformers knows", path=args.model_config,
                           field="--model-config")
        config = AutoConfig.for_model(kind, **fields)
    else:
        config = LlamaConfig(vocab_size=49152, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=4, intermediate_size=128, tie_word_embeddings=True)
    with torch.random.fork_rng():
        torch.manual_seed(args.seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(args: argparse.Namespace) -> dict:
    from fic.backends.hf import GrowingLayer, new_cache
    from fic.core.model import default_device

    for name in ("rows", "prompt_tokens", "steps", "repeats", "check_every"):
        if getattr(args, name) < 1:
            raise FicError(f"expected a positive number, got {getattr(args, name)}", field="--" + name.replace("_", "-"))
    if not 0 < args.top_p <= 1 or args.temperature <= 0:
        raise FicError("the sampled mode needs temperature > 0 and 0 < top-p <= 1", field="--temperature")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if args.dtype not in dtypes:
        raise FicError(f"expected one of {', '.join(dtypes)}, got {args.dtype!r}", field="--dtype")
    sweep = _sweep_values(args.sweep) if args.stops else []
    device = torch.device(default_device() if args.device == "auto" else args.device)
    model = _model(args, str(device), dtypes[args.dtype])
    vocab = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(vocab, (args.rows, args.prompt_tokens), generator=generator)
    mask = torch.ones_like(input_ids)
    for row in range(args.rows):  # lengths spread from half the width to all of it
        mask[row, :(args.prompt_tokens // 2) * (args.rows - 1 - row) // max(1, args.rows - 1)] = 0
    padded = bool((mask == 0).any())
    input_ids, mask = input_ids.masked_fill(mask == 0, 0).to(device), mask.to(device)
    never = frozenset({vocab})  # no sampled id can equal it: every row runs every step
    full_attention = all(isinstance(layer, GrowingLayer) for layer in new_cache(model, 1).layers)
    seeds = list(range(args.rows))

    def run(way: str, params: SamplingParams, stops: frozenset[int] = never, check_every: int = args.check_every):
        """One call; returns the ids it wrote."""
        if way == "generate":
            config = _generation_config(params, pad_id=0)
            return model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)[:, input_ids.shape[1]:]
        cache = new_cache(model, input_ids.shape[1] + params.max_new_tokens)
        if way == "legacy":
            return decode_legacy(model, cache, input_ids, mask, params, stops=stops, pad_id=0, seeds=seeds).ids
        return decode(model, cache, input_ids, mask, params, stops=stops, pad_id=0, seeds=seeds,
                      check_every=check_every, full_attention=full_attention, padded=padded).ids

    modes = {"greedy": SamplingParams(max_new_tokens=args.steps),
             "sampled": SamplingParams(max_new_tokens=args.steps, temperature=args.temperature, top_p=args.top_p)}
    figures: dict = {"device": str(device), "dtype": args.dtype, "rows": args.rows, "prompt_tokens": args.prompt_tokens,
                     "steps": args.steps, "check_every": args.check_every, "vocab": vocab,
                     "parameters": sum(p.numel() for p in model.parameters())}
    with torch.inference_mode():
        ms: dict[tuple[str, str], float] = {}
        for mode, params in modes.items():
            for way in WAYS:  # warm-up: allocations, kernel choice; then the waits, counted once
                run(way, params)
                with SyncCounter() as counter:
                    run(way, params)
                figures[f"{mode}_{way}_syncs_per_step"] = round(counter.total / args.steps, 4)
            times: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(args.repeats):
                for way in WAYS:
                    _synchronize(device)
                    began = time.perf_counter()
                    run(way, params)
                    _synchronize(device)
                    times[way].append(time.perf_counter() - began)
            for way in WAYS:
                ms[mode, way] = 1000 * statistics.median(times[way]) / args.steps
                figures[f"{mode}_{way}_ms_per_step"] = round(ms[mode, way], 4)
            figures[f"{mode}_fast_over_generate"] = round(ms[mode, "fast"] / ms[mode, "generate"], 4)
            figures[f"{mode}_legacy_over_generate"] = round(ms[mode, "legacy"] / ms[mode, "generate"], 4)
            figures[f"{mode}_fast_over_legacy"] = round(ms[mode, "fast"] / ms[mode, "legacy"], 4)
        figures.update(_roofline(model, args, device, {way: ms["greedy", way] for way in WAYS}))
        if args.stops:
            figures.update(_sweep(args, sweep, run, vocab, modes["sampled"]))
    figures["ratio"] = figures["sampled_fast_over_generate"]
    return figures


def _generation_config(params: SamplingParams, pad_id: int) -> Any:
    """`generate`'s settings for the same decoding: nothing from the checkpoint's own
    generation_config (top_k=50, repetition penalty, ...), no stop id, every step run."""
    from transformers import GenerationConfig

    sampled = params.temperature > 0
    return GenerationConfig(do_sample=sampled, temperature=params.temperature if sampled else None,
                            top_p=params.top_p if sampled else None, top_k=None, eos_token_id=None,
                            pad_token_id=pad_id, max_new_tokens=params.max_new_tokens)


def _roofline(model: Any, args: argparse.Namespace, device: torch.device, ms: dict[str, float]) -> dict:
    """What a greedy step must read from memory at least (every weight once, and the keys and values
    each row attends to), over the step's time, as a share of the measured copy bandwidth."""
    config = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    mean_length = args.prompt_tokens + (args.steps + 1) / 2
    cache = 2 * config.num_hidden_layers * heads * head_dim * element * mean_length * args.rows
    bandwidth = copy_bandwidth(device)
    out = {"roofline_bytes_per_step": int(weights + cache), "roofline_bandwidth_gb_s": round(bandwidth / 1e9, 2)}
    for way, step_ms in ms.items():
        out[f"roofline_greedy_{way}"] = round((weights + cache) / (step_ms / 1000) / bandwidth, 4)
    return out


def _sweep_values(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",")})
    except ValueError as err:
        raise FicError(f"expected comma-separated integers, got {text!r}", field="--sweep") from err
    if not values or values[0] < 1:
        raise FicError("every check_every of the sweep must be at least 1", field="--sweep")
    return values


def _sweep(args: argparse.Namespace, values: list[int], run: Callable, vocab: int, params: SamplingParams) -> dict:
    """ms per reply token written with `args.stops` random stop ids, per check_every and legacy."""
    generator = torch.Generator().manual_seed(args.seed + 1)
    stops = frozenset(torch.randperm(vocab, generator=generator)[:args.stops].tolist())
    ways = [("legacy", None)] + [("fast", k) for k in values]
    times: dict[str, list[float]] = {}
    tokens: dict[str, int] = {}
    for _ in range(args.repeats):
        for way, k in ways:
            name = "legacy" if k is None else f"check_every_{k}"
            began = time.perf_counter()
            ids = run(way, params, stops=stops, check_every=k or 1)
            times.setdefault(name, []).append(time.perf_counter() - began)
            tokens[name] = _reply_tokens(ids.cpu().tolist(), stops)
    return {f"sweep_{name}_ms_per_token": round(1000 * statistics.median(t) / tokens[name], 4)
            for name, t in times.items()} | {"sweep_stops": args.stops,
                                             "sweep_mean_reply_tokens": round(tokens["legacy"] / args.rows, 2)}


def _reply_tokens(rows: list[list[int]], stops: frozenset[int]) -> int:
    """Tokens written up to and including each row's first stop id."""
    return sum(next((i + 1 for i, t in enumerate(row) if t in stops), len(row)) for row in rows)
