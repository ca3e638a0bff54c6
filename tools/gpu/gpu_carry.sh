#!/usr/bin/env bash
# Builds, on the CPU side (a machine with a package index), the carry folder tools/gpu/gpu_session.sh
# needs on a GPU machine without network:
#   CARRY/tokenizer/   SmolLM2-135M-Instruct's tokenizer files (from models/smollm2-135m-instruct,
#                      which `fic prepare-model` makes from the bundled GGUF when it is missing)
#   CARRY/wheels/      DeepSpeed as a wheel built without its compiled ops (DS_BUILD_OPS=0: pure Python,
#                      ops compile on first use, which FiC's recipes do not need), and wheels of its
#                      dependencies a machine with torch, transformers, accelerate and peft may lack:
#                      hjson, einops, py-cpuinfo, ninja, pydantic and typing helpers (pure Python), msgpack
#                      and pydantic-core for CPython 3.10 to 3.14 on x86-64 Linux
# Then it prints the folder's size (about 20 MB; the lent machine takes 64 MiB in all, the
# repository included) and fails above LIMIT_MB.
#   bash tools/gpu/gpu_carry.sh              # repository root
#   DRY_RUN=1 bash tools/gpu/gpu_carry.sh    # print the commands; run nothing
# Then, from the repository root, carry runs/gpu-carry and run the session in one call, e.g. with
# this project's device tool: run(command="bash tools/gpu/gpu_session.sh", carry=["runs/gpu-carry"],
# timeout_s=600). Not committed: runs/ is ignored.
# Environment: CARRY (runs/gpu-carry), PYTHON (python), DEEPSPEED (the version, 0.19.8: the one built
# and checked on CPU), PY_VERSIONS ("3.10 3.11 3.12 3.13 3.14"), LIMIT_MB (56).
set -uo pipefail
cd "$(dirname "$0")/../.."
source launch/lib.sh

PYTHON=${PYTHON:-python}
CARRY=${CARRY:-runs/gpu-carry}
DEEPSPEED=${DEEPSPEED:-0.19.8}
PY_VERSIONS=${PY_VERSIONS:-3.10 3.11 3.12 3.13 3.14}
LIMIT_MB=${LIMIT_MB:-56}
DRY=${DRY_RUN:-0}
PURE=(hjson einops py-cpuinfo ninja pydantic annotated-types typing-inspection typing-extensions)
BINARY=(msgpack pydantic-core)

# step COMMAND...: run it (stop on failure), or print it for a dry run.
step() {
  if [[ $DRY == 1 ]]; then
    quote "$@"
    return 0
  fi
  echo "\$ $(quote "$@")" >&2
  "$@" || { echo "gpu_carry.sh: failed: $(quote "$@")" >&2; exit 1; }
}

[[ $DRY == 1 ]] || { rm -rf "$CARRY"; mkdir -p "$CARRY/wheels"; }
if [[ ! -f models/smollm2-135m-instruct/tokenizer.json ]]; then
  step "$PYTHON" -m fic prepare-model
fi
step "$PYTHON" tools/gpu/random_models.py tokenizer models/smollm2-135m-instruct "$CARRY/tokenizer"
step env DS_BUILD_OPS=0 "$PYTHON" -m pip wheel --no-deps -w "$CARRY/wheels" "deepspeed==$DEEPSPEED"
step "$PYTHON" -m pip download --no-deps -d "$CARRY/wheels" "${PURE[@]}"
for version in $PY_VERSIONS; do
  step "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "$version" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$CARRY/wheels" "${BINARY[@]}"
done
if [[ $DRY != 1 ]]; then
  size_kb=$(du -sk "$CARRY" | cut -f1)
  ls -l "$CARRY/wheels" "$CARRY/tokenizer"
  echo "$CARRY: $(( size_kb / 1024 )) MB"
  if (( size_kb > LIMIT_MB * 1024 )); then
    echo "gpu_carry.sh: $CARRY is over LIMIT_MB=$LIMIT_MB MB" >&2
    exit 1
  fi
fi
