"""VASD (FiC stage 2) in one home: the recipe's config sections, one step's pieces and the
distillation's token layout and loss. The loop itself is `fic/train_vasd.py`.

- `step`: teacher and reference networks, the rollout engine, one step's micro-batches, the
  rollout figures and the held-out divergence.
- `distill`: rollouts as student rows, the teacher's single-turn rows, `DistillLoss`.
"""
