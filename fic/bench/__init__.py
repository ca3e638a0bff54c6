"""Benchmarks that print figures (`fic bench NAME`, `fic.cli.bench.BENCHES`): `rollout`, `sft`, `vasd`,
`zero`, `decode` and `sigterm`; `random_weights`, `runner`, `roofline`, `profile` and `processes`
(`zero --processes N`) are their parts."""
