"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`
and `zero`; `random_weights`, `runner`, `roofline` and `profile` are their parts."""
