"""`fic bench zero`: a run, its middle checkpoint, the resume, and the losses compared; under
DeepSpeed where it imports (as one plain process everywhere: tests/cli/test_launch.py runs it inside
the GPU session's rehearsal). And the HF backend's grad mode under ZeRO-3, which the ZeRO-3 VASD
check found."""

from __future__ import annotations

import argparse
import json
import shlex
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from fic.bench import zero
from fic.cli.launch_check import check as launch_check
from fic.cli.main import main
from fic.core.config import load_config
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig

pytestmark = pytest.mark.slow  # ZeRO-2/3 runs, saved and resumed

REPO = Path(__file__).resolve().parents[2]
TINY = ["--layers", "2", "--set=hidden_size=32", "--set=intermediate_size=64", "--set=num_attention_heads=2",
        "--set=num_key_value_heads=1", "--set=head_dim=16"]


def plan(stage: int, *extra: str) -> dict:
    parser = argparse.ArgumentParser()
    zero.add_arguments(parser)
    return zero.make_plan(parser.parse_args(["--stage", str(stage), "--dry-run", *extra]))


@pytest.mark.parametrize("stage", [2, 3])
def test_plan_launches_each_recipe_under_the_stage(stage):
    """accelerate launch with the stage's launch file on one process; the settings load with the
    trainers' configs and pass the launch check; VASD under ZeRO-3 is LoRA with the adapter-free
    teacher (no second copy), under ZeRO-2 full fine-tuning with the frozen copy; bf16 weights."""
    p = plan(stage)
    for method, info in p["methods"].items():
        argv = info["command"]
        assert argv[1:9] == ["-m", "accelerate.commands.launch", "--config_file", f"launch/deepspeed_zero{stage}.yaml",
                             "--num_processes", "1", "--main_process_port", "29500"]
        at = argv.index("--config")
        recipe, overrides = argv[at + 1], argv[at + 2:]
        cfg = load_config(SFTConfig if method == "sft" else VASDConfig, REPO / recipe, overrides)
        assert cfg.model.dtype == "bfloat16" and cfg.checkpoint.every == 2 and cfg.train.max_steps == 4
        assert cfg.out == info["run"] and info["resume_command"][-2:] == [f"out={info['resumed']}", "resume=true"]
        launch_check(REPO / f"launch/deepspeed_zero{stage}.yaml", REPO / recipe, num_processes=1,
                     overrides=overrides[:-1])
        assert info["check_command"][3] == "launch-check"
        if method == "vasd":
            assert cfg.lora.enabled == (stage == 3) and cfg.teacher.mode == "frozen"
            assert cfg.rollout.backend == "hf" and cfg.loss.keep_truncated and cfg.exclude.sources == []


def test_plan_refuses_an_odd_step_count():
    with pytest.raises(Exception, match="even number of steps"):
        plan(2, "--steps", "3")


def test_dry_run_prints_the_copy_between_run_and_resume(capsys):
    assert main(["bench", "zero", "--stage", "3", "--dry-run", "--json", "--methods", "vasd"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert [shlex.split(line)[2] for line in lines[:2]] == ["fic", "fic.bench.random_weights"]
    assert lines[2].split()[3] == "launch-check" and lines[4].startswith("'#' copy ")
    assert lines[5].endswith("resume=true")


@pytest.mark.skipif(find_spec("deepspeed") is None, reason="deepspeed does not import (pip install -e .[deepspeed])")
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_resume_on_this_machine(stage, tmp_path, smollm2_dir, capsys):
    """Where deepspeed imports (on a CPU too: its CPU accelerator and gloo), the real launch: ZeRO-2 and
    ZeRO-3, SFT and VASD, resumed with the same losses, checkpoints in DeepSpeed's format."""
    argv = ["bench", "zero", "--stage", str(stage), *TINY, "--rollout-tokens", "4", "--tokenizer", str(smollm2_dir),
            "--work", str(tmp_path), "--json"]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    for method, result in figures["methods"].items():
        assert result["ok"], (method, result.get("error"), result["log"])
        assert result["checkpoint"]["deepspeed_format"] and result["max_rel_diff"] <= 1e-3


# --------------------------------------------------------------------------- the HF backend under ZeRO-3

def test_hf_backend_samples_without_inference_mode_under_zero3(tiny_model_dir):
    """ZeRO-3 frees each gathered weight after a forward; freed under inference_mode the weights come
    back as inference tensors and PEFT's requires_grad_ fails after the teacher's pass. A model whose
    parameters carry ds_id (ZeRO-3's mark) is sampled under no_grad; any other under inference_mode,
    and both give the same greedy tokens."""
    from fic.backends.hf import HFBackend
    from fic.core.generation import SamplingParams
    from fic.core.model import load_model, load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir, dtype="float32")
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append(torch.is_inference_mode_enabled()))
    prompt = [tokenizer.encode("Hello there")]
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    plain = HFBackend(model, tokenizer).generate(prompt, params)
    assert seen and all(seen)
    seen.clear()
    for p in model.parameters():
        p.ds_id = 0
    partitioned = HFBackend(model, tokenizer).generate(prompt, params)
    assert seen and not any(seen)
    assert partitioned[0].token_ids == plain[0].token_ids
    assert all(not p.is_inference() for p in model.parameters())
