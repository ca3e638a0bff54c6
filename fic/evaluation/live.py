"""The live model of a training run, evaluated as it trains: a `fic eval` of the weights in
memory (no checkpoint written), greedy, under LiC's rules, reduced to the figures a training
curve draws. SFT's dev curve (`dev.every`, the plateau rule) and VASD's held-out evaluation
(`eval.every`) both read it, on every rank of a multi-process run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fic.backends.hf import HFBackend
from fic.core.generation import BackendConfig
from fic.core.ranks import Ranks
from fic.core.stats import CURVE_FIGURES
from fic.data.sources import InstancesSection
from fic.evaluation.evaluate import EvalConfig, evaluate


def evaluate_live(model: Any, tokenizer: Any, data: InstancesSection, views: list[str], *, max_new_tokens: int,
                  batch_size: int, out: Path, prefix: str, ranks: Ranks | None = None) -> dict[str, float | None]:
    """`fic eval` of `model` as it is in memory on `data` in `views` (one greedy run each,
    stopping at the first correct answer), its records and report in `out`; returns
    `{prefix + view + "_" + figure: value}` for each of `CURVE_FIGURES` a view has.

    Every rank of a multi-process run calls it (`ranks`, default: torch.distributed's): each plays
    its share of the conversations, in lockstep with the others (a sharded model runs every forward
    on every rank), the main process writes `out`, and every rank returns the same figures."""
    cfg = EvalConfig(model=BackendConfig(model=str(out)), data=data, views=list(views), runs=1, temperature=0.0,
                     max_new_tokens=max_new_tokens, out=str(out))
    was_training = model.training
    model.eval()
    try:
        metrics = evaluate(cfg, assistant=HFBackend(model, tokenizer, batch_size=batch_size), progress=False,
                           ranks=ranks or Ranks.current())
    finally:
        model.train(was_training)
    return {f"{prefix}{view}_{name}": values.get(name) for view, values in metrics["views"].items()
            for name in CURVE_FIGURES if values.get(name) is not None}
