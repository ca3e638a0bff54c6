"""Issue 55's protocol in miniature, end to end on the tiny random model: gate.sh (B's slices, the
five evaluations of S, the gate), `protocol.py prepare`, then pilot.sh (V one step, C2 at its
computed steps, every evaluation, the pilot's report), each script run as a user runs it; a rerun of
pilot.sh passes over everything it finished. A random model calls nothing, so its self-labels would
be empty: the two self-labelled files are made by `fic self-label` itself from a scripted model that
answers each request right (as test_self_label does), and pilot.sh finds them made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scripted import FunctionBackend
from stage2_label_free import protocol

from fic import tasks
from fic.cli.main import main
from fic.core.instance import Instance
from fic.data.views import render_view

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "experiments" / "stage2_label_free"


def script(path: Path, **env: str) -> str:
    """Run a protocol script as a user would (`fic` on PATH, this checkout's package); its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]), **env}
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def starting_run(run: Path, model: Path) -> None:
    """What the protocol reads of a `fic demo` folder stopped after stage 1: S, the seen-function
    prompts and corpus, and the dev set."""
    shutil.copytree(model, run / "sft" / "final")
    for name, split in (("train", "train[0:3]"), ("dev", "dev[0:2]")):
        assert main(["shard", "--source", f"actions-gen:{split}", "--task", "actions", "--seed", "0",
                     "--out", str(run / "data" / f"{name}.jsonl")]) == 0
    corpus = run / "data" / "sft.sft.jsonl"
    assert main(["sft-data", f"data.source=[jsonl:{run / 'data' / 'train.jsonl'}]", "data.task=actions",
                 f"out={corpus}"]) == 0


def self_labels(arms: Path, b_train: Path, monkeypatch) -> None:
    """B-train's two self-labelled files, by `fic self-label` with a model that calls right."""
    answers = {}
    for line in b_train.read_text().splitlines():
        instance = Instance.from_dict(json.loads(line))
        for view in ("full", "concat"):
            answers[render_view(instance, view)["messages"][-1]["content"]] = tasks.of(instance).reference_answer(instance)
    monkeypatch.setattr("fic.cli.self_label.make_backend",
                        lambda cfg: FunctionBackend(lambda messages: answers[messages[-1]["content"]]))
    for keep, name in (("any-call", "blind"), ("checked", "self")):
        assert main(["self-label", "--model", "scripted", "--source", f"jsonl:{b_train}", "--keep", keep,
                     "--out", str(arms / f"b-train.{name}.jsonl")]) == 0


def test_the_protocol_runs_from_the_gate_to_the_pilots_report(tiny_model_dir, tmp_path, monkeypatch):
    run, out = tmp_path / "run", tmp_path / "gate"
    starting_run(run, tiny_model_dir)
    records = tmp_path / "records"
    printed = script(HERE / "gate.sh", RUN=str(run), OUT=str(out), B_TEST="2", B_DEV="2", B_TRAIN="3", RECORDS=str(records))
    gate = json.loads((out / "gate.json").read_text())
    assert set(gate["gaps"]) == set(protocol.GATE_LOGS) and gate["verdict"] is not None
    assert gate["progress"]["bdev_own_gap"] == "4 of 4 conversations"  # 2 instances x full and sharded
    assert "gate: " in printed

    assert (records / "bdev" / "conversations.jsonl.gz").exists()  # the gate's logs kept
    pilot = protocol.prepare(run, out, seeds=[0], v_steps=1, lrs=["1.0e-4"], records=records).parent / "pilot.sh"
    self_labels(out / "arms", out / "B" / "train.jsonl", monkeypatch)
    # C2's step calibration as if run (a tiny model's 20 steps are shorter than start-up's noise):
    # 1 CPU s a step; `calibrate` finds both labels and runs nothing (it is tested in test_stage2_protocol)
    (out / "arms" / "times.tsv").write_text("cal-c2-2 2.0\ncal-c2-22 22.0\n")
    printed = script(pilot)
    assert f"done before: {out}/arms/b-train.blind.jsonl" in printed
    arms = out / "arms"
    for model in ("v-s0", "c2-lr1.0e-4-s0"):
        assert (arms / model / "final").is_dir()
    # C2 took V's CPU seconds (less the self-labelling, here none timed, and less V's held-out measuring,
    # before training and after its one step) at its calibrated 1 CPU s a step
    spent = {label: float(s) for label, s in (line.split() for line in (arms / "times.tsv").read_text().splitlines())}
    assert set(spent) == {"cal-c2-2", "cal-c2-22", "v-s0", "c2-lr1.0e-4-s0"} and spent["v-s0"] > 0
    assert not (arms / "calibrate").exists()
    steps = [json.loads(line)["step"] for line in (arms / "c2-lr1.0e-4-s0" / "metrics.jsonl").read_text().splitlines()]
    held_out = protocol.held_out(arms / "v-s0")
    assert [step for step, _ in held_out["curve"]] == [0, 1] and 0 < held_out["cpu_s"] < spent["v-s0"]
    assert steps[-1] == max(1, round((spent["v-s0"] - held_out["cpu_s"]) / 1.0))
    report = json.loads((arms / "pilot.json").read_text())
    assert report["v_held_out_divergence"]["curve"] == held_out["curve"]
    assert set(report["models"]) == {"S", "V", "C2"} and report["not_finished"] == []
    assert set(report["pairs"]) == {"V - S", "C2 - S", "V - C2"} and report["pairs"]["V - S"]["n"] == 2
    assert report["verdict"].startswith(("continue: ", "stop: "))
    # S on B-dev is the gate's own evaluation, resumed: the same conversations
    assert (arms / "eval" / "s" / "conversations.jsonl").read_text() == (out / "bdev" / "conversations.jsonl").read_text()

    again = script(pilot)  # everything finished: passed over, nothing trained twice
    assert f"done before: {arms}/v-s0" in again and f"done before: {arms}/c2-lr1.0e-4-s0" in again
    assert (arms / "times.tsv").read_text().count("\n") == 4

    # The weights lost with the machine, the evaluations kept: neither arm trains or plays again
    for model in ("v-s0", "c2-lr1.0e-4-s0"):
        assert (records / "arms" / model / "weights.sha256").read_text() == (arms / model / "weights.sha256").read_text()
        shutil.rmtree(arms / model / "final")
    lost = script(pilot)
    assert all(f"done before: {arms}/{kind}/{model}" in lost for kind in ("eval", "eval-seen")
               for model in ("v-s0", "c2-lr1.0e-4-s0"))
    assert json.loads((records / "s.json").read_text())["s_sha256"] == protocol.weights_sha256(run / "sft" / "final")
