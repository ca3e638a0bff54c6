"""Keeping evaluation problems out of training data.

Generated sources overlap in ways that are easy to miss: reasoning-gym builds problem i of a
seed from the random state `seed + i`, so two seeds give the same problems shifted by their
difference, and a larger limit repeats a smaller one's problems. A training stage therefore
names the evaluation data it must not see (`ExcludeSection`, a `exclude:` section in its
recipe) and drops every instance that matches it (or refuses, with `on_overlap: refuse`):

- the same task id, or
- the same full prompt once normalised (lowercase, words and numbers only), whatever its id,
- and with `templates: true`, any instance generated from a template an excluded instance
  comes from (gsm_symbolic records its template, e.g. `gsm_symbolic/38`): the evaluation
  then measures transfer to problem shapes the model never trained on.

An entry of `sources` is what `fic eval` read: an eval recipe or a run's `config.yaml`
(the exact instances that evaluation plays: source, task, limit and seed), an eval run
folder, or a file of instances (`lic:PATH`, `jsonl:PATH`, or a `.json`/`.jsonl` path).
A bare generated source (`reasoning-gym:NAME`) is refused: without its seed and limit it
names no particular problems.

`fic sft-data` uses it (the data card records the overlap found and dropped); VASD's data
loader calls `exclude_instances` the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fic import tasks
from fic.core.config import from_mapping, read_yaml, setting
from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.data.sources import InstancesSection, load_sources, load_tasks


@dataclass
class ExcludeSection:
    """Evaluation data a training stage must not see."""

    sources: list[str] = setting([], "Evaluation data to keep out of training: eval recipe/config YAML files, eval "
                                 "run folders, or files of instances (lic:PATH, jsonl:PATH). An instance with the "
                                 "same task id or the same normalised prompt is excluded.")
    on_overlap: str = setting("drop", "drop: leave overlapping instances out and count them in the data card; "
                              "refuse: stop with an error naming the first one.", choices=("drop", "refuse"))
    templates: bool = setting(False, "Also exclude every instance generated from a template an evaluation instance "
                              "comes from (gsm_symbolic), so the evaluation measures transfer to unseen problem "
                              "shapes.")


def normalise(text: str) -> str:
    """A prompt reduced to its lowercase words and numbers: spacing, case and punctuation never
    hide a repeat."""
    return " ".join(re.findall(r"[a-z0-9]+(?:\.[0-9]+)?", text.lower()))


def prompt_key(instance: Instance) -> str:
    return normalise(tasks.of(instance).full_prompt(instance))


def load_excluded(spec: str) -> list[Instance]:
    """The instances one `sources` entry names (see the module docstring)."""
    path = Path(spec)
    if path.is_dir():
        path = path / "config.yaml"
        if not path.is_file():
            raise FicError("an eval run folder holds config.yaml; none here", path=str(path.parent),
                           field="exclude.sources")
    if path.suffix in (".yaml", ".yml"):  # an eval recipe or run config: its `data:` section names them
        section = read_yaml(path).get("data")
        if not isinstance(section, dict):
            raise FicError("expected an eval recipe or run config with a data: section", path=str(path),
                           field="exclude.sources")
        data = from_mapping(InstancesSection, section, str(path), prefix="data.")
        return [instance for loaded in load_sources(data) for instance in loaded.instances]
    kind, _, _ = spec.partition(":")
    if kind in ("lic", "jsonl"):
        return load_tasks(spec, "all")[0]
    if path.suffix in (".json", ".jsonl"):
        return load_tasks(f"jsonl:{spec}", "all")[0]
    raise FicError(f"cannot tell which instances {spec!r} names; give the eval recipe or run folder (they fix the "
                   "seed and limit of a generated source), or a file of instances (lic:PATH, jsonl:PATH)",
                   field="exclude.sources")


@dataclass
class Exclusion:
    """What is excluded, keyed the three ways instances are matched."""

    cfg: ExcludeSection
    task_ids: set[str]
    prompts: set[str]
    templates: set[str]
    instances: int

    def reason(self, instance: Instance) -> str | None:
        """Why `instance` is excluded (`task_id`, `prompt` or `template`), or None."""
        if instance.task_id in self.task_ids:
            return "task_id"
        if prompt_key(instance) in self.prompts:
            return "prompt"
        template = instance.fields.get("template")
        if template is not None and template in self.templates:
            return "template"
        return None

    def apply(self, instances: list[Instance]) -> tuple[list[Instance], dict[str, int]]:
        """The instances that are not excluded, and how many were found per match kind; with
        `on_overlap: refuse` the first overlap is an error instead."""
        kept, found = [], {"task_id": 0, "prompt": 0, "template": 0}
        for instance in instances:
            why = self.reason(instance)
            if why is None:
                kept.append(instance)
                continue
            if self.cfg.on_overlap == "refuse":
                raise FicError(f"instance {instance.task_id!r} is an evaluation problem (same "
                               f"{why.replace('_', ' ')}); drop it from the training data or set "
                               "exclude.on_overlap=drop", field="exclude.sources")
            found[why] += 1
        return kept, found

    def report(self, found: dict[str, int]) -> dict:
        """For a data card: the sources, their instances, the overlap found and dropped."""
        return {"sources": list(self.cfg.sources), "evaluation_instances": self.instances,
                "templates_held_out": sorted(self.templates), "overlap": dict(found),
                "dropped": sum(found.values())}


def build_exclusion(cfg: ExcludeSection) -> Exclusion:
    excluded = [instance for spec in cfg.sources for instance in load_excluded(spec)]
    templates = {i.fields["template"] for i in excluded if i.fields.get("template") is not None}
    if cfg.templates and excluded and not templates:
        raise FicError("templates: true, but no excluded instance records its template (only generators built "
                       "from templates, such as reasoning-gym:gsm_symbolic, do)", field="exclude.templates")
    return Exclusion(cfg=cfg, task_ids={i.task_id for i in excluded}, prompts={prompt_key(i) for i in excluded},
                     templates=templates if cfg.templates else set(), instances=len(excluded))


def exclude_instances(instances: list[Instance], cfg: ExcludeSection) -> tuple[list[Instance], dict]:
    """`instances` without the excluded ones, and the report for a data card."""
    exclusion = build_exclusion(cfg)
    kept, found = exclusion.apply(instances)
    return kept, exclusion.report(found)
