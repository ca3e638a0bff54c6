"""Interaction awareness (`fic probe`): can the model write the user's next turn?

- `run`: the config and the probe loop; `judge`: the rule and LLM judges of a generated turn;
  `report`: metrics, comparison against a baseline, `report.md` and plots.
"""
