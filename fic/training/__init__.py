"""The training core the recipes share (`fic/train_sft.py`, `fic/train_vasd.py`).

- `config`: the run config sections every recipe has (model, LoRA, optimizer, steps,
  checkpoints, logging) and `RunConfig`, which each recipe extends with its own data and
  loss sections.
- `data`: rendered conversations as examples with next-token targets, collation, and the
  deterministic order in which micro-batches visit them.
- `losses`: the decoder/LM-head split, the target-only chunked head (cross-entropy or a
  divergence to a teacher, fp32 per chunk), and the accumulation window whose loss terms are
  each normalised by their token count over the whole window and all ranks.
- `checkpoints`: atomic resumable checkpoints, resume checks, and the final model folder with
  its model card.
- `loop`: the Accelerate set-up, model and optimizer, and the per-step bookkeeping (metrics
  file, progress, wandb) that a recipe's explicit loop calls.
"""
