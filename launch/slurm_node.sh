#!/usr/bin/env bash
# One node's share of a SLURM job: `accelerate launch` on this node's GPUs, with this node's rank.
# launch/slurm_job.sh starts it on every node (srun, one task per node) and, for a dry run, runs it once
# per node with DRY_RUN=1 to print the command instead: a dry run shows exactly what each node runs.
# Arguments: RECIPE SCRIPT [key=value ...]. Environment (from slurm_job.sh): SLURM_NODEID (the node's
# rank), LAUNCH_CONFIG, NNODES, GPUS_PER_NODE, MAIN_HOST, MAIN_PORT, LOG_DIR.
set -euo pipefail
source launch/lib.sh
fic_args "$@"
rank=$SLURM_NODEID
cmd=(accelerate launch --config_file "$LAUNCH_CONFIG" --num_machines "$NNODES"
     --num_processes $((NNODES * GPUS_PER_NODE)) --machine_rank "$rank"
     --main_process_ip "$MAIN_HOST" --main_process_port "$MAIN_PORT"
     "$SCRIPT" --config "$RECIPE" "${OVERRIDES[@]}")
log=$LOG_DIR/node-$rank.log
if [[ ${DRY_RUN:-0} == 1 ]]; then
  echo "node $rank (${SLURMD_NODENAME:-$(hostname)}): $(quote "${cmd[@]}") >> $log"
  exit 0
fi
echo "=== $(date -Is) job ${SLURM_JOB_ID:-} restart ${SLURM_RESTART_COUNT:-0}, node $rank on $(hostname)" >>"$log"
exec "${cmd[@]}" >>"$log" 2>&1
