# Shared by the launch scripts (sourced, not run): their arguments, the launch check, and printing
# a command for a dry run. Paths are relative to the repository root, where every script runs.

# RECIPE SCRIPT [key=value ...] -> RECIPE, SCRIPT and the OVERRIDES array passed to the training script.
fic_args() {
  if (( $# < 2 )); then
    echo "usage: ${0##*/} RECIPE SCRIPT [key=value ...], e.g. recipes/llama-3.1-8b-instruct/sft.yaml fic/train_sft.py" >&2
    exit 2
  fi
  RECIPE=$1
  SCRIPT=$2
  shift 2
  OVERRIDES=("$@")
}

# fic_check CONFIG_FILE PROCESSES MACHINES: refuse a wrong launch in one line (exit 2) before anything
# starts. With GLOBAL_BATCH set, append the train.grad_accum_steps override the check computes, so the
# same recipe makes the same optimizer steps on any GPU count that divides the batch.
fic_check() {
  local extra=() accum
  if [[ -n ${GLOBAL_BATCH:-} ]]; then
    extra=(--global_batch "$GLOBAL_BATCH")
  fi
  accum=$("${PYTHON:-python}" -m fic launch-check --config_file "$1" --recipe "$RECIPE" --script "$SCRIPT" \
          --num_processes "$2" --num_machines "$3" --gpus_per_node "$GPUS_PER_NODE" "${extra[@]}" \
          "${OVERRIDES[@]}") || exit 2
  if [[ -n $accum ]]; then
    OVERRIDES+=("$accum")
  fi
}

# fic_resume: add resume=true to OVERRIDES when the run's `out` folder holds a complete checkpoint
# (`out/checkpoints/step-N/complete`, written last), and say so on stderr when it holds none. A job
# requeued before its first checkpoint must start over: resume=true there stops the trainer with "no
# complete checkpoint". `out` is the last out=... override, else the recipe's own; the trainer reads it
# relative to the working directory, as this does. An explicit resume=... override is left alone.
fic_resume() {
  local item out
  for item in "${OVERRIDES[@]}"; do
    if [[ $item == resume=* ]]; then
      return 0
    fi
  done
  # A recipe that cannot be read yields no folder here; fic_check then says what is wrong with it.
  out=$("${PYTHON:-python}" - "$RECIPE" "${OVERRIDES[@]}" <<'PY' 2>/dev/null
import sys

import yaml

from fic.core.config import read_yaml

out = read_yaml(sys.argv[1]).get("out")
for item in sys.argv[2:]:
    key, sep, raw = item.partition("=")
    if sep and key.strip() == "out":
        out = yaml.safe_load(raw)
print(out if isinstance(out, str) else "")
PY
  ) || out=""
  if [[ -n $out ]] && compgen -G "$out/checkpoints/step-[0-9]*/complete" >/dev/null; then
    OVERRIDES+=(resume=true)
  else
    echo "${0##*/}: no complete checkpoint in ${out:-<out>}/checkpoints yet: starting the run from step 0" >&2
  fi
}

# need VAR WHAT: stop with one line (exit 2) when the environment variable VAR is unset or empty.
need() {
  if [[ -z ${!1:-} ]]; then
    echo "${0##*/}: set $1 ($2)" >&2
    exit 2
  fi
}

# The arguments as one line of shell that runs them again when pasted.
quote() {
  local words=() word
  for word in "$@"; do
    words+=("$(printf '%q' "$word")")
  done
  echo "${words[*]}"
}
