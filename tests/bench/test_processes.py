"""`fic bench zero --processes N`: SFT on N gloo processes on this CPU under DDP, ZeRO-2, ZeRO-3 and
FSDP2 gives one process's losses, dev figures and final weights, and resumes exactly. The slow test
runs ZeRO-3 and FSDP2 with 2 processes, the dev curve scored at every step (ZeRO-3 with dev.every
hung: the dev curve ran on the main process only) and the ranks' shares of the dev instances
uneven; `fic bench zero --processes 3` runs every path (docs/launching.md)."""

from __future__ import annotations

import argparse
import json
from importlib.util import find_spec
from pathlib import Path

import pytest

from fic.bench import zero
from fic.cli.launch_check import check as launch_check
from fic.cli.main import main
from fic.core.config import load_config
from fic.training.sft import SFTConfig

REPO = Path(__file__).resolve().parents[2]


def plan(*extra: str) -> dict:
    parser = argparse.ArgumentParser()
    zero.add_arguments(parser)
    from fic.bench import processes

    return processes.make_plan(parser.parse_args(["--processes", "3", "--dry-run", *extra]))


def test_plan_runs_n_processes_at_m_against_one_at_n_times_m():
    p = plan("--micro-batch", "2")
    reference = p["reference_command"]
    assert reference[1] == "fic/train_sft.py" and "train.micro_batch_size=6" in reference
    assert set(p["paths"]) == {"ddp", "zero2", "zero3", "fsdp2"}
    for info in p["paths"].values():
        argv = info["command"]
        assert argv[1:9] == ["-m", "accelerate.commands.launch", "--config_file", info["launch_file"],
                             "--num_processes", "3", "--mixed_precision", "no"]
        at = argv.index("--config")
        overrides = argv[at + 2:]
        cfg = load_config(SFTConfig, REPO / argv[at + 1], overrides)
        assert cfg.train.micro_batch_size == 2 and cfg.dev.every == 1 and cfg.checkpoint.every == 2
        assert cfg.model.dtype == "float32" and cfg.train.mixed_precision == "no"
        launch_check(REPO / info["launch_file"], REPO / argv[at + 1], num_processes=3, overrides=overrides[:-1])
        assert info["resume_command"][-1] == "resume=true"
        # the reference differs only in the micro-batch, the launcher and the folder
        assert [o for o in overrides if "micro_batch" not in o and not o.startswith("out=")] == \
            [o for o in reference[4:] if "micro_batch" not in o and not o.startswith("out=")]


def test_the_mode_refuses_one_process_and_unknown_paths(capsys):
    assert main(["bench", "zero", "--processes", "3", "--paths", "ddp,zero4", "--dry-run"]) == 2
    assert "expected some of ddp, zero2, zero3, fsdp2, got 'ddp,zero4'" in capsys.readouterr().err
    assert main(["bench", "zero", "--dry-run"]) == 2
    assert "expected --stage 2 or 3 (or --processes N" in capsys.readouterr().err


@pytest.mark.slow  # 5 launches of 1-2 processes, about 2-3 minutes on 2 cores
@pytest.mark.skipif(find_spec("deepspeed") is None, reason="deepspeed does not import (pip install -e .[deepspeed])")
def test_two_processes_equal_one_under_zero3_and_fsdp2(tmp_path, smollm2_dir, capsys):
    argv = ["bench", "zero", "--processes", "2", "--paths", "zero3,fsdp2", "--steps", "2", "--layers", "2",
            "--tokenizer", str(smollm2_dir), "--work", str(tmp_path), "--timeout", "300", "--json"]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(figures["paths"]) == {"zero3", "fsdp2"}
    for path, r in figures["paths"].items():
        assert r["ok"], (path, r.get("error"), r["log"])
        assert r["max_rel_loss_diff"] <= 1e-5 and r["max_weight_diff"] <= 1e-4 and r["max_dev_diff"] == 0.0
        assert r["dev_steps"] == [0, 1, 2] and r["dev_all_logged"]  # 5 dev instances, 3 + 2 per rank, all logged
        assert r["resume_max_rel_loss_diff"] <= 1e-6 and r["resume_max_weight_diff"] <= 1e-6
    assert any("optim_states" in f or "pytorch_model" in f for f in figures["paths"]["zero3"]["checkpoint_files"])
    assert "pytorch_model_fsdp_0" in figures["paths"]["fsdp2"]["checkpoint_files"]
