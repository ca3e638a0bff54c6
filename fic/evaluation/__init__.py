"""Stage 4: the multi-turn evaluation (`fic eval`).

- `evaluate`: the config, the resumable run, baselines and the recovery rate.
- `metrics`: P, A90, U90_10, premature answers, answer timing, tokens per conversation.
- `report`: `report.md` and its plots.
"""
