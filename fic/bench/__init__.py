"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`,
`shapes` and `zero`; `random_models`, `shape_run`, `roofline`, `profile`, `report` and `processes` (`zero
--processes N`) are their parts."""
