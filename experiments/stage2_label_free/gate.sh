#!/usr/bin/env bash
# The gate of issue 55, before any arm trains: five evaluations of the starting model S, each
# resumable (a re-run into the same folder skips finished conversations), then `protocol.py gate`
# reads them and writes gate.json. Usage:
#   RUN=/work/runs/b55 OUT=/work/runs/gate55 experiments/stage2_label_free/gate.sh
# RUN: a `fic demo` folder stopped after stage 1 (S = $RUN/sft/final; $RUN/data/train.jsonl the
# seen-function prompts stage 1 trained on). OUT: where B and the evaluations go. After a machine
# loss, rebuild S and run `protocol.py restore --out OUT --s S` first: what records/ holds is not
# played again (when the rebuilt S has the same weights).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RUN=${RUN:?set RUN to the demo folder}
OUT=${OUT:?set OUT to the gate folder}
S=${S:-$RUN/sft/final}
ROLLOUT_T=${ROLLOUT_T:-0.3}   # the demo recipe's vasd.rollout.temperature
RECORDS=${RECORDS:-$HERE/records}  # where each finished evaluation is kept (protocol.py keep)
EVAL=${EVAL:-$HERE/eval.yaml}  # settings of every evaluation (float32, greedy unless overridden)
B_TEST=${B_TEST:-256} B_DEV=${B_DEV:-512} B_TRAIN=${B_TRAIN:-600}   # sizes of B's three slices
mkdir -p "$OUT/B"
# B: fixed slices of actions-gen:test-unseen, disjoint by construction (B-test holds the demo's 64)
for split in test:0:$B_TEST dev:$B_TEST:$((B_TEST + B_DEV)) train:$((B_TEST + B_DEV)):$((B_TEST + B_DEV + B_TRAIN)); do
  IFS=: read -r name start stop <<<"$split"
  [ -s "$OUT/B/$name.jsonl" ] || fic shard --source "actions-gen:test-unseen[$start:$stop]" --task actions \
      --seed 0 --out "$OUT/B/$name.jsonl"
done
ev() { fic eval --config "$EVAL" --quiet model.model="$S" "$@"; }
# 1. the own-gap on B-dev: full minus sharded, greedy, the same 512 instances
ev data.source="jsonl:$OUT/B/dev.jsonl" views=[full,sharded] out="$OUT/bdev"
# 2. the teacher-student gap on B-train: the teacher's view greedy, the student's rollouts at T
ev data.source="jsonl:$OUT/B/train.jsonl" views=[full] out="$OUT/btrain-full"
ev data.source="jsonl:$OUT/B/train.jsonl" views=[sharded] temperature="$ROLLOUT_T" out="$OUT/btrain-sharded"
# 3. the same gap on the seen-function prompts stage 1 and the earlier VASD trained on
ev data.source="jsonl:$RUN/data/train.jsonl" views=[full] out="$OUT/seen-full"
ev data.source="jsonl:$RUN/data/train.jsonl" views=[sharded] temperature="$ROLLOUT_T" out="$OUT/seen-sharded"
python "$HERE/protocol.py" gate --out "$OUT"
python "$HERE/protocol.py" keep --out "$OUT" --s "$S" --records "$RECORDS"  # commit them
