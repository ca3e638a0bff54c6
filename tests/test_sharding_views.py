"""The rule-based math sharder and the six views."""

import re
from collections import Counter

import pytest

from fic.errors import FicError
from fic.instance import Instance
from fic.sharding import ShardingError, shard_math, split_sentences
from fic.sources import load_source
from fic.views import RECAP_HEADER, SNOWBALL_HEADER, VIEWS, render_view, user_turns

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def numbers(text):
    return Counter(n.replace(",", "") for n in NUMBER.findall(text))


def plain(question, task_id="q"):
    return Instance(task_id, "math", [], {"question": question, "answer": "#### 1"})


def test_split_sentences_keeps_decimals_money_and_titles():
    text = "Ms. Lee paid $3.50 for 0.5 kg. Mr. Bo paid more! How much in total?"
    assert split_sentences(text) == ["Ms. Lee paid $3.50 for 0.5 kg.", "Mr. Bo paid more!", "How much in total?"]


def test_goal_first_then_one_fact_per_shard():
    question = ("A carpenter works for 2 weeks every month and for 6 days every week. If he gets paid $195 "
                "every day, how much does he earn if he works for a year? Give the result as your final answer.")
    sharded = shard_math(plain(question))
    texts = sharded.shard_texts
    assert "How much does he earn if he works for a year?" in texts[0]
    assert "Give the result as your final answer." in texts[0]
    assert texts[1] == "A carpenter works for 2 weeks every month and for 6 days every week."
    assert texts[2] == "He gets paid $195 every day."
    assert [s.shard_id for s in sharded.shards] == [1, 2, 3]


def test_trailing_condition_with_numbers_becomes_a_fact():
    question = "A bag has 5 servings. How many grams can you eat if your target is 1800 calories?"
    texts = shard_math(plain(question)).shard_texts
    assert "How many grams can you eat?" in texts[0] and "1800" not in texts[0]
    assert texts[-1] == "Your target is 1800 calories."


def test_gsm_symbolic_200_every_number_in_exactly_its_shard():
    instances = load_source("reasoning-gym:gsm_symbolic", "math", limit=200, seed=0)
    for instance in instances:
        sharded = shard_math(instance, seed=0)
        assert len(sharded.shards) >= 2
        assert numbers(instance.fields["question"]) == sum((numbers(t) for t in sharded.shard_texts), Counter())
        assert Instance.from_dict(sharded.to_dict()).to_dict() == sharded.to_dict()  # LiC round trip
        assert sharded.fields == instance.fields


def test_deterministic_for_a_seed_and_seed_changes_only_phrasing():
    instances = load_source("reasoning-gym:gsm_symbolic", "math", limit=20, seed=1)
    a = [shard_math(i, seed=7).to_dict() for i in instances]
    assert a == [shard_math(i, seed=7).to_dict() for i in instances]
    b = [shard_math(i, seed=8).to_dict() for i in instances]
    assert a != b
    assert [x["shards"][1:] for x in a] == [x["shards"][1:] for x in b]


def test_unshardable_problems_are_refused_with_a_reason():
    with pytest.raises(ShardingError, match="only one piece of information"):
        shard_math(plain("How many legs do 3 cats have?"))
    with pytest.raises(ShardingError, match="no question sentence"):
        shard_math(plain("State the answer: 4 - 1 - 7 ="))


SHARDED = Instance.from_dict({"task_id": "t", "task": "math", "question": "Q full?", "answer": "#### 7",
                              "shards": [{"shard_id": i, "shard": f"s{i}"} for i in range(1, 6)]})


def test_single_turn_views():
    assert user_turns(SHARDED, "full") == ["Q full?"]
    assert user_turns(SHARDED, "concat") == ["- s1\n- s2\n- s3\n- s4\n- s5"]
    shuffled = user_turns(SHARDED, "shuffle-concat", seed=1)[0].split("\n")
    assert shuffled[0] == "- s1" and sorted(shuffled) == sorted(user_turns(SHARDED, "concat")[0].split("\n"))
    orders = {user_turns(SHARDED, "shuffle-concat", seed=s)[0] for s in range(10)}
    assert len(orders) > 1  # the seed changes the order of shards 2..N


def test_multi_turn_views():
    assert user_turns(SHARDED, "sharded") == ["s1", "s2", "s3", "s4", "s5"]
    recap = user_turns(SHARDED, "recap")
    assert recap[:5] == ["s1", "s2", "s3", "s4", "s5"] and recap[5].startswith(RECAP_HEADER)
    assert recap[5].endswith("- s1\n- s2\n- s3\n- s4\n- s5")
    snowball = user_turns(SHARDED, "snowball")
    assert snowball[0] == "s1" and len(snowball) == 5
    assert snowball[3] == f"{SNOWBALL_HEADER}\n- s1\n- s2\n- s3\n\ns4"


@pytest.mark.parametrize("view", VIEWS)
def test_render_view_messages(view):
    record = render_view(SHARDED, view)
    messages = record["messages"]
    assert messages[0]["role"] == "system" and "####" in messages[0]["content"]
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert users == record["user_turns"]
    assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * (len(users) - 1) + ["user"]


def test_views_need_shards_and_a_known_name():
    with pytest.raises(FicError, match="needs shards"):
        user_turns(plain("q?"), "sharded")
    with pytest.raises(FicError, match="unknown view"):
        user_turns(SHARDED, "zigzag")
