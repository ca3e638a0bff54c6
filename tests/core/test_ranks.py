"""`fic.core.ranks` on real gloo ranks (2-3 processes on this CPU): the lockstep collectives, and the
watchdog that turns a collective one rank skipped into one line naming the rank and the phase."""

from __future__ import annotations

import time

import pytest
from ranks import on_ranks

from fic.core.ranks import Ranks, collective_failure, phase


def test_one_rank_alone_needs_no_process_group():
    ranks = Ranks.current()
    assert (ranks.rank, ranks.world, ranks.main, ranks.lockstep) == (0, 1, True, False)
    assert ranks.any(False) is False and ranks.most(3) == 3 and ranks.gather("x") == ["x"] and ranks.share(5) == 5
    assert ranks.total(0.25) == 0.25
    assert ranks.share_of([1, 2, 3]) == [1, 2, 3]


@pytest.mark.slow  # processes on gloo
def test_collectives_agree_on_three_ranks():
    code = """
    assert ranks.world == 3
    print("any", ranks.any(ranks.rank == 2), ranks.any(False))
    print("most", ranks.most(10 * ranks.rank + 1))
    print("total", ranks.total(0.5 + ranks.rank))
    print("share", ranks.share({"from": ranks.rank}))
    print("share_of", ranks.share_of(list(range(8))))
    print("gather", ranks.gather(("rank", ranks.rank)))
    """
    results = on_ranks(code, 3)
    for r in results:
        assert r.returncode == 0, r.stderr
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        assert lines["any"] == "True False" and lines["most"] == "21" and lines["total"] == "4.5" and lines["share"] == "{'from': 0}"
        assert lines["share_of"] == str(list(range(8))[r.rank::3])
        assert lines["gather"] == ("[('rank', 0), ('rank', 1), ('rank', 2)]" if r.rank == 0 else "None")


@pytest.mark.slow  # processes on gloo
def test_a_skipped_collective_fails_naming_the_rank_and_the_phase():
    """Rank 1 skips the dev curve's collective (it is busy elsewhere); rank 0 waits the bound (2 s),
    then fails with one line naming itself and the phase, instead of hanging."""
    code = """
    import time
    if ranks.rank == 1:
        time.sleep(10)   # elsewhere: never joins the collective below
        return 0
    with ranks_module.phase("dev curve at step 1"):
        ranks.any(True)
    """
    began = time.monotonic()
    results = on_ranks(code, 2, bound=2, timeout=60)
    waited = time.monotonic() - began
    assert results[0].returncode == 2, results[0].stderr
    line = results[0].stderr.strip().splitlines()[-1]
    assert "rank 0 of 2 in phase 'dev curve at step 1'" in line and "waited past 2 s" in line
    assert "train.collective_timeout_s" in line and "Traceback" not in results[0].stderr
    assert waited < 45


@pytest.mark.slow  # processes on gloo
def test_a_rank_that_dies_is_named_as_gone_by_the_others():
    code = """
    import os
    if ranks.rank == 1:
        os._exit(3)
    with ranks_module.phase("step 2"):
        ranks.most(1)
    """
    results = on_ranks(code, 2, bound=30, timeout=60)
    assert results[1].returncode == 3
    assert results[0].returncode == 2 and "rank 0 of 2 in phase 'step 2': another rank is gone" in results[0].stderr


def test_other_errors_pass_through_the_phase_untouched():
    assert collective_failure(RuntimeError("shape mismatch")) is None
    try:
        with phase("step 1"):
            raise RuntimeError("shape mismatch")
    except RuntimeError as err:
        assert str(err) == "shape mismatch"
