"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`,
`shapes`, `zero` and `decode`; `random_models`, `shape_run`, `roofline`, `profile` and `report` are their parts."""
