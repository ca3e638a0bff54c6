"""`fic bench decode`: every way and mode measured in one run, the host waits counted, bad input
refused."""

from __future__ import annotations

import json

from fic.cli.main import main


def test_the_bench_times_and_counts_every_way(capsys):
    argv = ["bench", "decode", "--rows", "3", "--prompt-tokens", "6", "--steps", "16", "--repeats", "1",
            "--stops", "4096", "--sweep", "1,8", "--json"]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for mode in ("greedy", "sampled"):
        for way in ("fast", "legacy", "generate"):
            assert figures[f"{mode}_{way}_ms_per_step"] > 0
        # 16 steps, a read every 8: one check (at step 8; the loop ends at step 16 without one).
        assert figures[f"{mode}_fast_syncs_per_step"] == 1 / 16
        assert figures[f"{mode}_legacy_syncs_per_step"] >= 1 and figures[f"{mode}_generate_syncs_per_step"] >= 1
    assert 0 < figures["roofline_greedy_fast"] and figures["roofline_bandwidth_gb_s"] > 0
    assert {"sweep_legacy_ms_per_token", "sweep_check_every_1_ms_per_token", "sweep_check_every_8_ms_per_token"} <= \
        set(figures)
    assert figures["ratio"] == figures["sampled_fast_over_generate"]


def test_the_bench_refuses_bad_settings(capsys):
    assert main(["bench", "decode", "--rows", "0"]) == 2
    assert "--rows" in capsys.readouterr().err
    assert main(["bench", "decode", "--stops", "8", "--sweep", "8,x"]) == 2
    assert "--sweep" in capsys.readouterr().err
    assert main(["bench", "decode", "--model", "/nonexistent/model"]) == 2
