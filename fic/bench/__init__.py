"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`
and `zero`; `random_weights`, `runner`, `roofline`, `profile` and `processes` (`zero --processes N`)
are their parts."""
