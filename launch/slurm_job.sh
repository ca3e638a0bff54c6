# The body of launch/slurm_1node.sbatch and launch/slurm_multi_node.sbatch (sourced by them after they
# set LAUNCH_CONFIG): check the launch, then start launch/slurm_node.sh on every node (srun, one task
# per node), or with DRY_RUN=1 print the command each node would run and start nothing.
#
# Rendezvous: node 0 of the allocation (first in SLURM_JOB_NODELIST) hosts it, on a port derived from
# the job id so that two jobs sharing a node do not both take 29500. Ranks: each node's SLURM_NODEID is
# its accelerate --machine_rank. Logs: runs/slurm/<job id>/node-<rank>.log, appended across restarts.
#
# Requeue: `#SBATCH --signal=B:USR1@300` makes SLURM send USR1 to this script 5 minutes before the time
# limit (and at preemption where the cluster sets PreemptParameters=send_user_signal); the trap below
# requeues the job. With `#SBATCH --requeue`, a cluster whose PreemptMode is REQUEUE puts a preempted job
# back in the queue by itself. SIGTERM is not trapped, so `scancel` still ends the job for good. A
# restarted job (SLURM_RESTART_COUNT > 0) passes resume=true once the run's `out` folder holds a complete
# checkpoint, and continues from the newest one (at most checkpoint.every steps are redone); requeued
# before its first checkpoint, it starts the run again. `out` must be on a filesystem every node sees.
set -euo pipefail
need SLURM_SUBMIT_DIR "the repository root; sbatch sets it to the folder it was called from"
cd "$SLURM_SUBMIT_DIR"
fic_args "$@"
need SLURM_JOB_ID "set by sbatch"
need SLURM_JOB_NUM_NODES "set by sbatch"
need SLURM_JOB_NODELIST "set by sbatch"
JOB=$SLURM_JOB_ID
NNODES=$SLURM_JOB_NUM_NODES
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}

if command -v scontrol >/dev/null; then
  mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
elif [[ $SLURM_JOB_NODELIST != *"["* ]]; then  # off-cluster dry run: a plain comma-separated list
  IFS=, read -r -a HOSTS <<< "$SLURM_JOB_NODELIST"
else
  echo "${0##*/}: expanding SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST needs scontrol" >&2
  exit 2
fi
if (( ${#HOSTS[@]} != NNODES )); then
  echo "${0##*/}: SLURM_JOB_NODELIST names ${#HOSTS[@]} nodes, SLURM_JOB_NUM_NODES says $NNODES" >&2
  exit 2
fi
export LAUNCH_CONFIG NNODES GPUS_PER_NODE
export MAIN_HOST=${HOSTS[0]}
export MAIN_PORT=${MAIN_PORT:-$((20000 + JOB % 20000))}
export LOG_DIR=${LOG_DIR:-runs/slurm/$JOB}

if (( ${SLURM_RESTART_COUNT:-0} > 0 )); then
  fic_resume
fi
fic_check "$LAUNCH_CONFIG" $((NNODES * GPUS_PER_NODE)) "$NNODES"

if [[ ${DRY_RUN:-0} == 1 ]]; then
  # The same script srun would start, told which node it is: what it prints is what that node runs.
  for (( rank = 0; rank < NNODES; rank++ )); do
    SLURM_NODEID=$rank SLURMD_NODENAME=${HOSTS[rank]} bash launch/slurm_node.sh "$RECIPE" "$SCRIPT" "${OVERRIDES[@]}"
  done
  exit 0
fi

requeue() {
  echo "job $JOB: USR1 before the time limit or at preemption; requeueing (the restart resumes from the newest complete checkpoint)"
  scontrol requeue "$JOB"
  exit 0
}
trap requeue USR1
mkdir -p "$LOG_DIR"
echo "job $JOB (restart ${SLURM_RESTART_COUNT:-0}): $NNODES node(s) ${HOSTS[*]}, rendezvous $MAIN_HOST:$MAIN_PORT," \
     "logs $LOG_DIR/node-<rank>.log"
# In the background, because bash runs a trap only once the foreground command ends; `wait` returns
# as soon as the signal arrives.
srun --nodes "$NNODES" --ntasks-per-node 1 --kill-on-bad-exit=1 \
    bash launch/slurm_node.sh "$RECIPE" "$SCRIPT" "${OVERRIDES[@]}" &
wait $!
