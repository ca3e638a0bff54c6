"""The rule-based math sharder and the six views."""

import re
from collections import Counter

import pytest

from fic.core.errors import FicError
from fic.core.instance import Instance
from fic.data.sources import load_source, shard_missing
from fic.data.views import RECAP_HEADER, SNOWBALL_HEADER, VIEWS, render_view, user_turns
from fic.tasks.sharding import ShardingError, shard_math, split_clauses, split_sentences

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
    kept, dropped = shard_missing(instances, seed=0)
    assert len(dropped) <= 0.1 * len(instances)  # problems whose facts all sit in one inseparable sentence
    assert all("only one fact" in reason for _, reason in dropped)
    for sharded in kept:
        instance = next(i for i in instances if i.task_id == sharded.task_id)
        assert len(sharded.shards) >= 3  # the intent and at least two facts
        assert "?" in sharded.shards[0].shard or sharded.shards[0].shard.split(". ", 1)[1].startswith("Calculate")
        assert numbers(instance.fields["question"]) == sum((numbers(t) for t in sharded.shard_texts), Counter())
        assert Instance.from_dict(sharded.to_dict()).to_dict() == sharded.to_dict()  # LiC round trip
        assert sharded.fields == instance.fields


def test_shard_one_is_the_question_not_an_instruction():
    question = ("A store sells pens for $2 each. Tom buys 3 pens. How much does he pay in total? "
                "When necessary, round to the nearest cent.")
    texts = shard_math(plain(question)).shard_texts
    assert texts[0].endswith("How much does he pay in total? When necessary, round to the nearest cent.")
    assert texts[1:] == ["A store sells pens for $2 each.", "Tom buys 3 pens."]


def test_facts_after_the_question_get_their_own_shards():
    texts = shard_math(plain("Tom buys 3 pens. How much does he pay in total? Each pen costs $2. "
                             "Give the result as your final answer.")).shard_texts
    assert texts[0].endswith("How much does he pay in total? Give the result as your final answer.")
    assert texts[1:] == ["Tom buys 3 pens.", "Each pen costs $2."]


def test_a_sentence_listing_several_facts_is_cut_into_clauses():
    question = ("An uncle eats 6 hamburgers per day, his wife eats 3 hamburgers per day, and their son eats 7 "
                "hamburgers per day. How many hamburgers does this family eat in one month?")
    texts = shard_math(plain(question)).shard_texts
    assert texts[1:] == ["An uncle eats 6 hamburgers per day.", "His wife eats 3 hamburgers per day.",
                         "Their son eats 7 hamburgers per day."]
    assert split_clauses("Sam and John have 198 feet of fence, and they agree to split it with John getting "
                         "140 feet more.") == ["Sam and John have 198 feet of fence.",
                                               "They agree to split it with John getting 140 feet more."]
    # Pieces that would lose their meaning are not cut: "2 notebooks which cost $4 each" lost "he bought".
    for whole in ("He bought 4 pens which cost $1.5 each, 2 notebooks which cost $4 each, and a rim of bond "
                  "paper which cost $20.", "She writes it in full 2, writes 3 of it once.",
                  "Tom bought a red shirt for $5, a red hat for $7, and a belt for $9."):
        assert split_clauses(whole) == [whole]


def test_one_inseparable_fact_is_rejected_with_a_reason():
    question = ("Mia has 17 light yellow spools of thread, 68 dark yellow spools of thread, and 101 dark blue "
                "spools of thread. What percent of her spools are yellow?")
    with pytest.raises(ShardingError, match="only one fact"):
        shard_math(plain(question))
    kept, dropped = shard_missing([plain(question, "mia"), plain("Sam has 3 cats. Each eats 2 cans. How many cans?")])
    assert [i.task_id for i in kept] == ["q"] and [(i.task_id, "only one fact" in r) for i, r in dropped] == [("mia", True)]


def test_deterministic_for_a_seed_and_seed_changes_only_phrasing():
    instances, _ = shard_missing(load_source("reasoning-gym:gsm_symbolic", "math", limit=20, seed=1))
    instances = [Instance(i.task_id, i.task, [], i.fields) for i in instances]  # the ones the rules can shard
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
