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
# Evaluation problems: generated from seed 1000000 on (reasoning-gym builds problem i from seed + i), the SFT
# corpus's from seed 0 on: disjoint by construction. sft-data checks it besides: exclude.on_overlap=refuse
# stops the job if any corpus instance has an evaluation problem's task id or prompt.
EVAL_DATA=data/gsm_symbolic.eval.sharded.jsonl
fic shard --source reasoning-gym:gsm_symbolic --limit "$EVAL_LIMIT" --seed 1000000 --out "$EVAL_DATA"
fic eval --config "$RECIPES/eval.yaml" data.source="jsonl:$EVAL_DATA" data.limit="$EVAL_LIMIT" \
    "views=[full,sharded]" out="$RUN/eval-base"
fic sft-data --config "$RECIPES/sft-data.yaml" seed=0 data.limit=400 out=data/gsm_symbolic.sft.jsonl \
    "exclude.sources=[jsonl:$EVAL_DATA]" exclude.on_overlap=refuse
fic train sft --config "$RECIPES/sft.yaml" data.path=data/gsm_symbolic.sft.jsonl train.max_steps="$SFT_STEPS" \
    train.grad_accum_steps=2 checkpoint.every=20 out="$RUN/sft"
fic eval --config "$RECIPES/eval.yaml" data.source="jsonl:$EVAL_DATA" data.limit="$EVAL_LIMIT" \
    "views=[full,sharded]" model.model="$RUN/sft/final" baseline="$RUN/eval-base" out="$RUN/eval-sft"

python - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
card = json.load(open("data/gsm_symbolic.sft.card.json"))
print(f"SFT corpus: {card['conversations']} conversations; evaluation problems found in it and dropped: "
      f"{card['evaluation_excluded']['dropped']}")
fmt = lambda x, d=1: "n/a" if x is None else f"{x:.{d}f}"
for name in ("eval-base", "eval-sft"):
    m = json.load(open(f"{run}/{name}/metrics.json"))
    v = m["views"]
    ratio = (f"recovery rate R={fmt(m['recovery_rate'], 3)}  retention={fmt(m['retention'], 3)}"
             if m["baseline_source"] else f"sharded/full={fmt(m['sharded_over_full'], 3)} (the base run: no R)")
    print(f"{name:9s}  P(full)={fmt(v['full']['P'])}  P(sharded)={fmt(v['sharded']['P'])}  "
          f"premature answers (sharded)={fmt(v['sharded']['premature_answer_rate'], 2)}  {ratio}")
print(f"reports: {run}/eval-base/report.md, {run}/eval-sft/report.md")
PY
