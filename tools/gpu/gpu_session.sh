#!/usr/bin/env bash
# The one prepared run for a lent GPU machine: one GPU, no network, nothing installed but torch,
# transformers, accelerate and peft, and minutes of time. Everything it needs travels with the
# working tree: the repository, and the carry folder that tools/gpu/gpu_carry.sh builds on the CPU side
# (SmolLM2's tokenizer files and the DeepSpeed wheel with its missing dependencies, ~20 MB).
#   bash tools/gpu/gpu_session.sh              # repository root; figures and logs in OUT
#   DRY_RUN=1 bash tools/gpu/gpu_session.sh    # print every command of every phase; run nothing
# Phases, each one line PASS, FAIL or SKIP with its seconds (and in OUT/phases.tsv):
#   env        the GPU, its memory and the library versions (OUT/env.json)
#   install    DeepSpeed from CARRY/wheels into SCRATCH/site (pip --no-index: no network needed),
#              with those of its dependencies that do not import (skipped when deepspeed imports)
#   smoke      WEIGHTS=random bash tools/gpu/gpu_check.sh: the GPU smoke check on a random-weight
#              SmolLM2-135M-shaped model and an actions-gen corpus (OUT/gpu-check.txt, logs and
#              metrics in OUT/gpu-check)
#   zero2      fic bench zero --stage 2: SFT and VASD under ZeRO-2 on one process, checkpoint, resume,
#              losses after the resume against the uninterrupted run's (OUT/zero2.json)
#   zero3      the same under ZeRO-3, VASD with LoRA and the adapter-free teacher (OUT/zero3.json)
#   decode     fic bench decode at the Llama-3.2-3B shape (random bf16 weights, 13 rows, 64 steps, 3 calls
#              a way): ms and host waits a step against transformers' generate and the
#              share of the bandwidth roofline, issue 54's GPU target (OUT/decode.json)
#   shapes     python tools/gpu/shapes.py --backbone B for each of SHAPES: the backbone recipes' own shapes with
#              random weights, a few SFT and VASD steps each; tokens/s, MFU, peak memory, recomputed
#              hours (OUT/shape-B.json, logs in OUT/shapes/B)
#   report     python tools/gpu/report.py OUT: OUT/gpu_figures.json and OUT/gpu_table.md
# smoke, zero2 and zero3 use small models and run side by side; the shapes then run one at a time
# (alone on the GPU: their figures are throughput). A phase that would not finish inside BUDGET_S is
# skipped and says so; the per-phase seconds printed size the next session.
# Environment: OUT (runs/gpu-session; on the lent machine its $OUT), CARRY (runs/gpu-carry), SCRATCH
# (model folders and runs, deleted as it goes: /dev/shm when it has 40 GB free, else /tmp), BUDGET_S
# (seconds for everything, 560: the lent machine's command limit is 600), PYTHON (python), SHAPES (the five backbones, smallest first), PHASES
# (env,install,smoke,zero2,zero3,decode,shapes,report), ZERO_ARGS and SHAPE_ARGS (more arguments of fic bench zero and
# tools/gpu/shapes.py, split on spaces: a rehearsal on a CPU passes tiny shapes here).
set -uo pipefail
cd "$(dirname "$0")/../.."
source launch/lib.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false

PYTHON=${PYTHON:-python}
OUT=${OUT:-runs/gpu-session}
CARRY=${CARRY:-runs/gpu-carry}
BUDGET_S=${BUDGET_S:-560}
DRY=${DRY_RUN:-0}
SHAPES=${SHAPES:-llama-3.2-3b-instruct llama-3.1-8b-instruct qwen2.5-7b-instruct olmo-2-1124-7b-instruct phi-4}
PHASES=${PHASES:-env,install,smoke,zero2,zero3,decode,shapes,report}
read -r -a ZERO_EXTRA <<<"${ZERO_ARGS:-}"
read -r -a SHAPE_EXTRA <<<"${SHAPE_ARGS:-}"
TOKENIZER=$CARRY/tokenizer
# Seconds each backbone's shape run is expected to take on an H200 (its model folder written and read
# twice, two trainer launches); a backbone is skipped when less time is left. Measured for the 3B on
# 2026-12-04 (295 s: build 32, SFT 63, VASD 178 with 63 of HF rollouts); the others are guesses set
# above it (larger folders to build, load and save, slower steps), so a 7-14B backbone takes a
# session of its own (SHAPES=<one> PHASES=env,install,shapes,report).
declare -A SHAPE_S=([llama-3.2-3b-instruct]=300 [llama-3.1-8b-instruct]=450 [qwen2.5-7b-instruct]=450
                    [olmo-2-1124-7b-instruct]=450 [phi-4]=520)
REPORT_S=15
# The 3B model's random weights built, then 3 ways x 2 modes x 3 calls of 64 steps: the old loop at the
# 99 ms a step measured on 2026-12-04 (H200) is ~40 s of it; a guess above that.
DECODE_S=180

if [[ -z ${SCRATCH:-} ]]; then
  SCRATCH=/tmp/fic-gpu-session
  if [[ -d /dev/shm ]] && (( $(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}') > 40 * 1024 * 1024 )); then
    SCRATCH=/dev/shm/fic-gpu-session
  fi
fi

# phase_on NAME: whether NAME is in PHASES.
phase_on() { [[ ",$PHASES," == *",$1,"* ]]; }

# left: seconds of BUDGET_S not yet spent.
left() { echo $(( BUDGET_S - SECONDS )); }

# line PHASE STATUS SECONDS DETAIL: the phase's one line, also appended to OUT/phases.tsv.
line() {
  printf '%-4s %-8s %4ss  %s\n' "$2" "$1" "$3" "$4"
  [[ $DRY == 1 ]] || printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$OUT/phases.tsv"
}

# show PHASE -- COMMAND...: print a command as a dry run does.
show() {
  local phase=$1
  shift 2
  echo "$phase: $(quote "$@")"
}

if [[ $DRY != 1 ]]; then
  mkdir -p "$OUT" "$SCRATCH"
  rm -f "$OUT/phases.tsv"
fi
echo "gpu_session.sh: OUT=$OUT CARRY=$CARRY SCRATCH=$SCRATCH BUDGET_S=$BUDGET_S"

# --------------------------------------------------------------------------- env
if phase_on env; then
  began=$SECONDS
  ENV_PY='
import datetime, json, sys
import torch
info = {"date": datetime.date.today().isoformat(), "python": sys.version.split()[0], "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu": None}
for name in ("transformers", "accelerate", "peft", "deepspeed", "vllm"):
    try:
        info[name] = __import__(name).__version__
    except Exception:
        info[name] = None
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=p.total_memory / 2**30,
                gpus=torch.cuda.device_count(), capability=".".join(map(str, torch.cuda.get_device_capability(0))))
print(json.dumps(info))
'
  if [[ $DRY == 1 ]]; then
    show env -- "$PYTHON" -c "<the GPU and library versions as JSON>"
  elif "$PYTHON" -c "$ENV_PY" >"$OUT/env.json" 2>"$OUT/env.log" && grep -q '"gpu": "' "$OUT/env.json"; then
    line env PASS $((SECONDS - began)) "$(cat "$OUT/env.json")"
  else
    line env FAIL $((SECONDS - began)) "no GPU or no torch: $(tail -c 300 "$OUT/env.log" "$OUT/env.json" 2>/dev/null | tr '\n' ' ')"
  fi
fi

# --------------------------------------------------------------------------- install
# DeepSpeed goes into SCRATCH/site, on PYTHONPATH for every later phase: the machine's own packages
# stay as they are. Only the dependencies that do not import are installed, from the carried wheels
# (pip picks the ones built for this Python).
DS_DEPS=(hjson:hjson einops:einops cpuinfo:py-cpuinfo msgpack:msgpack ninja:ninja pydantic:pydantic
         pydantic_core:pydantic-core annotated_types:annotated-types typing_inspection:typing-inspection
         typing_extensions:typing-extensions)
export PYTHONPATH="$SCRATCH/site:$PYTHONPATH"
# ds_version: the version of deepspeed that imports (its import logs a line of its own first).
ds_version() { "$PYTHON" -c 'import deepspeed; print(deepspeed.__version__)' 2>/dev/null | tail -n 1; }
if phase_on install; then
  began=$SECONDS
  if [[ $DRY != 1 ]] && "$PYTHON" -c "import deepspeed" >/dev/null 2>&1; then
    line install SKIP 0 "deepspeed $(ds_version) already imports"
  else
    wanted=(deepspeed)
    for pair in "${DS_DEPS[@]}"; do
      if [[ $DRY == 1 ]] || ! "$PYTHON" -c "import ${pair%%:*}" >/dev/null 2>&1; then
        wanted+=("${pair#*:}")
      fi
    done
    cmd=("$PYTHON" -m pip install --no-index --no-deps --find-links "$CARRY/wheels" --target "$SCRATCH/site" "${wanted[@]}")
    # Without pip (a bare interpreter), the wheels are unpacked: a wheel is a zip of what it installs.
    if [[ $DRY != 1 ]] && ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
      cmd=("$PYTHON" - "$CARRY/wheels" "$SCRATCH/site" "${wanted[@]}")
    fi
    if [[ $DRY == 1 ]]; then
      show install -- "${cmd[@]}"
      echo "install: (only the dependencies that do not import are named)"
    elif [[ ! -d $CARRY/wheels ]]; then
      line install FAIL 0 "no $CARRY/wheels: build the carry folder with tools/gpu/gpu_carry.sh and carry it"
    elif "${cmd[@]}" >"$OUT/install.log" 2>&1 <<'PY' && "$PYTHON" -c "import deepspeed" >>"$OUT/install.log" 2>&1; then
import re, sys, sysconfig, zipfile
from pathlib import Path

wheels, site, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
for name in names:
    stem = re.sub(r"[-.]", "_", name).lower()
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(stem + "-")
             and ("-py3-none-" in w.name or f"-{tag}-" in w.name)]
    if not found:
        sys.exit(f"no wheel of {name} for {tag} in {wheels}")
    zipfile.ZipFile(found[0]).extractall(site)
    print(f"unpacked {found[0].name}")
PY
      line install PASS $((SECONDS - began)) "deepspeed $(ds_version), ${#wanted[@]} wheel(s) into $SCRATCH/site"
    else
      line install FAIL $((SECONDS - began)) "$(grep -v '^\s*$' "$OUT/install.log" | tail -n 1 | cut -c1-200) (log $OUT/install.log)"
    fi
  fi
fi

# --------------------------------------------------------------------------- smoke, zero2, zero3
# Small models side by side, each in the background with its own log; then wait for all three.
pids=()
declare -A PHASE_PID=() PHASE_BEGAN=()
if phase_on smoke; then
  # Its runs (models of 0.3-0.5 GB) go to SCRATCH; its logs and metrics are copied into OUT after.
  smoke=(env WEIGHTS=random TOKENIZER="$TOKENIZER" OUT="$SCRATCH/gpu-check" PYTHON="$PYTHON"
         CHECK_TIMEOUT=$(( BUDGET_S / 2 )) bash tools/gpu/gpu_check.sh)
  if [[ $DRY == 1 ]]; then
    show smoke -- "${smoke[@]}"
    env DRY_RUN=1 WEIGHTS=random TOKENIZER="$TOKENIZER" OUT="$SCRATCH/gpu-check" PYTHON="$PYTHON" DEEPSPEED=1 VLLM=0 \
        bash tools/gpu/gpu_check.sh | sed 's/^/smoke> /'
  else
    PHASE_BEGAN[smoke]=$SECONDS
    "${smoke[@]}" >"$OUT/gpu-check.txt" 2>&1 &
    PHASE_PID[smoke]=$!
  fi
fi
for stage in 2 3; do
  phase_on "zero$stage" || continue
  zero=("$PYTHON" -m fic bench zero --stage "$stage" --tokenizer "$TOKENIZER" --work "$SCRATCH/zero$stage"
        --timeout $(( BUDGET_S / 4 )) --budget-s $(( BUDGET_S / 2 )) --json "${ZERO_EXTRA[@]}")
  if [[ $DRY == 1 ]]; then
    show "zero$stage" -- "${zero[@]}"
    "$PYTHON" -m fic bench zero --stage "$stage" --tokenizer "$TOKENIZER" --work "$SCRATCH/zero$stage" --dry-run \
        --json "${ZERO_EXTRA[@]}" 2>&1 >/dev/null | sed "s/^/zero$stage> /"
  else
    PHASE_BEGAN[zero$stage]=$SECONDS
    "${zero[@]}" >"$OUT/zero$stage.json" 2>"$OUT/zero$stage.log" &
    PHASE_PID[zero$stage]=$!
  fi
done
for phase in smoke zero2 zero3; do
  [[ -n ${PHASE_PID[$phase]:-} ]] || continue
  wait "${PHASE_PID[$phase]}"
  rc=$?
  took=$((SECONDS - PHASE_BEGAN[$phase]))
  if [[ $phase == smoke ]]; then
    mkdir -p "$OUT/gpu-check"
    cp "$SCRATCH/gpu-check"/*.log "$OUT/gpu-check/" 2>/dev/null
    for run in sft vasd zero2-sft zero2-vasd; do
      [[ -f $SCRATCH/gpu-check/$run/metrics.jsonl ]] && cp "$SCRATCH/gpu-check/$run/metrics.jsonl" "$OUT/gpu-check/$run.metrics.jsonl"
    done
    rm -rf "${SCRATCH:?}/gpu-check"
    fails=$(grep -c '^FAIL' "$OUT/gpu-check.txt")
    summary=$(grep -E '^(PASS|FAIL|SKIP)' "$OUT/gpu-check.txt" | awk '{print $1 ":" $2}' | tr '\n' ' ')
    line smoke "$( ((rc == 0)) && echo PASS || echo FAIL)" "$took" "$fails failed: $summary(OUT/gpu-check.txt)"
  else
    mkdir -p "$OUT/$phase"
    cp "$SCRATCH/$phase"/*.log "$OUT/$phase/" 2>/dev/null
    for method in sft vasd; do
      for run in "$method-run" "$method-resumed"; do
        [[ -f $SCRATCH/$phase/$run/metrics.jsonl ]] && cp "$SCRATCH/$phase/$run/metrics.jsonl" "$OUT/$phase/$run.metrics.jsonl"
      done
    done
    summary=$("$PYTHON" - "$OUT/$phase.json" <<'PY' 2>&1 | tail -n 1
import json, sys
from fic.bench.zero import summary
try:
    figures = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no figures (see the log)")
print("; ".join(f"{m} {s} {why}" for m, (s, why) in summary(figures).items()) or figures.get("error", "nothing ran"))
PY
    )
    status=$( ((rc == 0)) && [[ $summary != *FAIL* ]] && grep -q '"ok": true' "$OUT/$phase.json" && echo PASS || echo FAIL)
    line "$phase" "$status" "$took" "$summary (OUT/$phase.json)"
  fi
done
rm -rf "${SCRATCH:?}/zero2" "${SCRATCH:?}/zero3"

# --------------------------------------------------------------------------- decode
# Alone on the GPU (after the side-by-side phases): its figures are time a step.
if phase_on decode; then
  unwrap=("$PYTHON" tools/gpu/random_models.py config --backbone llama-3.2-3b-instruct "$SCRATCH/decode-config.json")
  decode=("$PYTHON" -m fic bench decode --model-config "$SCRATCH/decode-config.json" --dtype bfloat16
          --device cuda --rows 13 --steps 64 --repeats 3 --json)
  if [[ $DRY == 1 ]]; then
    show decode -- "${unwrap[@]}"
    show decode -- "${decode[@]}"
  elif (( $(left) - REPORT_S < DECODE_S )); then
    line decode SKIP 0 "time budget: $(left) s left of BUDGET_S=$BUDGET_S, ~$DECODE_S s needed"
  else
    began=$SECONDS
    "${unwrap[@]}" >/dev/null 2>"$OUT/decode.log" && "${decode[@]}" >"$OUT/decode.json" 2>>"$OUT/decode.log"
    rc=$?
    summary=$("$PYTHON" - "$OUT/decode.json" <<'PY' 2>&1 | tail -n 1
import json, sys
try:
    f = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit("no figures (see OUT/decode.log)")
print(f"greedy {f['greedy_fast_ms_per_step']:.1f} ms a step ({f['greedy_fast_over_generate']:.2f}x generate), "
      f"sampled {f['sampled_fast_ms_per_step']:.1f} ms ({f['sampled_fast_over_generate']:.2f}x); host waits a step "
      f"{f['greedy_fast_syncs_per_step']:.3f} / {f['sampled_fast_syncs_per_step']:.3f}; roofline greedy "
      f"{100 * f['roofline_greedy_fast']:.1f}% (legacy {100 * f['roofline_greedy_legacy']:.1f}%, target 25%)")
PY
    )
    line decode "$( ((rc == 0)) && [[ $summary == greedy* ]] && echo PASS || echo FAIL)" $((SECONDS - began)) \
        "$summary (OUT/decode.json)"
  fi
fi

# --------------------------------------------------------------------------- shapes
if phase_on shapes; then
  for backbone in $SHAPES; do
    need=${SHAPE_S[$backbone]:-120}
    budget=$(( $(left) - REPORT_S ))
    shape=("$PYTHON" tools/gpu/shapes.py --backbone "$backbone" --tokenizer "$TOKENIZER"
           --work "$SCRATCH/shapes/$backbone" --models "$SCRATCH/models" --budget-s "$budget" --json "${SHAPE_EXTRA[@]}")
    if [[ $DRY == 1 ]]; then
      show "shape:$backbone" -- "${shape[@]}"
      "$PYTHON" tools/gpu/shapes.py --backbone "$backbone" --tokenizer "$TOKENIZER" --work "$SCRATCH/shapes/$backbone" \
          --models "$SCRATCH/models" --launcher deepspeed --dry-run --json "${SHAPE_EXTRA[@]}" 2>&1 >/dev/null |
          sed "s/^/shape:$backbone> /"
      continue
    fi
    if (( budget < need )); then
      line "shape:$backbone" SKIP 0 "time budget: $budget s left of BUDGET_S=$BUDGET_S, ~$need s needed"
      continue
    fi
    began=$SECONDS
    "${shape[@]}" >"$OUT/shape-$backbone.json" 2>"$OUT/shape-$backbone.log"
    rc=$?
    mkdir -p "$OUT/shapes/$backbone"
    for file in "$SCRATCH/shapes/$backbone"/*.log "$SCRATCH/shapes/$backbone"/*-probe.json; do
      [[ -f $file ]] && cp "$file" "$OUT/shapes/$backbone/"
    done
    for stage in sft vasd; do
      for name in metrics.jsonl config.yaml; do
        src=$SCRATCH/shapes/$backbone/$stage-run/$name
        [[ -f $src ]] && cp "$src" "$OUT/shapes/$backbone/$stage-run.$name"
      done
    done
    rm -rf "${SCRATCH:?}/shapes/$backbone" "${SCRATCH:?}/models"
    summary=$("$PYTHON" - "$OUT/shape-$backbone.json" <<'PY' 2>&1 | tail -n 1
import json, sys
try:
    f = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("FAIL no figures (see the log)")
parts, ok = [], not f.get("error") and bool(f.get("stages"))
for stage, s in f.get("stages", {}).items():
    if not s.get("ok"):
        ok = False
        parts.append(f"{stage} FAILED: {s.get('error', '?')[:150]}")
        continue
    mfu = f"{100 * s['mfu']:.1f}%" if s.get("mfu") is not None else "-"
    mem = f"{s['peak_memory_gib']:.1f} GiB" if s.get("peak_memory_gib") else "-"
    hours = s.get("recomputed_compute_hours")
    parts.append(f"{stage} {s['layers']}/{f['full_layers']} layers MFU {mfu} peak {mem}"
                 + (f" h {s['recipe']['compute_hours']:.2f}->{hours:.2f}" if hours is not None else ""))
print(("PASS " if ok else "FAIL ") + ("; ".join(parts) or f.get("error", "nothing ran")))
PY
    )
    status=${summary%% *}
    [[ $status == PASS || $status == FAIL ]] || status=FAIL
    (( rc == 0 )) || status=FAIL
    summary=${summary#* }
    line "shape:$backbone" "$status" $((SECONDS - began)) "$summary"
  done
fi

# --------------------------------------------------------------------------- report
if phase_on report; then
  if [[ $DRY == 1 ]]; then
    show report -- "$PYTHON" tools/gpu/report.py "$OUT"
  else
    began=$SECONDS
    if "$PYTHON" tools/gpu/report.py "$OUT" >"$OUT/report.log" 2>&1; then
      line report PASS $((SECONDS - began)) "$OUT/gpu_table.md, $OUT/gpu_figures.json"
      cat "$OUT/gpu_table.md"
    else
      line report FAIL $((SECONDS - began)) "$(tail -n 1 "$OUT/report.log") (log $OUT/report.log)"
    fi
  fi
fi
[[ $DRY == 1 ]] || rm -rf "${SCRATCH:?}"
if [[ $DRY != 1 ]] && grep -q $'\tFAIL\t' "$OUT/phases.tsv" 2>/dev/null; then
  exit 1
fi
exit 0
