"""`fic bench zero --processes N`: SFT and VASD on N gloo processes on this CPU under DDP, ZeRO-2, ZeRO-3
and FSDP2 give one process's losses, dev figures and final weights, and resume exactly. The slow tests
run ZeRO-3 and FSDP2 with 2 processes, the dev curve or held-out evaluation scored at every step
(ZeRO-3 with dev.every hung: it ran on the main process only) and the ranks' shares of the dev
instances uneven; for VASD also ranks that play different numbers of turns, replies that end at
different lengths, and a rank with no usable rollout row (VASD under ZeRO-3 crashed or hung on each);
`fic bench zero --processes 3` runs every path (docs/launching.md)."""

from __future__ import annotations

import argparse
import json
import shlex
from importlib.util import find_spec
from pathlib import Path

import pytest

from fic.bench import zero
from fic.cli.launch_check import check as launch_check
from fic.cli.main import main
from fic.core.config import load_config
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig

REPO = Path(__file__).resolve().parents[2]


def plan(*extra: str, processes: int = 3) -> dict:
    parser = argparse.ArgumentParser()
    zero.add_arguments(parser)
    from fic.bench import processes as mode

    return mode.make_plan(parser.parse_args(["--processes", str(processes), "--dry-run", *extra]))


@pytest.mark.parametrize("method, config_class", [("sft", SFTConfig), ("vasd", VASDConfig)])
def test_plan_runs_n_processes_at_m_against_one_at_n_times_m(method, config_class):
    p = plan("--micro-batch", "2")
    assert set(p["methods"]) == {"sft", "vasd"}  # both by default
    runs = p["methods"][method]
    reference = runs["reference_command"]
    script = find_spec(f"fic.train_{method}").origin

    # the recipe script of the fic that plans, wherever it is installed; the recipe and launch files where it runs
    assert reference[1] == script and "train.micro_batch_size=6" in reference
    assert reference[3] == f"recipes/smollm2-135m-instruct/{method}.yaml"
    assert set(runs["paths"]) == {"ddp", "zero2", "zero3", "fsdp2"}
    for info in runs["paths"].values():
        argv = info["command"]
        assert argv[1:9] == ["-m", "accelerate.commands.launch", "--config_file", info["launch_file"],
                             "--num_processes", "3", "--mixed_precision", "no"]
        at = argv.index("--config")
        overrides = argv[at + 2:]
        cfg = load_config(config_class, REPO / argv[at + 1], overrides)
        assert cfg.train.micro_batch_size == 2 and cfg.dev.every == 1 and cfg.checkpoint.every == 2
        assert cfg.model.dtype == "float32" and cfg.train.mixed_precision == "no"
        launch_check(REPO / info["launch_file"], REPO / argv[at + 1], num_processes=3, overrides=overrides[:-1],
                     script=REPO / "fic" / f"train_{method}.py")
        assert info["resume_command"][-1] == "resume=true"
        # the reference differs only in the micro-batch, the launcher and the folder
        assert [o for o in overrides if "micro_batch" not in o and not o.startswith("out=")] == \
            [o for o in reference[4:] if "micro_batch" not in o and not o.startswith("out=")]
        if method == "vasd":  # sampled rollouts, full fine-tuning with the live teacher, held-out figures
            assert cfg.rollout.temperature == 1.0 and cfg.teacher.mode == "live" and not cfg.lora.enabled
            assert cfg.anchor.share == 0.5 and cfg.dev.views == ["sharded"] and cfg.rollout.backend == "hf"


def test_the_mode_refuses_one_process_and_unknown_paths(capsys):
    assert main(["bench", "zero", "--processes", "3", "--paths", "ddp,zero4", "--dry-run"]) == 2
    assert "expected some of ddp, zero2, zero3, fsdp2, got 'ddp,zero4'" in capsys.readouterr().err
    assert main(["bench", "zero", "--processes", "3", "--methods", "dpo", "--dry-run"]) == 2
    assert "expected sft, vasd or sft,vasd, got 'dpo'" in capsys.readouterr().err
    assert main(["bench", "zero", "--dry-run"]) == 2
    assert "expected --stage 2 or 3 (or --processes N" in capsys.readouterr().err


@pytest.mark.slow  # 5 launches of 1-2 processes, about 2-3 minutes on 2 cores
@pytest.mark.skipif(find_spec("deepspeed") is None, reason="deepspeed does not import (pip install -e .[deepspeed])")
def test_two_processes_equal_one_under_zero3_and_fsdp2(tmp_path, smollm2_dir, capsys):
    argv = ["bench", "zero", "--processes", "2", "--methods", "sft", "--paths", "zero3,fsdp2", "--steps", "2",
            "--layers", "2", "--tokenizer", str(smollm2_dir), "--work", str(tmp_path), "--timeout", "300", "--json"]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    paths = figures["methods"]["sft"]["paths"]
    assert set(paths) == {"zero3", "fsdp2"}
    for path, r in paths.items():
        assert r["ok"], (path, r.get("error"), r["log"])
        assert r["max_rel_loss_diff"] <= 1e-5 and r["max_weight_diff"] <= 1e-4 and r["max_dev_diff"] == 0.0
        assert r["dev_steps"] == [0, 1, 2] and r["dev_all_logged"]  # 5 dev instances, 3 + 2 per rank, all logged
        assert r["resume_max_rel_loss_diff"] <= 1e-6 and r["resume_max_weight_diff"] <= 1e-6
    assert any("optim_states" in f or "pytorch_model" in f for f in paths["zero3"]["checkpoint_files"])
    assert "pytorch_model_fsdp_0" in paths["fsdp2"]["checkpoint_files"]


def test_a_missing_recipe_or_launch_file_is_one_line_naming_its_option(tmp_path, capsys):
    """The recipe and launch files are read where the bench runs (nothing from the package's own
    location): elsewhere than a checkout's root, the error names the option that points to them."""
    from fic.cli.main import main

    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer_config.json").write_text("{}")
    common = ["bench", "zero", "--processes", "3", "--tokenizer", str(tokenizer), "--work", str(tmp_path / "w")]
    assert main([*common, "--recipes", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nowhere/sft.yaml" in err and "--recipes" in err and "\n" not in err
    assert main([*common, "--launch-dir", str(tmp_path / "nolaunch")]) == 2
    assert "--launch-dir" in capsys.readouterr().err
    assert not (tmp_path / "w" / "model").exists()


def teacher_cut(vasd_command: list[str], tokenizer_dir: Path) -> tuple[int, list[list[int]]]:
    """A `teacher.max_prompt_tokens` that leaves one rank of 2 (at micro-batch 1) no usable rollout row at
    step 1 while the other keeps one, and the shard counts of each rank's tasks at step 1: read from the
    bench's VASD settings with the recipe's own data order and teacher prompts, no model."""
    from fic.core.model import load_tokenizer
    from fic.training.data import DataOrder
    from fic.training.vasd.inputs import load_rollout_tasks
    from fic.training.vasd.prompts import teacher_prompts, teacher_views

    at = vasd_command.index("--config")
    cfg = load_config(VASDConfig, REPO / vasd_command[at + 1], vasd_command[at + 2:])
    tokenizer = load_tokenizer(str(tokenizer_dir))
    instances, _, _ = load_rollout_tasks(cfg)
    per_rank = cfg.train.micro_batch_size * cfg.train.grad_accum_steps
    tasks = [[instances[i] for i in DataOrder(len(instances), per_rank, 2, rank, cfg.data.seed,
                                              cfg.rollout.shuffle).micro_batch(0)] for rank in range(2)]
    lengths = [[max(len(p) for p in teacher_prompts(tokenizer, t, teacher_views(cfg))) for t in mine] for mine in tasks]
    emptied = max(range(2), key=lambda rank: min(lengths[rank]))
    cut = min(lengths[emptied]) - 1
    assert min(lengths[1 - emptied]) <= cut, lengths  # the other rank keeps a row
    return cut, [[len(t.shards) for t in mine] for mine in tasks]


@pytest.mark.slow  # 5 launches of 1-2 processes, about 2 minutes on 2 cores
@pytest.mark.skipif(find_spec("deepspeed") is None, reason="deepspeed does not import (pip install -e .[deepspeed])")
def test_vasd_on_two_processes_equals_one_under_zero3_and_fsdp2(tmp_path, smollm2_dir, capsys):
    """VASD under ZeRO-3 crashed at step 1 (one rank played an extra turn while the other was in the
    teacher pass), hung with a rank whose rollouts were all too long for the teacher, and hung with
    `dev.every` (the held-out evaluation ran on the main process only). Here, at step 1, one rank's
    tasks have a shard more than the other's, sampled replies end at uneven lengths, one rank has no
    usable rollout row (`teacher.max_prompt_tokens`), the held-out evaluation runs at every step; and
    the run equals one process at twice the micro-batch and resumes exactly."""
    common = ["bench", "zero", "--processes", "2", "--methods", "vasd", "--paths", "zero3,fsdp2", "--steps", "2",
              "--layers", "2", "--tokenizer", str(smollm2_dir), "--work", str(tmp_path), "--timeout", "300",
              "--collective-timeout", "60"]
    command = plan(*common[4:], processes=2)["methods"]["vasd"]["paths"]["zero3"]["command"]
    cut, shards = teacher_cut(command, smollm2_dir)
    assert max(shards[0]) != max(shards[1])  # one rank plays a turn more than the other
    assert main([*common, "--override", f"teacher.max_prompt_tokens={cut}", "--json"]) == 0, \
        shlex.join([*common, "--override", f"teacher.max_prompt_tokens={cut}"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    done = figures["methods"]["vasd"]
    reference = [json.loads(line) for line in (tmp_path / "vasd-one-process" / "metrics.jsonl").read_text().splitlines()]
    step1 = reference[1]
    assert step1["step"] == 1 and step1["left_out_teacher_prompt_too_long"] >= 2  # the emptied rank's two, at least
    assert step1["answer_tokens"] > 0 and step1["anchor_ce"] is not None
    assert reference[0]["step"] == 0 and reference[0]["dev_divergence_per_token"] is not None
    assert set(done["paths"]) == {"zero3", "fsdp2"}
    for path, r in done["paths"].items():
        assert r["ok"], (path, r.get("error"), r["log"])
        assert r["max_rel_loss_diff"] <= 1e-4 and r["max_weight_diff"] <= 1e-4 and r["max_dev_diff"] <= 1e-4
        assert r["dev_steps"] == [0, 1, 2] and r["dev_all_logged"]  # 5 held-out instances, 3 + 2 per rank
        assert r["resume_max_rel_loss_diff"] <= 1e-6 and r["resume_max_weight_diff"] <= 1e-6


def test_weights_are_compared_by_name_in_full_models_and_in_adapters(tmp_path):
    """A LoRA run's final folder holds its adapter alone: the adapters are what the ranks must agree on."""
    import torch
    from safetensors.torch import save_file

    from fic.bench.processes import weight_diff

    for folder, file, shift in (("a", "model.safetensors", 0.0), ("b", "model.safetensors", 0.25),
                                ("c", "adapter_model.safetensors", 0.0), ("d", "adapter_model.safetensors", 0.5)):
        (tmp_path / folder).mkdir()
        save_file({"w": torch.zeros(2, 2) + shift, "lm_head": torch.ones(3)}, str(tmp_path / folder / file))
    assert weight_diff(tmp_path / "a", tmp_path / "b") == 0.25
    assert weight_diff(tmp_path / "c", tmp_path / "d") == 0.5
    save_file({"other": torch.zeros(2, 2)}, str(tmp_path / "d" / "adapter_model.safetensors"))
    assert weight_diff(tmp_path / "c", tmp_path / "d") == float("inf")
