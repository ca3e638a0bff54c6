"""The VASD recipe end to end (`fic/train_vasd.py`, `fic train vasd`): resume after SIGKILL, a
step with an over-long rollout, micro-batch sizes and padded widths that give the same step, 2
processes like 1, the shipped recipe, bad settings refused before any model loads, per-turn
views with labels, and bf16 compute with bf16 rollouts."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from vasd_played import RECIPE, ROOT, metrics, settings

from fic.core.config import load_config
from fic.core.errors import FicError
from fic.train_vasd import train
from fic.training.loop import KILL_ENV
from fic.training.vasd.batches import collate_rows
from fic.training.vasd.config import VASDConfig

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.mark.slow  # end to end: a run killed, then resumed
def test_kill_then_resume_gives_the_uninterrupted_losses(tiny_model_dir, anchor_corpus, tmp_path):
    common = ("train.max_steps=4", "checkpoint.every=2", "teacher.mode=ema", "anchor.share=0.5")
    whole = tmp_path / "whole"
    result = train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, whole, *common)))
    expected = metrics(whole)
    assert [m["step"] for m in expected] == [1, 2, 3, 4] and result["steps"] == 4
    assert all(m["answer_tokens"] > 0 and m["anchor_ce"] is not None for m in expected)

    killed = tmp_path / "killed"
    proc = subprocess.run([sys.executable, str(ROOT / "fic" / "train_vasd.py"),
                           *settings(tiny_model_dir, anchor_corpus, killed, *common)],
                          env={**os.environ, KILL_ENV: "3"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [m["step"] for m in metrics(killed)] == [1, 2, 3]
    train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, killed, *common, "resume=true")))
    got = metrics(killed)
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    for a, b in zip(got, expected):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["rollout_tokens"] == b["rollout_tokens"]
    from safetensors.torch import load_file

    saved = load_file(str(killed / "checkpoints" / "step-4" / "model.safetensors"))
    assert saved and all(key.startswith("model.") for key in saved)  # no teacher head: the student only
    card = (killed / "final" / "README.md").read_text()
    assert "FiC VASD" in card and f"Started from: `{tiny_model_dir}`" in card


@pytest.mark.slow  # end to end: the recipe
def test_a_step_with_an_over_long_rollout_trains_on(tiny_model_dir, anchor_corpus, tmp_path):
    """The issue's reproduction: micro_batch_size=1, grad_accum_steps=4, a conversation cap that
    cuts one rollout of step 3 (no anchor: anchor.share 0) ended the run there, on resume too."""
    out = tmp_path / "run"
    result = train(load_config(VASDConfig, None, settings(
        tiny_model_dir, anchor_corpus, out, "train.micro_batch_size=1", "train.grad_accum_steps=4",
        "rollout.max_conversation_tokens=260", "anchor.share=0", "train.max_steps=3", "checkpoint.every=0")))
    assert result["steps"] == 3
    got = metrics(out)
    assert [m["step"] for m in got] == [1, 2, 3]
    assert got[2]["left_out_cut_before_last_shard"] >= 1 and got[2]["empty_micro_batches"] >= 1
    assert all(m["left_out_rollouts"] == m["left_out_cut_before_last_shard"] + m["left_out_teacher_prompt_too_long"]
               + m["left_out_truncated_final"] for m in got)
    assert got[2]["answer_tokens"] > 0 and got[2]["loss"] == got[2]["loss"]  # trained, not NaN


@pytest.mark.slow  # several whole VASD steps compared
def test_smaller_micro_batches_and_padded_widths_give_the_same_step(tiny_model_dir, anchor_corpus, tmp_path,
                                                                    monkeypatch):
    """The memory knobs: 4 rollouts a step as 1 x 4, 2 x 2 or 4 x 1 (micro-batch x accumulation),
    with every width padded to a multiple of 64 (`train.pad_to_multiple`), or with label and
    correction rows apart from their rollouts' and teacher rows apart from one another
    (`train.share_prefixes=false`), play the same rollouts and make the same update (losses,
    gradient norm), with anchors, deferral labels, corrections and per-turn distillation split
    across the micro-batches; only the passes' shapes change."""
    common = ("train.max_steps=2", "checkpoint.every=0", "anchor.share=0.5", "terms.labels.weight=1.0",
              "terms.labels.select=premature", "terms.labels.max_turns=8", "terms.corrections.weight=1.0",
              "terms.turns.replies=all")
    import fic.training.vasd.teacher as teacher_module

    widths = []  # the student batches' widths, to see that the padded run really pads
    branched = []  # whether a batch had rows with branches, to see that the shared runs really share

    def recording_collate(rows, pad_id, multiple=0, names=()):
        batch = collate_rows(rows, pad_id, multiple, names)
        widths.append((multiple, batch["input_ids"].shape[1], max(len(r["input_ids"]) for r in rows)))
        branched.append("segments" in batch and bool((batch["segments"] > 0).any()))
        return batch

    monkeypatch.setattr(teacher_module, "collate_rows", recording_collate)
    runs = {}
    for name, mbs, accum, multiple in (("4x1", 4, 1, 0), ("2x2", 2, 2, 0), ("1x4", 1, 4, 0), ("padded", 4, 1, 64),
                                       ("unshared", 4, 1, 0)):
        out = tmp_path / name
        branched.clear()
        train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, out, *common,
                                                     f"train.micro_batch_size={mbs}",
                                                     f"train.grad_accum_steps={accum}",
                                                     f"train.pad_to_multiple={multiple}",
                                                     f"train.share_prefixes={name != 'unshared'}")))
        assert any(branched) == (name != "unshared")
        runs[name] = metrics(out)
    whole = runs["4x1"]
    assert all(m["labels_ce"] is not None and m["anchor_ce"] is not None for m in whole)
    padded = [(width, longest) for multiple, width, longest in widths if multiple == 64]
    assert padded and all(width % 64 == 0 for width, _ in padded) and any(width > longest for width, longest in padded)
    for name in ("2x2", "1x4", "padded", "unshared"):
        for a, b in zip(runs[name], whole):
            assert a["rollout_tokens"] == b["rollout_tokens"] and a["answer_tokens"] == b["answer_tokens"]
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


@pytest.mark.slow  # end to end: two processes
def test_two_processes_train_like_one_with_the_same_global_batch(tiny_model_dir, anchor_corpus, tmp_path):
    """Greedy rollouts (the same replies however they are batched), DDP over 2 CPU processes
    with half the rollouts and anchors each: the same losses as 1 process with all of them."""
    common = ("train.max_steps=2", "checkpoint.every=0", "rollout.temperature=0", "train.grad_accum_steps=1",
              "terms.reference.weight=1.0", "logging.progress=false", "logging.term_grad_norms_every=2")
    one = tmp_path / "one"
    train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, one, *common,
                                                  "train.micro_batch_size=4")))
    two = tmp_path / "two"
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "fic" / "train_vasd.py"),
                           *settings(tiny_model_dir, anchor_corpus, two, *common, "train.micro_batch_size=2")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x 2 process(es)" in proc.stdout
    for a, b in zip(metrics(two), metrics(one)):
        assert a["answer_tokens"] == b["answer_tokens"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)
        # each term's own gradient, summed over the ranks before its norm (step 2 only: every 2 steps)
        terms = sorted(key for key in b if key.startswith("grad_norm_"))
        assert terms == ([] if b["step"] == 1 else ["grad_norm_anchor", "grad_norm_distill", "grad_norm_reference"])
        for key in terms:
            assert 0 < a[key] == pytest.approx(b[key], rel=1e-3)


@pytest.mark.slow  # two runs compared weight by weight
def test_measuring_each_terms_gradient_norm_leaves_every_update_as_it_was(tiny_model_dir, anchor_corpus, tmp_path):
    """Each term's own gradient walks the step's graph once more a term (the fused LM head's saved
    gradients included): the run's losses, total gradient norms and final weights are those of a
    run that measured nothing, and the measured steps log a norm per term."""
    from safetensors.torch import load_file

    common = ("train.max_steps=2", "checkpoint.every=0", "terms.reference.weight=1.0", "anchor.share=0.5")
    runs = {}
    for name, every in (("plain", 0), ("measured", 1)):
        runs[name] = tmp_path / name
        train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, runs[name], *common,
                                                     f"logging.term_grad_norms_every={every}")))
    for a, b in zip(metrics(runs["measured"]), metrics(runs["plain"])):
        assert (a["loss"], a["grad_norm"], a["answer_tokens"]) == (b["loss"], b["grad_norm"], b["answer_tokens"])
        norms = {key: a[key] for key in a if key.startswith("grad_norm_")}
        assert set(norms) == {"grad_norm_distill", "grad_norm_anchor", "grad_norm_reference"} and min(norms.values()) > 0
        assert not any(key.startswith("grad_norm_") for key in b)
    measured, plain = (load_file(runs[name] / "final" / "model.safetensors") for name in ("measured", "plain"))
    assert measured.keys() == plain.keys() and all(torch.equal(measured[k], plain[k]) for k in plain)


@pytest.mark.slow  # two runs compared weight by weight
def test_the_held_out_measuring_leaves_every_update_as_it_was(tiny_model_dir, anchor_corpus, tmp_path):
    """The held-out divergence plays its tasks with the rollouts' generator before step 1 and after
    each step; an equal-compute control leaves its cost out, so it must not change what training
    does: the same losses, rollouts and final weights as a run that measured nothing."""
    from safetensors.torch import load_file

    common = ("train.max_steps=2", "checkpoint.every=0", "anchor.share=0.5", "rollout.temperature=1.0",
              "dev.data.source=reasoning-gym:gsm_symbolic", "dev.data.limit=2", "dev.views=[]")
    runs = {}
    for name, every in (("plain", 0), ("measured", 1)):
        runs[name] = tmp_path / name
        train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, runs[name], *common,
                                                     f"dev.every={every}")))
    measured = [row for row in metrics(runs["measured"]) if row["step"] > 0]
    assert [row["step"] for row in measured] == [1, 2] and "dev_divergence_per_token" in measured[0]
    for a, b in zip(measured, metrics(runs["plain"])):
        assert (a["loss"], a["grad_norm"], a["answer_tokens"], a["rollout_tokens"]) == \
            (b["loss"], b["grad_norm"], b["answer_tokens"], b["rollout_tokens"])
    weights = {name: load_file(runs[name] / "final" / "model.safetensors") for name in runs}
    assert all(torch.equal(weights["measured"][k], weights["plain"][k]) for k in weights["plain"])


@pytest.mark.slow  # end to end: the recipe
def test_fic_train_vasd_runs_the_shipped_recipe(tiny_model_dir, anchor_corpus, tmp_path, capsys):
    from fic.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "vasd", "--config", str(RECIPE), f"model.path={tiny_model_dir}",
                 f"anchor.path={anchor_corpus}", f"out={out}", "train.max_steps=1", "train.micro_batch_size=2",
                 "train.grad_accum_steps=1", "rollout.max_new_tokens=6", "logging.wandb=false",
                 "data.limit=8", "dev.every=1", "dev.data.source=reasoning-gym:gsm_symbolic", "dev.data.limit=2",
                 "dev.views=[]", "loss.keep_truncated=true"]) == 0
    assert (out / "final" / "config.json").exists()
    before, figures = metrics(out)  # step 0: the held-out figures training is compared with
    assert before["step"] == 0 and before["dev_divergence_per_token"] > 0
    assert figures["step"] == 1 and figures["dev_divergence_per_token"] > 0
    for row in (before, figures):  # the measuring's own cost, which an equal-compute control leaves out
        assert 0 < row["held_out_cpu_s"] and 0 < row["held_out_s"] < 600
    for key in ("divergence_per_token", "premature_answer_rate", "final_not_answer_rate", "rollout_accuracy",
                "truncated_final_rate", "rollouts_s", "teacher_s", "student_s", "update_s"):
        assert key in figures, key


@pytest.mark.parametrize("override, message", [
    ("loss.divergence=hellinger", "loss.divergence"),
    ("loss.estimator=sampled", "reverse_kl only"),
    ("teacher.view=snowball", "teacher.view"),
    ("anchor.share=0.5 anchor.path=", "anchor.path"),
    ("model.path=/nonexistent/sft/final", "not found"),
    ("lora.enabled=false teacher.mode=ema terms.reference.weight=1", "third copy"),
    ("labels.weight=1", "terms.labels.weight"),
    ("dev.views=[fulll,sharded]", "dev.views[0]"),
])
def test_bad_settings_exit_2_with_one_line_before_any_model_loads(override, message, capsys, monkeypatch):
    from fic.train_vasd import main
    from fic.training import loop
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["--config", str(RECIPE), *override.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_top_k_above_the_vocabulary_and_adapter_folders_are_refused_early(tiny_model_dir, anchor_corpus, tmp_path,
                                                                          monkeypatch):
    from fic.training import loop
    monkeypatch.setattr(loop, "build_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(FicError, match="top_k 999999 is not below the vocabulary"):
        train(load_config(VASDConfig, None, settings(tiny_model_dir, anchor_corpus, tmp_path / "a", "train.max_steps=1",
                                                      "loss.estimator=topk", "loss.top_k=999999")))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(FicError, match="final-merged"):
        train(load_config(VASDConfig, None, settings(adapter, anchor_corpus, tmp_path / "b", "train.max_steps=1")))


@pytest.mark.slow  # end to end: the recipe
def test_the_recipe_trains_with_per_turn_views_and_deferral_labels(tiny_model_dir, anchor_corpus, tmp_path):
    from fic.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "vasd", "--config", str(RECIPE), f"model.path={tiny_model_dir}",
                 f"anchor.path={anchor_corpus}", f"out={out}", "train.max_steps=2",
                 "train.micro_batch_size=2", "rollout.max_new_tokens=6", "logging.wandb=false", "data.limit=8",
                 "loss.keep_truncated=true", "terms.turns.replies=all", "terms.turns.decision_tokens=2",
                 "terms.turns.decision_weight=3", "terms.labels.weight=1.0", "logging.progress=false"]) == 0
    _, last = metrics(out)
    assert last["labels_ce"] > 0 and math.isfinite(last["loss"]) and last["divergence_per_token"] > 0


@pytest.mark.slow  # end to end: the recipe
@pytest.mark.parametrize("precision, said", [("auto", "bfloat16 autocast"), ("bf16_copy", "bfloat16 copy")])
def test_the_recipe_trains_in_bf16_with_bf16_rollouts(tiny_model_dir, anchor_corpus, tmp_path, monkeypatch, capsys,
                                                      precision, said):
    """On a CPU with fast bf16 the recipe computes under autocast (auto) or on a bf16 copy of the
    float32 masters (bf16_copy); either way the rollouts play on a bf16 decoding copy, and the
    saved model holds the float32 masters."""
    from fic.cli.main import main

    monkeypatch.setenv("FIC_CPU_FLAGS", "avx512_bf16")
    out = tmp_path / "run"
    assert main(["train", "vasd", "--config", str(RECIPE), f"model.path={tiny_model_dir}",
                 f"anchor.path={anchor_corpus}", f"out={out}", "train.max_steps=2",
                 "train.micro_batch_size=2", "rollout.max_new_tokens=6", "logging.wandb=false", "data.limit=8",
                 "loss.keep_truncated=true", "logging.progress=false", "terms.labels.weight=1.0",
                 f"train.mixed_precision={precision}"]) == 0
    assert said in capsys.readouterr().out
    _, last = metrics(out)
    assert math.isfinite(last["loss"]) and last["divergence_per_token"] > 0 and last["labels_ce"] > 0
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(out / "final" / "model.safetensors")).values()} == {torch.float32}
