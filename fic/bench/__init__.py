"""Benchmarks that print figures (`fic bench NAME`): `rollout`, `sft`, `vasd`."""
