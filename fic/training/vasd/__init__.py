"""VASD (FiC stage 2): the recipe's settings and its step. The loop is `fic/train_vasd.py`.

A step is four phases, rollouts -> teacher -> student -> update (`step.VASDStep`):

- `config`: `VASDConfig`: the paper's VASD in the core sections, the plug-in terms under `terms:`;
  every rule between settings is checked when the config loads.
- `inputs`: what a run reads before it trains (rollout tasks, held-out tasks, checks).
- `rollouts`: the engine that plays the rollouts on the current weights, and their figures.
- `prompts`: the teacher's single-turn prompts (`teacher.view`).
- `rows`: token spans as the student's rows of per-term targets and weights (pure).
- `window`: a step's rows cut into its micro-batches, with what each network reads (pure).
- `batches`: rows as tensors; the hidden states a network gives at chosen positions.
- `teacher`: who plays teacher and reference, the EMA teacher, and the teacher pass.
- `term`: what a loss term is (`Term`) and what a plug-in brings (`PlugIn`).
- `terms/`: the run's terms; one file per plug-in term (labels, corrections, reward, reference,
  turns).
- `loss`: `DistillLoss`, the student's forward, looping over the run's terms.
- `step`: `VASDStep`, and the held-out divergence.
"""
