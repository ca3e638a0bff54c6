"""A heartbeat from inside long generation: while a bar is open, a line every few seconds says
the turn, the conversations in it, the rows still writing and the tokens decoded; evaluation's
time left comes from replies (turns x conversations), not finished conversations; VASD's
rollouts report to the training run's bar; the probe writes what has finished as it goes and
resumes."""

from __future__ import annotations

import time

import pytest
from scripted import FunctionBackend

from fic.backends import make_backend
from fic.conversation.classify import make_classifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import make_user
from fic.core import progress
from fic.core.config import load_config
from fic.core.errors import FicError
from fic.core.generation import BackendConfig, SamplingParams
from fic.core.progress import Progress
from fic.core.records import read_records
from fic.data.sources import InstancesSection, load_sharded
from fic.evaluation.evaluate import EvalConfig, evaluate
from fic.probe.run import ProbeConfig, probe


def test_a_bar_beats_with_what_runs_inside_while_nothing_finishes(capsys):
    bar = Progress(10, "eval", "replies", every_s=0.05)
    progress.note(turn=1, conversations=64)
    progress.decoded(16, 12)
    progress.decoded(12, 9)
    time.sleep(0.4)
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines, "no heartbeat while nothing finished"
    assert lines[-1].startswith("eval: 0/10 replies") and "no replies done yet" in lines[-1]
    assert "now: turn 1, conversations 64, rows writing 9, 28 tokens decoded" in lines[-1]
    progress.note(turn=5)  # a closed bar hears nothing more
    assert bar.live["turn"] == 1


def test_the_hf_decoder_counts_every_token_it_writes(tiny_model_dir):
    backend = make_backend(BackendConfig(model=str(tiny_model_dir), device="cpu", batch_size=2))
    prompts = [backend.tokenizer.encode(text) for text in ("Hello there", "What is 2 + 2?", "Hi")]
    bar = Progress(1, "x", every_s=1000)
    try:
        outputs = backend.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, seed=3))
    finally:
        bar.close()
    assert bar.tokens == sum(len(out.token_ids) for out in outputs) > 0
    assert "rows writing" in bar.live


def problems_source(tmp_path, n=4):
    import json

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"question": f"Ann has {i + 2} apples. Ben gives her {i + 3} more apples. "
                                        "How many apples does Ann have?", "answer": f"#### {2 * i + 5}"}) + "\n"
                            for i in range(n)))
    return f"jsonl:{path}"


def test_eval_beats_inside_its_first_lockstep_call_and_counts_replies(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(progress.PROGRESS_ENV, "0.05")

    def slow(messages):
        time.sleep(0.15)  # a long first call: nothing finishes inside it
        return "Let me think."

    cfg = load_config(EvalConfig, None, ["model.model=unused", f"data.source={problems_source(tmp_path)}",
                                         "views=[full, sharded]", f"out={tmp_path / 'run'}"])
    evaluate(cfg, assistant=FunctionBackend(slow), progress=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("eval: ")]
    # 4 full-view replies and 4 x 3 shards: 16 replies in all, the bound of turns x conversations
    first = lines[0]
    assert first.startswith("eval: 0/16 replies") and "now: turn 1, conversations 8" in first
    assert lines[-1].startswith("eval: 16/16 replies") and "conversations=8/8" in lines[-1]
    later = [line for line in lines if not line.startswith("eval: 0/")]
    assert later and all("min left" in line for line in later)  # a time left once replies are done


def test_rollouts_report_to_the_bar_of_the_run_around_them(tmp_path):
    instances = load_sharded(InstancesSection(source=[problems_source(tmp_path, 2)])).instances
    convs = make_conversations(instances, ["sharded"], 1)
    seen = []

    def reply(messages):
        seen.append(dict(outer.live))
        return "Go on."

    outer = Progress(3, "vasd", "step", every_s=1000)
    try:
        play(convs, FunctionBackend(reply), make_user("verbatim"), make_classifier("rule"),
             SamplingParams(max_new_tokens=8), stop_at_correct=False)
    finally:
        outer.close()
    assert seen[0] == {"turn": 1, "conversations": 2} and seen[-1]["turn"] == 3


class Interrupted(Exception):
    pass


def probe_config(tmp_path, out, *extra):
    return load_config(ProbeConfig, None, ["model.model=unused", "model.kind=openai", "switch=instruct",
                                           f"data.source={problems_source(tmp_path, 3)}", "samples=2",
                                           "temperatures=[0, 1]", "batch_size=4", f"out={tmp_path / out}", *extra])


def test_the_probe_saves_what_finished_and_resumes_without_making_it_again(tmp_path):
    calls = []

    def backend(fail_after=None):
        def user_turn(messages):
            calls.append(messages)
            if fail_after is not None and len(calls) > fail_after:
                raise Interrupted  # Ctrl-C in the middle of the sweep
            return f"Why is that? ({len(calls)})" if "Here is a conversation" in messages[0]["content"] else "#### 5"
        return FunctionBackend(user_turn)

    whole = probe(probe_config(tmp_path, "whole"), model=backend(), progress=False)
    made_whole = len(calls)
    calls.clear()
    # 3 replies, then each draw's 9 user turns in calls of 4, 4 and 1 rows: the interruption comes
    # in the first call of the second draw
    with pytest.raises(Interrupted):
        probe(probe_config(tmp_path, "cut"), model=backend(fail_after=3 + 4 + 4 + 2), progress=False)
    cut = tmp_path / "cut"
    assert len(read_records(cut / "replies.jsonl")) == 3 and len(read_records(cut / "user_turns.jsonl")) == 9
    calls.clear()
    resumed = probe(probe_config(tmp_path, "cut"), model=backend(), progress=False)
    # 3 x 3 conditions x (1 + 2) draws = 27 user turns; 9 were saved, no reply is written again
    assert len(calls) == 27 - 9 and made_whole == 3 + 27
    strip = [{k: v for k, v in g.items() if k != "user_turn"} for g in read_records(tmp_path / "whole" /
                                                                                    "generations.jsonl")]
    assert [{k: v for k, v in g.items() if k != "user_turn"} for g in read_records(cut / "generations.jsonl")] == strip
    assert resumed["datasets"].keys() == whole["datasets"].keys()

    with pytest.raises(FicError, match="holds a probe of other settings .*samples: 2 -> 3"):
        probe(probe_config(tmp_path, "cut", "samples=3"), model=backend(), progress=False)
    # the judge labels afterwards: another judge re-labels what is there
    calls.clear()
    probe(probe_config(tmp_path, "cut", "judge.kind=rule"), model=backend(), progress=False)
    assert calls == []
