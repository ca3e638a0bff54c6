<<<<<<< HEAD
"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`
and `zero`; `random_weights`, `runner`, `roofline`, `profile` and `processes` (`zero --processes N`)
are their parts."""
=======
"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`,
`shapes`, `zero` and `decode`; `random_models`, `shape_run`, `roofline`, `profile`, `report` and
`processes` (`zero --processes N`) are their parts."""
>>>>>>> decode
