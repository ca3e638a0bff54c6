#!/usr/bin/env bash
# GPU smoke check: a few SFT and VASD steps of the bundled SmolLM2-135M-Instruct on one GPU, enough to
# see that the GPU paths the recipes rely on run at all before a cluster job is queued.
#   bash tools/gpu/gpu_check.sh              # from the repository root, FiC's environment active
#   DRY_RUN=1 bash tools/gpu/gpu_check.sh    # print the commands each check would run; run nothing
#   WEIGHTS=random bash tools/gpu/gpu_check.sh   # a machine with no network and nothing prepared (below)
# One line per check, PASS, FAIL or SKIP with the reason, and exit 1 when any check fails:
#   gpu            torch sees a CUDA GPU (without one every other check is skipped)
#   setup          `fic prepare-model` and a 32-conversation SFT corpus (pool replies: no model needed);
#                  with WEIGHTS=random, a model of SmolLM2-135M-Instruct's shape with random weights
#                  (`python -m fic.bench.random_weights`: its shape and SmolLM2's tokenizer files from
#                  TOKENIZER) and the corpus from FiC's own generator
#                  (actions-gen): no GGUF, hub or reasoning-gym. Every figure is then one of random weights.
#   sft-bf16       fic train sft with float32 master weights under bf16 autocast
#                  (model.dtype=float32 train.mixed_precision=bf16): every step's loss finite
#   vasd-bf16      fic train vasd from that model, the same precision, rollouts on vLLM when it imports
#                  (rollout.backend=vllm) and on the trainer's own weights otherwise (hf)
#   zero2-sft      the SFT steps under DeepSpeed ZeRO-2 on one GPU: `accelerate launch --config_file
#                  launch/deepspeed_zero2.yaml --num_processes 1` (when deepspeed imports)
#   zero2-vasd     the VASD steps under the same launch (the 3B recipe's set-up; with vLLM, the engine
#                  beside a DeepSpeed trainer)
#   vllm-logprobs  with vLLM: after every weight sync the engine's log-probs of a finished rollout agree
#                  with the trainer's. The trainer warns above rollout.logprob_check_tolerance; any such
#                  warning in a VASD run's output fails, and so does a run where no sync was checked
#                  (the check needs a final reply that ended with its end-of-turn token, which random
#                  weights never write: skipped with WEIGHTS=random).
# With WEIGHTS=random the VASD steps play actions-gen instances (exclude.sources=[]: the recipe's
# evaluation file needs reasoning-gym) with 64 new tokens a reply, all of which are kept in the loss
# (random weights never stop: loss.keep_truncated=true).
# The DeepSpeed steps load the weights in bf16 (model.dtype=bfloat16, as the backbone recipes under
# DeepSpeed do): DeepSpeed's bf16 casts the trained model, not VASD's frozen teacher copy, and a
# float32 copy beside bf16 activations fails in the teacher's head.
# Environment: OUT (runs/gpu-check: logs and runs, replaced on every call), STEPS (3), PYTHON (python),
# CHECK_TIMEOUT (seconds per command, 900), VLLM and DEEPSPEED (auto: use it when it imports; 0: skip
# it; 1: use it), WEIGHTS (bundled, or random), TOKENIZER (WEIGHTS=random: a folder with SmolLM2's
# tokenizer files; default models/smollm2-135m-instruct, else runs/gpu-carry/tokenizer).
set -uo pipefail
cd "$(dirname "$0")/../.."
source launch/lib.sh
# accelerate launch runs fic/train_*.py as a script: the repository must be importable without an install.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

PYTHON=${PYTHON:-python}
OUT=${OUT:-runs/gpu-check}
STEPS=${STEPS:-3}
CHECK_TIMEOUT=${CHECK_TIMEOUT:-900}
DRY=${DRY_RUN:-0}
WEIGHTS=${WEIGHTS:-bundled}
RECIPES=recipes/smollm2-135m-instruct
CORPUS=$OUT/sft.jsonl
RANDOM_MODEL=$OUT/model
if [[ $WEIGHTS != bundled && $WEIGHTS != random ]]; then
  echo "gpu_check.sh: WEIGHTS must be bundled or random, got '$WEIGHTS'" >&2
  exit 2
fi
if [[ -z ${TOKENIZER:-} ]]; then
  TOKENIZER=models/smollm2-135m-instruct
  [[ -f $TOKENIZER/tokenizer.json ]] || TOKENIZER=runs/gpu-carry/tokenizer
fi
FAILED=0
declare -A STATUS=()

# report CHECK STATUS REASON: the check's one line.
report() {
  STATUS[$1]=$2
  if [[ $2 == FAIL ]]; then
    FAILED=1
  fi
  printf '%-4s %-13s %s\n' "$2" "$1" "$3"
}

# available NAME VAR: whether the module NAME is to be used (VAR: auto, 0 or 1).
available() {
  case ${!2:-auto} in
    0) return 1 ;;
    1) return 0 ;;
    *) "$PYTHON" -c "import $1" >/dev/null 2>&1 ;;
  esac
}

# unused NAME VAR: why the module NAME is not used.
unused() {
  if [[ ${!2:-auto} == 0 ]]; then
    echo "$2=0"
  else
    echo "$1 does not import (pip install -e .[$1])"
  fi
}

# attempt CHECK -- COMMAND...: run COMMAND (its output to OUT/CHECK.log, appended), or print it for a dry
# run. The exit status is the command's (0 for a dry run).
attempt() {
  local check=$1
  shift 2
  local cmd=(timeout "$CHECK_TIMEOUT" "$@")
  if [[ $DRY == 1 ]]; then
    echo "$check: $(quote "${cmd[@]}")"
    return 0
  fi
  echo "\$ $(quote "${cmd[@]}")" >>"$OUT/$check.log"
  "${cmd[@]}" >>"$OUT/$check.log" 2>&1
}

# last_line CHECK: the last non-empty line of its log (progress bars' carriage returns as line ends).
last_line() {
  tr '\r' '\n' <"$OUT/$1.log" 2>/dev/null | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c1-200
}

# failure STATUS CHECK: a FAIL's reason, from a command's exit status and the end of its log.
failure() {
  local why="exit $1"
  if (( $1 == 124 )); then
    why="timed out after $CHECK_TIMEOUT s (CHECK_TIMEOUT)"
  fi
  echo "$why: $(last_line "$2") (log $OUT/$2.log)"
}

# trained CHECK RUN_DIR: PASS when the run wrote STEPS steps of finite loss and a final model, else FAIL.
trained() {
  local check=$1 run=$2 why
  if why=$("$PYTHON" - "$run" "$STEPS" <<'PY' 2>&1 | tail -n 1
import json
import math
import sys
from pathlib import Path

run, steps = Path(sys.argv[1]), int(sys.argv[2])
path = run / "metrics.jsonl"
rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
rows = [row for row in rows if row.get("step", 1) >= 1]  # step 0: a held-out evaluation before training
losses = [row.get("loss") for row in rows]
if len(rows) != steps:
    sys.exit(f"{path}: {len(rows)} steps logged, expected {steps}")
if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
    sys.exit(f"{path}: a loss that is not a finite number: {losses}")
if not (run / "final" / "config.json").is_file():
    sys.exit(f"no final model in {run / 'final'}")
extra = ""
if "truncated_final_rate" in rows[-1]:
    extra = f", last step's rollout accuracy {rows[-1]['rollout_accuracy']:.2f}"
print(f"{steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}{extra}")
PY
  ); then
    report "$check" PASS "$why (log $OUT/$check.log)"
  else
    report "$check" FAIL "${why:-no figures could be read} (log $OUT/$check.log)"
  fi
}

# train CHECK RUN_DIR -- COMMAND...: run a training command and judge it.
train() {
  local check=$1 run=$2
  shift 2
  if attempt "$check" -- "${@:2}"; then
    [[ $DRY == 1 ]] || trained "$check" "$run"
  else
    report "$check" FAIL "$(failure $? "$check")"
  fi
}

if [[ $DRY != 1 ]]; then
  for run in sft vasd zero2-sft zero2-vasd model; do
    rm -rf "${OUT:?}/$run"
  done
  mkdir -p "$OUT"
  rm -f "$OUT"/*.log
fi

# --------------------------------------------------------------------------- what this machine has
if available vllm VLLM; then BACKEND=vllm; else BACKEND=hf; fi
if available deepspeed DEEPSPEED; then ZERO2=1; else ZERO2=0; fi

if attempt gpu -- "$PYTHON" -c "import torch; print(torch.cuda.get_device_name(0))"; then
  [[ $DRY == 1 ]] || report gpu PASS "$(last_line gpu)"
else
  report gpu FAIL "$(last_line gpu)"
  for check in setup sft-bf16 vasd-bf16 zero2-sft zero2-vasd vllm-logprobs; do
    report "$check" SKIP "no GPU"
  done
  exit 1
fi

# --------------------------------------------------------------------------- the model and a corpus
# The corpus excludes eval.yaml's generated problems only: eval-lic-protocol.yaml reads the LiC sample
# beside a development checkout, which a GPU machine may not have.
if [[ $WEIGHTS == random ]]; then
  attempt setup -- "$PYTHON" -m fic.bench.random_weights --out "$RANDOM_MODEL" --tokenizer "$TOKENIZER" \
      --device cuda &&
  attempt setup -- "$PYTHON" -m fic sft-data "data.source=[actions-gen:train]" data.task=actions data.limit=32 \
      out="$CORPUS"
  setup_rc=$?
  SETUP_WHAT="$RANDOM_MODEL (SmolLM2-135M-Instruct's shape, random weights), $CORPUS (actions-gen)"
else
  attempt setup -- "$PYTHON" -m fic prepare-model &&
  attempt setup -- "$PYTHON" -m fic sft-data --config "$RECIPES/sft-data.yaml" data.limit=32 \
      "exclude.sources=[$RECIPES/eval.yaml]" out="$CORPUS"
  setup_rc=$?
  SETUP_WHAT="models/smollm2-135m-instruct, $CORPUS"
fi
if (( setup_rc == 0 )); then
  [[ $DRY == 1 ]] || report setup PASS "$SETUP_WHAT"
else
  report setup FAIL "$(failure $setup_rc setup)"
  for check in sft-bf16 vasd-bf16 zero2-sft zero2-vasd vllm-logprobs; do
    report "$check" SKIP "setup failed"
  done
  exit 1
fi

# --------------------------------------------------------------------------- the steps
SFT_SMALL=(data.path="$CORPUS" train.max_steps="$STEPS" train.micro_batch_size=4 train.grad_accum_steps=1
           optim.warmup_steps=0 checkpoint.every=0 logging.wandb=false)
# The recipe's rollout sizes (256 new tokens, 8 rollouts a step): enough for some final replies to end
# with their end-of-turn token, which the log-prob check needs.
VASD_SMALL=(model.path="$OUT/sft/final" anchor.path="$CORPUS" data.limit=32 train.max_steps="$STEPS"
            optim.warmup_steps=0 checkpoint.every=0 logging.wandb=false logging.samples_every=0
            rollout.backend="$BACKEND")
if [[ $WEIGHTS == random ]]; then
  SFT_SMALL+=(model.path="$RANDOM_MODEL")
  VASD_SMALL+=(data.source=actions-gen:train data.task=actions "exclude.sources=[]" rollout.max_new_tokens=64
               loss.keep_truncated=true)
fi
BF16=(model.dtype=float32 train.mixed_precision=bf16)
ZERO_DTYPE=(model.dtype=bfloat16)

train sft-bf16 "$OUT/sft" -- "$PYTHON" -m fic train sft --config "$RECIPES/sft.yaml" "${SFT_SMALL[@]}" \
    "${BF16[@]}" out="$OUT/sft"
have_sft=$([[ $DRY == 1 || ${STATUS[sft-bf16]:-} == PASS ]] && echo 1 || echo 0)

if [[ $have_sft == 1 ]]; then
  train vasd-bf16 "$OUT/vasd" -- "$PYTHON" -m fic train vasd --config "$RECIPES/vasd.yaml" "${VASD_SMALL[@]}" \
      "${BF16[@]}" out="$OUT/vasd"
else
  report vasd-bf16 SKIP "it starts from sft-bf16's model"
fi

# ZeRO-2 on one process: mixed precision (bf16) comes from the launch file, as on a cluster.
if [[ $ZERO2 == 1 ]]; then
  # `accelerate launch`, through the interpreter: a machine whose environment is not activated may not
  # have the accelerate command on PATH.
  ZERO2_LAUNCH=("$PYTHON" -m accelerate.commands.launch --config_file launch/deepspeed_zero2.yaml --num_processes 1)
  if attempt zero2-sft -- "$PYTHON" -m fic launch-check --config_file launch/deepspeed_zero2.yaml \
         --recipe "$RECIPES/sft.yaml" --script fic/train_sft.py --num_processes 1 "${SFT_SMALL[@]}"; then
    train zero2-sft "$OUT/zero2-sft" -- "${ZERO2_LAUNCH[@]}" fic/train_sft.py --config "$RECIPES/sft.yaml" \
        "${SFT_SMALL[@]}" "${ZERO_DTYPE[@]}" out="$OUT/zero2-sft"
  else
    report zero2-sft FAIL "$(failure $? zero2-sft)"
  fi
  if [[ $have_sft == 1 ]]; then
    train zero2-vasd "$OUT/zero2-vasd" -- "${ZERO2_LAUNCH[@]}" fic/train_vasd.py --config "$RECIPES/vasd.yaml" \
        "${VASD_SMALL[@]}" "${ZERO_DTYPE[@]}" out="$OUT/zero2-vasd"
  else
    report zero2-vasd SKIP "it starts from sft-bf16's model"
  fi
else
  report zero2-sft SKIP "$(unused deepspeed DEEPSPEED)"
  report zero2-vasd SKIP "$(unused deepspeed DEEPSPEED)"
fi

# --------------------------------------------------------------------------- the engine's log-probs
if [[ $BACKEND != vllm ]]; then
  report vllm-logprobs SKIP "$(unused vllm VLLM); the rollouts ran on hf"
elif [[ $WEIGHTS == random ]]; then
  report vllm-logprobs SKIP "WEIGHTS=random: random weights never end a reply with the end-of-turn token the check needs"
elif [[ $DRY == 1 ]]; then
  echo "vllm-logprobs: reads $OUT/vasd-bf16.log and $OUT/zero2-vasd.log (a 'warning: after the weight sync' line" \
       "fails) and their runs' metrics.jsonl (steps whose rollouts have a finished final reply were checked)"
else
  runs=()
  for check in vasd-bf16 zero2-vasd; do
    [[ -f $OUT/$check.log ]] && runs+=("$check")
  done
  if why=$("$PYTHON" - "$OUT" "$RECIPES/vasd.yaml" "${runs[@]}" <<'PY' 2>&1 | tail -n 1
import json
import sys
from pathlib import Path

from fic.core.config import load_config
from fic.train_vasd import VASDConfig

out, recipe, checks = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
tolerance = load_config(VASDConfig, recipe).rollout.logprob_check_tolerance
runs = {"vasd-bf16": "vasd", "zero2-vasd": "zero2-vasd"}
warnings, checked, syncs = [], 0, 0
for check in checks:
    warnings += [line.strip() for line in (out / f"{check}.log").read_text(errors="replace").splitlines()
                 if "warning: after the weight sync" in line]
    metrics = out / runs[check] / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    rows = [row for row in rows if row.get("step", 1) >= 1]  # one weight sync after each optimizer step
    syncs += len(rows)
    # A step's sync is checked on a rollout whose final reply stopped by itself, as the rate counts.
    checked += sum(1 for row in rows if row.get("truncated_final_rate") is not None and row["truncated_final_rate"] < 1)
if warnings:
    sys.exit(f"{len(warnings)} sync(s) drifted: {warnings[0]}")
if not checked:
    sys.exit(f"no weight sync was checked ({syncs} syncs; no final reply ended with its end-of-turn token)")
print(f"{checked} of {syncs} weight syncs checked, none beyond rollout.logprob_check_tolerance={tolerance}")
PY
  ); then
    report vllm-logprobs PASS "$why"
  else
    report vllm-logprobs FAIL "$why"
  fi
fi

exit "$FAILED"
