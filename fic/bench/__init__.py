"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`,
`zero` and `decode`; `random_weights`, `runner`, `roofline`, `profile` and `processes` (`zero --processes N`)
are their parts."""
