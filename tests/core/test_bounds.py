"""Every setting that sizes an allocation, a loop or a retry count has an upper bound, checked as
the config loads (so `--dry-run` refuses it before any model loads) and shown by `--keys` (issue
56, item 7), VASD's sections included."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from fic.cli.main import main
from fic.core.bounds import bounds_text
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.corpus.build import SFTDataConfig
from fic.demo.run import DemoConfig
from fic.evaluation.evaluate import EvalConfig
from fic.probe.run import ProbeConfig
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig

VERBS = (EvalConfig, SFTConfig, VASDConfig, SFTDataConfig, ProbeConfig, DemoConfig)
# Numbers that size nothing: rates, scales, thresholds (why each is unbounded above).
SIZE_NOTHING = {
    "temperature": "a sampling temperature (logits divided by it)",
    "lr": "a learning rate", "weight_decay": "a decay rate", "eps": "AdamW's epsilon",
    "max_grad_norm": "a clipping threshold", "min_delta": "a threshold in the metric's units",
    "alpha": "LoRA's scale (alpha / r)", "max_words": "a length above which a reply is rejected",
    "betas": "AdamW's betas", "temperatures": "sampling temperatures", "seeds": "seeds, each a whole run",
    "weight": "a loss term's weight", "anchor_weight": "a loss term's weight",
    "reference_weight": "a loss term's weight", "nonfinal_weight": "a token weight",
    "decision_weight": "a token weight", "first_token_weight": "a token weight",
    "max_log_ratio": "a clip in log-probability units", "logprob_check_tolerance": "a warning threshold",
}


def numeric_settings() -> dict[str, dataclasses.Field]:
    """Every int or float setting of every verb's config, once per class."""
    found: dict[str, dataclasses.Field] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if dataclasses.is_dataclass(kind):
                walk(kind, f"{prefix}{f.name}.")
            elif kind is not bool and any(t in str(kind) for t in ("int", "float")) and "str" not in str(kind):
                found.setdefault(f"{cls.__module__}.{cls.__qualname__}.{f.name}", f)

    for verb in VERBS:
        walk(verb, "")
    return found


def test_every_setting_that_sizes_memory_time_or_retries_has_an_upper_bound():
    unbounded = sorted(name for name, f in numeric_settings().items()
                       if not (" to " in bounds_text(f.name, dict(f.metadata)) or
                               bounds_text(f.name, dict(f.metadata)).startswith("at most")))
    assert unbounded and all(name.rsplit(".", 1)[1] in SIZE_NOTHING for name in unbounded), \
        [name for name in unbounded if name.rsplit(".", 1)[1] not in SIZE_NOTHING]


@pytest.mark.parametrize("verb,override,field,bound", [
    ("train sft", "lora.r=1000000", "lora.r", "4096"),
    ("train sft", "lora.r=1000000000000000000000000000000", "lora.r", "4096"),
    ("train sft", "train.pad_to_multiple=1000000000", "train.pad_to_multiple", "65536"),
    ("train sft", "train.grad_accum_steps=1000000000000", "train.grad_accum_steps", "65536"),
    ("train sft", "train.micro_batch_size=100000", "train.micro_batch_size", "4096"),
    ("train sft", "checkpoint.keep_last=100000", "checkpoint.keep_last", "1000"),
    ("sft-data", "conversations_per_instance=1000000000000", "conversations_per_instance", "1000"),
    ("eval", "runs=1000000000000", "runs", "1000"),
    ("eval", "model.max_retries=1000000000000000000000000000000", "model.max_retries", "100"),
    ("eval", "model.batch_size=100000", "model.batch_size", "4096"),
    ("eval", "model.kv_reuse_mb=1e12", "model.kv_reuse_mb", "1048576"),
    ("eval", "user.max_idle_turns=1000000", "user.max_idle_turns", "1000"),
    ("probe", "judge.retries=1000000", "judge.retries", "100"),
    ("train vasd", "rollout.batch_size=100000", "rollout.batch_size", "4096"),
    ("train vasd", "rollout.kv_reuse_mb=1e12", "rollout.kv_reuse_mb", "1048576"),
    ("train vasd", "loss.top_k=1000000000", "loss.top_k", "1048576"),
    ("train vasd", "terms.labels.max_turns=1000000", "terms.labels.max_turns", "1000"),
    ("train vasd", "terms.reward.group_size=1000000", "terms.reward.group_size", "4096"),
    ("train vasd", "anchor.share=1e9", "anchor.share", "1000"),
    ("train vasd", "dev.every=1000000000000", "dev.every", "10000000"),
    ("train vasd", "logging.samples_every=1000000000000", "logging.samples_every", "10000000"),
])
def test_a_value_past_its_bound_is_refused_by_the_dry_run_before_any_model_loads(verb, override, field, bound, capsys,
                                                                                 monkeypatch):
    from fic.core import model

    monkeypatch.setattr(model, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main([*verb.split(), override, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"field '{field}': expected a value <= {bound}, got" in err


def test_the_keys_listing_shows_each_settings_bounds(capsys):
    assert main(["train", "sft", "--keys"]) == 0
    text = capsys.readouterr().out
    assert "train.grad_accum_steps (an integer, default 1, 1 to 65,536):" in text
    assert "lora.r (an integer, default 16, 1 to 4,096):" in text
    assert "checkpoint.every (an integer, default 100, 0 to 10,000,000):" in text
    assert "logging.print_every_s (a number, default 60.0, 1 to a week):" in text  # the bound its name implies
    assert "optim.lr (a number, default 2e-05, at least 0):" in text
    assert main(["eval", "--keys"]) == 0
    text = capsys.readouterr().out
    assert "model.max_retries (an integer, default 5, 0 to 100):" in text and "runs (an integer, default 1, 1 to 1,000)" \
        in text and "top_p (a number, default 1.0, above 0 to 1):" in text


def test_a_bound_holds_in_a_section_file_and_in_python_too(tmp_path):
    with pytest.raises(FicError, match="expected a value <= 1000, got 5000"):
        load_config(EvalConfig, None, ["runs=5000"])
    data = tmp_path / "bench.yaml"
    data.write_text("source: [gsm8k]\nlimit: 100000000\n")
    with pytest.raises(FicError, match=r"bench.yaml.*field 'data.limit': expected a value <= 10000000"):
        load_config(EvalConfig, None, [f"data={data}"])
