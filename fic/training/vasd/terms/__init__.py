"""The loss terms of a VASD run: the paper's two, and the plug-ins found in this folder.

Each module here holds one arm beyond the paper's VASD and declares it as `PLUGIN`
(`fic.training.vasd.term.PlugIn`): its settings (`terms.<name>.*`), its term and its rows. They
are found by name, in name order, so adding a term is adding a file, and deleting an arm is
deleting its file (and its tests).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Sequence

from fic.training.vasd.term import CROSS_ENTROPY, DIVERGENCE, PlugIn, Term


def _found() -> tuple[PlugIn, ...]:
    modules = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    return tuple(importlib.import_module(f"{__name__}.{name}").PLUGIN for name in modules)


PLUGINS = _found()


def run_terms(cfg: Any, *, anchors: bool) -> list[Term]:
    """The terms a run of `cfg` trains, in the order they are summed: the divergence to the
    teacher at the distilled replies (`loss.weight`), the anchor's cross-entropy on SFT-corpus
    conversations (when the batches hold some: `anchors`), then each plug-in's that is on."""
    core = [Term("distill", DIVERGENCE, "divergence_per_token", cfg.loss.weight, reads="teacher",
                 temperature=cfg.loss.temperature),
            Term("anchor", CROSS_ENTROPY, "anchor_ce", cfg.anchor.weight if anchors else 0.0)]
    declared = [plugin.term(cfg) for plugin in PLUGINS if plugin.term is not None]
    return [term for term in core + declared if term is not None and term.weight > 0]


def of(terms: Sequence[Term]) -> list[PlugIn]:
    """The plug-ins whose term is among `terms` (a run's: theirs are on)."""
    names = {term.name for term in terms}
    return [plugin for plugin in PLUGINS if plugin.name in names]
