"""VASD (FiC stage 2): the recipe's settings and its step. The loop is `fic/train_vasd.py`.

- `config`: `VASDConfig`, one section per part of a step; every rule between settings is checked
  in `VASDConfig.check`, when the config loads.
- `inputs`: what a run reads before it trains (rollout tasks, held-out tasks, checks).
- `step`: `VASDStep`, one optimizer step (rollouts, teacher, student, update), which the recipe
  takes and `fic bench vasd` times; one step's micro-batches and on-policy labels.
- `teacher`: who plays teacher and reference, and the EMA teacher.
- `distill`: the token layout (rollouts as student rows, the teacher's single-turn rows), the
  loss terms and their weights (`TERMS`, `DistillLoss`).
"""
