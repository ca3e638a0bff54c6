"""curves.png beside metrics.jsonl, the same figures to wandb and TensorBoard, and `fic report`
on a training run (finished, or still writing its log)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest

from fic.cli.main import main
from fic.core.config import load_config
from fic.training.curves import SFT_PANELS, VASD_PANELS, curves_figure, read_metrics, run_kind
from fic.training.loop import RunLog
from fic.training.sft import SFTConfig

PNG = b"\x89PNG\r\n\x1a\n"
SFT_STEPS = [{"step": s, "loss": 2.0 / s, "lr": 1e-4 * s, "grad_norm": 1.5 - 0.1 * s, "target_tokens": 40,
              "tokens": 90, "epoch": 0.1 * s, "target_tokens_per_s": 300.0,
              "peak_memory_mb": 900 + s} for s in range(1, 6)]
VASD_STEPS = [{"step": 0, "dev_divergence_per_token": 0.9, "dev_sharded_P": 10.0}] + [
    {"step": s, "loss": 0.5, "divergence_per_token": 0.4 / s, "anchor_ce": 1.1, "reference_divergence": None,
     "rollout_accuracy": 0.1 * s, "premature_answer_rate": 0.5 - 0.05 * s, "final_not_answer_rate": 0.2,
     "rollout_tokens": 80.0 + s, "lr": 1e-5, "grad_norm": 0.3, "peak_memory_mb": 1200} for s in range(1, 5)]


def assert_every_axis_named(fig, panels: int) -> None:
    axes = fig.get_axes()
    assert len(axes) == panels
    for ax in axes:
        assert ax.get_title() and ax.get_ylabel() and ax.get_xlabel() == "optimizer step", ax


@pytest.mark.parametrize("records,kind,panels", [(SFT_STEPS, "sft", SFT_PANELS), (VASD_STEPS, "vasd", VASD_PANELS)])
def test_a_run_figure_has_one_named_axis_per_quantity(records, kind, panels):
    assert run_kind(records) == kind
    fig = curves_figure(records)
    assert_every_axis_named(fig, len(panels))
    titles = [ax.get_title() for ax in fig.get_axes()]
    drawn = {line.get_label() for ax in fig.get_axes() for line in ax.get_lines()}
    if kind == "sft":
        assert titles[:3] == ["loss", "learning rate", "gradient norm"]
        assert {"loss", "lr", "grad_norm", "peak_memory_mb"} <= drawn
    else:
        assert {"divergence_per_token", "anchor_ce", "rollout_accuracy", "premature_answer_rate", "rollout_tokens",
                "dev_sharded_P", "peak_memory_mb"} <= drawn
        assert "reference_divergence" not in drawn  # never logged: no empty line drawn for it


def test_reading_a_log_being_written_passes_over_the_torn_line_and_changes_nothing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in SFT_STEPS[:3]) + '{"step": 4, "lo'
    path.write_text(text)
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    assert path.read_text() == text  # the trainer may append the rest of the line any moment


class FakeWandb(types.ModuleType):
    """What RunLog hands wandb: init's config, logged dicts (scalars, images), the summary."""

    def __init__(self):
        super().__init__("wandb")
        self.inits, self.logged, self.finished = [], [], False
        outer = self

        class Image:
            def __init__(self, path):
                self.path = path
                assert Path(path).read_bytes()[:8] == PNG

        class Run:
            summary: ClassVar[dict] = {}

            def log(self, data, step):
                outer.logged.append((step, data))

            def finish(self):
                outer.finished = True

        self.Image, self.Table, self._run = Image, None, Run()

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self._run


@pytest.mark.slow  # end to end: a run's logs
def test_run_log_writes_curves_and_gives_wandb_and_tensorboard_the_figures(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    wandb = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    cfg = load_config(SFTConfig, None, [f"out={tmp_path}", "logging.tensorboard=true", "logging.progress=false",
                                        "logging.curves_every_s=0"])
    card = {"path": "corpus.jsonl", "card": {"sources": [{"spec": "hf:openai/gsm8k", "origin": {"commit": "abc"}}]}}
    log = RunLog(cfg, types.SimpleNamespace(is_main_process=True), steps=5, start=0, run_id="r1", desc="sft",
                 data_card=card)
    for record in SFT_STEPS:
        log.step(record["step"], {k: v for k, v in record.items() if k != "step"})
    log.close({"final_loss": 0.4})
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG
    assert wandb.inits[0]["config"]["data_card"] == card and wandb.inits[0]["config"]["out"] == str(tmp_path)
    images = [step for step, data in wandb.logged if "curves" in data]
    assert images and images[-1] == 5 and wandb.finished
    assert any("train/grad_norm" in data for _, data in wandb.logged)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    assert {"train/loss", "train/lr", "train/grad_norm"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5]
    assert "curves" in events.Tags()["images"]
    texts = {tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]}
    assert "hf:openai/gsm8k" in texts["data_card/text_summary"] and "logging:" in texts["config/text_summary"]


@pytest.mark.parametrize("state", ["missing", "broken"])
def test_tensorboard_missing_or_broken_is_a_one_line_error_at_load_time(tmp_path, state):
    """Checked by importing what the run log imports, in a fresh interpreter: a broken install
    (here a tensorboard whose import raises) passed `find_spec` and failed after the model load."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "site"
    (fake / "tensorboard").mkdir(parents=True)
    (fake / "tensorboard" / "__init__.py").write_text("raise RuntimeError('half-installed')\n")
    hide = "import sys\nsys.modules['tensorboard'] = None\n" if state == "missing" else ""
    code = hide + f"from fic.cli.main import main\nsys.exit(main(['train', 'sft', 'out={tmp_path / 'run'}', " \
        "'logging.tensorboard=true']))\n"
    repo = Path(__file__).resolve().parents[2]
    path = [str(fake)] if state == "broken" else []
    done = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(repo)])})
    assert done.returncode == 2, done.stderr[-800:]
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    head = "fic train sft: error: command line: field 'logging.tensorboard': logging.tensorboard=true"
    assert line == (f'{head} needs the tensorboard package: pip install "fic[tensorboard]"' if state == "missing" else
                    f"{head}: tensorboard is installed but does not import (RuntimeError: half-installed); reinstall "
                    "it: pip install --force-reinstall tensorboard")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # end to end: a run's curves redrawn
def test_fic_report_redraws_a_training_run_while_it_runs(tmp_path, capsys):
    run = tmp_path / "vasd"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in VASD_STEPS) + '{"step": 5, "lo')
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {run / 'curves.png'}"
    assert (run / "curves.png").read_bytes()[:8] == PNG
    assert main(["report", str(run), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "curves.png").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    assert main(["report", str(empty)]) == 2
    assert "no step logged yet" in capsys.readouterr().err
