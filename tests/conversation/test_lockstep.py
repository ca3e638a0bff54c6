"""`play` in lockstep over ranks (2 gloo processes): ranks whose conversations have different numbers
of turns (5 shards and 4, as VASD's rollouts under ZeRO-3 had) or different numbers of
conversations make the same generation calls turn by turn, a rank with none left calling with
zero prompts; and each rank's conversations come out as they do played alone."""

from __future__ import annotations

import json

import pytest
from ranks import on_ranks

pytestmark = pytest.mark.slow  # processes on gloo

PLAY = """
import json
from scripted import FunctionBackend
from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.generation import SamplingParams
from fic.core.instance import Instance, Shard
from fic.core.model import load_tokenizer

class Counting(FunctionBackend):
    calls = []
    def generate(self, prompts, params):
        self.calls.append(len(prompts))
        return super().generate(prompts, params)

def instance(name, shards):
    return Instance(name, "math", [Shard(i + 1, f"Fact {i + 1} about {name}.") for i in range(shards)],
                    {"question": "?", "answer": "#### 7"})

mine = [instance(f"r{ranks.rank}-{k}", 5 - ranks.rank) for k in range(2 - ranks.rank)]  # rank 0: 2 x 5, rank 1: 1 x 4
assistant = Counting(lambda prompt: "Noted, go on.", load_tokenizer(argv[0]))
lockstep = argv[1] == "lockstep"
convs = play(make_conversations(mine, ["sharded"], 1), assistant, VerbatimUser(), RuleClassifier(),
             SamplingParams(max_new_tokens=16), batch_size=1, ranks=ranks if lockstep else None)
print(json.dumps({"calls": assistant.calls, "turns": [len(c.turns) for c in convs],
                  "records": [c.to_record()["turns"] for c in convs]}))
"""


def played(smollm2_dir, mode):
    results = on_ranks(PLAY, 2, str(smollm2_dir), mode, bound=30, timeout=120)
    for r in results:
        assert r.returncode == 0, r.stderr
    return [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]


def test_ranks_make_the_same_calls_turn_by_turn(smollm2_dir):
    zero, one = played(smollm2_dir, "lockstep")
    # Rank 0: 2 conversations of 5 turns, one prompt per call (batch_size 1): 2 calls a turn, 10 in all.
    # Rank 1: 1 conversation of 4 turns: the same 10 calls, of which 6 with no prompt.
    assert zero["calls"] == [1] * 10 and one["calls"] == [1, 0] * 4 + [0, 0]
    assert zero["turns"] == [5, 5] and one["turns"] == [4]
    alone = [r for r in (played(smollm2_dir, "alone"))]
    assert alone[1]["calls"] == [1] * 4  # without lockstep rank 1 stops after its 4 calls: a ZeRO-3 hang
    for lock, solo in zip((zero, one), alone):
        strip = [[{k: v for k, v in t.items() if k not in ("sent_at", "replied_at")} for t in rec]
                 for rec in lock["records"]]
        assert strip == [[{k: v for k, v in t.items() if k not in ("sent_at", "replied_at")} for t in rec]
                         for rec in solo["records"]]
