"""Ask or answer: does a model notice missing information better in one turn than over several?

VASD's per-turn teacher (`terms.turns.replies: all`) reads, at every turn k of a sharded conversation,
the same request as one single-turn message: the first k shards in the task's concat view. It
can only teach the student to wait if the model, reading that partial request in one turn,
answers less often than it does at the same point of the conversation. This measures both on
the same instances and points, greedy, with the rule classifier:

- single-turn: for k = 1 .. N-1, the partial request of shards 1..k as one user message;
- multi-turn: the sharded conversation (verbatim user, every shard played), its reply at turn k.

`answer_rate` is the share of those replies that are answer attempts; the premise holds when the
single-turn rate is lower. Per k the two rates are paired over the same (instance, k) points.
"""

from __future__ import annotations

from typing import Any, Sequence

from fic.conversation.classify import RuleClassifier
from fic.conversation.simulator import Conversation, make_conversations, play
from fic.conversation.users import VerbatimUser
from fic.core.generation import SamplingParams
from fic.core.instance import Instance
from fic.core.stats import sign_test
from fic.data.views import partial_instance


def ask_or_answer(backend: Any, instances: Sequence[Instance], *, max_new_tokens: int, batch_size: int = 64) -> dict:
    """Answer-attempt rates on partial single-turn requests and at the same turns of the sharded
    conversations, overall and by k (see the module docstring)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    classifier = RuleClassifier()
    points = [(instance, k) for instance in instances for k in range(1, len(instance.shards))]
    single = [Conversation(partial_instance(instance, [s.shard_id for s in instance.shards[:k]]), "concat")
              for instance, k in points]
    play(single, backend, VerbatimUser(), classifier, params, batch_size=batch_size)
    single_labels = [label for label, _ in classifier.classify(single)]  # single-turn replies are not classified
    multi = make_conversations(instances, ["sharded"], 1)
    play(multi, backend, VerbatimUser(), classifier, params, batch_size=batch_size, stop_at_correct=False)
    by_id = {conv.instance.task_id: conv for conv in multi}
    pairs = []
    for (instance, k), label in zip(points, single_labels):
        turns = by_id[instance.task_id].turns
        if k - 1 < len(turns):  # a conversation that ran out of context has no turn k
            pairs.append((k, label == "answer_attempt", turns[k - 1].label == "answer_attempt"))
    return {"points": len(pairs), **_rates(pairs),
            "by_k": {k: _rates([p for p in pairs if p[0] == k]) for k in sorted({p[0] for p in pairs})}}


def _rates(pairs: list[tuple[int, bool, bool]]) -> dict:
    n = len(pairs)
    test = sign_test(float(multi) - float(single) for _, single, multi in pairs)
    return {"points": n,
            "single_turn_answer_rate": sum(s for _, s, _ in pairs) / n if n else None,
            "multi_turn_answer_rate": sum(m for _, _, m in pairs) / n if n else None,
            "multi_only": test["better"], "single_only": test["worse"], "p_value": test["p_value"]}
