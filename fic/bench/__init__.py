"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`,
`shapes`, `sigterm` and `zero`; `random_models`, `shape_run`, `roofline`, `profile` and `report` are their parts."""
