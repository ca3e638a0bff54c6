"""`fic bench vasd` (`fic.bench.vasd`): it times the recipe's own step in its four phases, and the
chunked divergence's memory is the child process's own peak."""

from __future__ import annotations

import pytest
from vasd_played import metrics, settings

from fic.core.config import load_config
from fic.train_vasd import train
from fic.training.vasd.config import VASDConfig

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.mark.slow  # the benchmark
def test_bench_vasd_times_the_recipes_own_step(tiny_model_dir, anchor_corpus, tmp_path):
    """`fic bench vasd --config` builds the step the recipe takes (`VASDStep`, deferral labels and
    anchors included): its first step's answer tokens are the recipe's, and its phases add up."""
    import argparse

    import yaml

    from fic.bench import vasd as bench_vasd
    from fic.core.config import config_to_dict

    common = ("train.max_steps=1", "checkpoint.every=0", "terms.labels.weight=1.0", "anchor.share=0.5")
    cfg = load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, tmp_path / "recipe", *common))
    train(cfg)
    (recipe,) = metrics(tmp_path / "recipe")
    config = tmp_path / "vasd.yaml"
    config.write_text(yaml.safe_dump(config_to_dict(cfg)))
    parser = argparse.ArgumentParser()
    bench_vasd.add_arguments(parser)
    args = parser.parse_args(["--config", str(config), "--set", f"out={tmp_path / 'ignored'}", "--repeats", "1",
                              "--memory-tokens", "0", "--sft-micro-batch-size", "2", "--profile"])
    figures = bench_vasd.measure(args)
    shares = {k: v for k, v in figures.items() if k.startswith("profile_share_")}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3) and shares["profile_share_LM_head"] > 0
    assert 0 <= figures["student_padding_share"] < 1
    assert figures["answer_tokens"] == recipe["answer_tokens"] > 0
    assert figures["rollouts"] == 4 and figures["student_rows"] > 4  # anchors and label rows beside the rollouts
    assert figures["step_s"] == pytest.approx(figures["rollouts_s"] + figures["teacher_s"] + figures["student_s"]
                                              + figures["update_s"])
    assert figures["matmul_peak_tflops"] > 0 and figures["passes_roofline_share"] > 0
    assert figures["sft_step_cpu_s"] > 0 and figures["vasd_over_sft"] == pytest.approx(
        figures["step_cpu_s"] / figures["sft_step_cpu_s"])


@pytest.mark.slow  # the benchmark, in a child process
def test_bench_memory_figure_is_the_childs_own_peak_even_under_a_large_parent():
    """Linux carries ru_maxrss across exec: a child of a process that had grown past the
    computation's peak (the bench after its timed step) reported 0 MB for both ways."""
    from fic.bench.vasd import memory_figures

    ballast = bytearray(b"\x01") * (600 << 20)  # the parent's peak, well above the child's
    figures = memory_figures(tokens=512, vocab=8192, hidden=32, chunk=64)
    assert ballast[-1] == 1
    assert 0 < figures["chunked_peak_mb"] < figures["naive_peak_mb"]
    assert figures["memory_ratio"] < 0.6 and figures["max_abs_diff"] < 1e-4
