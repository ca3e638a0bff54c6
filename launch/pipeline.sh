#!/usr/bin/env bash
# FiC's main job on one machine, small enough for a laptop CPU (about 20-30 minutes on 2 cores):
# prepare the bundled model, shard generated GSM8K-style problems, evaluate the base model,
# build the SFT corpus (from other problems than the evaluation's), train, evaluate the trained
# model against the base run, and print the headline numbers.
#
# Sizes are environment variables: EVAL_LIMIT (instances evaluated), SFT_STEPS (optimizer steps),
# RUN (output folder). On a GPU machine raise them and add model.device=cuda to the eval lines.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/pipeline}
EVAL_LIMIT=${EVAL_LIMIT:-12}
SFT_STEPS=${SFT_STEPS:-40}
RECIPES=recipes/smollm2-135m-instruct

fic prepare-model
# Evaluation problems: seed 0. The SFT corpus below is generated from seed 1, so they differ.
fic shard --source reasoning-gym:gsm_symbolic --limit "$EVAL_LIMIT" --seed 0 --out data/gsm_symbolic.eval.sharded.jsonl
fic eval --config "$RECIPES/eval-gsm-symbolic.yaml" data.source=jsonl:data/gsm_symbolic.eval.sharded.jsonl \
    data.limit="$EVAL_LIMIT" "views=[full,sharded]" out="$RUN/eval-base"
fic sft-data --config "$RECIPES/sft-data.yaml" seed=1 limit=400 out=data/gsm_symbolic.sft.jsonl
fic train sft --config "$RECIPES/sft.yaml" data.path=data/gsm_symbolic.sft.jsonl train.max_steps="$SFT_STEPS" \
    train.grad_accum_steps=2 checkpoint.every=20 out="$RUN/sft"
fic eval --config "$RECIPES/eval-gsm-symbolic.yaml" data.source=jsonl:data/gsm_symbolic.eval.sharded.jsonl \
    data.limit="$EVAL_LIMIT" "views=[full,sharded]" model.model="$RUN/sft/final" baseline="$RUN/eval-base" \
    out="$RUN/eval-sft"

python - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
for name in ("eval-base", "eval-sft"):
    m = json.load(open(f"{run}/{name}/metrics.json"))
    v = m["views"]
    print(f"{name:9s}  P(full)={v['full']['P']:.1f}  P(sharded)={v['sharded']['P']:.1f}  "
          f"premature answers (sharded)={v['sharded']['premature_answer_rate']:.2f}  "
          f"recovery rate R={m.get('recovery_rate')}  retention={m.get('retention')}")
print(f"reports: {run}/eval-base/report.md, {run}/eval-sft/report.md")
PY
